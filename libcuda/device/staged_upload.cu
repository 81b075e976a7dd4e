#include "staged_upload.cuh"

#include <algorithm>
#include <atomic>
#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "cuda_util.cuh"
#include "util/error.h"

namespace coli::cuda::detail {

namespace {
constexpr int kBuffers = 8;

// Maps a source's pages in one call before it is read: a first read of a
// file or shared-memory mapping otherwise takes a fault per page (the
// uploads of a fresh process ran at 12 GB/s). Best effort: an old kernel
// without MADV_POPULATE_READ leaves the faults to the copy.
inline void populate(const void* p, std::size_t n) {
#ifdef MADV_POPULATE_READ
  const auto a = reinterpret_cast<std::uintptr_t>(p) & ~std::uintptr_t(4095);
  madvise(reinterpret_cast<void*>(a), reinterpret_cast<std::uintptr_t>(p) + n - a, MADV_POPULATE_READ);
#else
  (void)p, (void)n;
#endif
}

inline void relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

StagedUploader::StagedUploader(int threads, std::size_t piece) : threads_(std::max(1, threads)), piece_(std::max<std::size_t>(4096, piece)) {}
StagedUploader::~StagedUploader() = default;

void StagedUploader::add(void* dst, const void* src, std::size_t n) {
  if (n == 0) return;
  if (twin_.host && within(twin_.host, twin_.n, src, n)) {
    device_.push_back({dst, static_cast<const uint8_t*>(twin_.dev) + (static_cast<const uint8_t*>(src) - static_cast<const uint8_t*>(twin_.host)), n});
    pending_ += n;
    return;
  }
  (within_any(pinned_, src, n) ? direct_ : copies_).push_back({dst, src, n});
  pending_ += n;
}

void StagedUploader::flush(cudaStream_t s) {
  // The twin's and registered sources go first, straight from where they are.
  for (const Copy& c : device_) check(cudaMemcpyAsync(c.dst, c.src, c.n, cudaMemcpyDeviceToDevice, s), "copy weights from the device twin");
  for (const Copy& c : direct_) check(cudaMemcpyAsync(c.dst, c.src, c.n, cudaMemcpyHostToDevice, s), "upload weights");
  direct_.clear(), device_.clear();
  if (copies_.empty()) {
    pending_ = 0;
    check(cudaStreamSynchronize(s), "upload weights");
    return;
  }
  // Pieces of at most piece_ bytes: a large copy split, small ones packed
  // together (a copy costs the copy engine microseconds of its own).
  struct Segment {
    uint8_t* dst;
    const uint8_t* src;
    std::size_t n, at;  // at: offset in the piece's staging buffer
  };
  struct Piece {
    std::size_t first, count, bytes;  // segments [first, first + count)
  };
  std::vector<Segment> segs;
  std::vector<Piece> pieces;
  for (const Copy& c : copies_)
    for (std::size_t o = 0; o < c.n;) {
      if (pieces.empty() || pieces.back().bytes == piece_) pieces.push_back({segs.size(), 0, 0});
      Piece& p = pieces.back();
      const std::size_t n = std::min(piece_ - p.bytes, c.n - o);
      segs.push_back({static_cast<uint8_t*>(c.dst) + o, static_cast<const uint8_t*>(c.src) + o, n, p.bytes});
      ++p.count, p.bytes += n, o += n;
    }
  copies_.clear(), pending_ = 0;
  const int nbuf = static_cast<int>(std::min<std::size_t>(kBuffers, pieces.size()));
  uint8_t* ring = nullptr;
  check(cudaMallocHost(&ring, nbuf * piece_), "cudaMallocHost (upload staging)");
  std::vector<cudaEvent_t> done(nbuf);
  for (cudaEvent_t& e : done) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  // Piece i goes through buffer i % nbuf: a worker fills it once the copy of
  // piece i - nbuf was issued and has finished; the caller issues the
  // copies in order as pieces are filled.
  const std::size_t np = pieces.size();
  std::vector<std::atomic<char>> filled(np);
  std::atomic<std::size_t> next{0}, issued{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex mu;
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  auto worker = [&] {
    if (cudaSetDevice(device) != cudaSuccess) {  // the caller's device, not device 0's context
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = std::make_exception_ptr(Error("CUDA: cudaSetDevice in the upload staging"));
      failed = true;
      return;
    }
    for (std::size_t i; !failed && (i = next.fetch_add(1)) < np;) {
      try {
        const int b = static_cast<int>(i % nbuf);
        if (i >= static_cast<std::size_t>(nbuf)) {
          while (issued.load(std::memory_order_acquire) <= i - nbuf && !failed) relax();
          if (failed) return;
          check(cudaEventSynchronize(done[b]), "upload staging");
        }
        for (std::size_t k = pieces[i].first; k < pieces[i].first + pieces[i].count; ++k) {
          populate(segs[k].src, segs[k].n);
          std::memcpy(ring + b * piece_ + segs[k].at, segs[k].src, segs[k].n);
        }
        filled[i].store(1, std::memory_order_release);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  // At most nbuf pieces fill at once; more threads would only spin.
  std::vector<std::thread> pool;
  const int nthreads = std::min(threads_, nbuf);
  try {
    for (int t = 0; t < nthreads; ++t) pool.emplace_back(worker);
  } catch (...) {
    failed = true;
    for (std::thread& t : pool) t.join();
    for (cudaEvent_t e : done) cudaEventDestroy(e);
    cudaFreeHost(ring);
    throw;
  }
  try {
    for (std::size_t i = 0; i < np && !failed; ++i) {
      while (!filled[i].load(std::memory_order_acquire) && !failed) relax();
      if (failed) break;
      const int b = static_cast<int>(i % nbuf);
      // One copy per run of segments whose destinations follow each other.
      for (std::size_t k = pieces[i].first, end = k + pieces[i].count; k < end;) {
        std::size_t j = k + 1, n = segs[k].n;
        while (j < end && segs[j - 1].dst + segs[j - 1].n == segs[j].dst) n += segs[j++].n;
        check(cudaMemcpyAsync(segs[k].dst, ring + b * piece_ + segs[k].at, n, cudaMemcpyHostToDevice, s), "upload weights");
        k = j;
      }
      check(cudaEventRecord(done[b], s), "event");
      issued.store(i + 1, std::memory_order_release);
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu);
    if (!error) error = std::current_exception();
    failed = true;
  }
  for (std::thread& t : pool) t.join();
  const cudaError_t sync = cudaStreamSynchronize(s);
  for (cudaEvent_t e : done) cudaEventDestroy(e);
  cudaFreeHost(ring);
  if (error) std::rethrow_exception(error);
  check(sync, "upload weights");
}

}  // namespace coli::cuda::detail
