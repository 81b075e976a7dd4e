#include "staged_upload.cuh"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "cuda_util.cuh"
#include "util/error.h"

namespace coli::cuda::detail {

namespace {
constexpr int kBuffers = 8;

inline void relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

StagedUploader::StagedUploader(int threads, std::size_t piece) : threads_(std::max(1, threads)), piece_(std::max<std::size_t>(4096, piece)) {}
StagedUploader::~StagedUploader() = default;

bool StagedUploader::is_pinned(const void* src, std::size_t n) const {
  const auto* s = static_cast<const uint8_t*>(src);
  for (auto [p, len] : pinned_) {
    const auto* b = static_cast<const uint8_t*>(p);
    if (s >= b && s - b <= static_cast<std::ptrdiff_t>(len) && n <= len - static_cast<std::size_t>(s - b)) return true;
  }
  return false;
}

void StagedUploader::add(void* dst, const void* src, std::size_t n) {
  if (n == 0) return;
  (is_pinned(src, n) ? direct_ : copies_).push_back({dst, src, n});
  pending_ += n;
}

void StagedUploader::flush(cudaStream_t s) {
  // Registered sources go first, straight from where they are.
  for (const Copy& c : direct_) check(cudaMemcpyAsync(c.dst, c.src, c.n, cudaMemcpyHostToDevice, s), "upload weights");
  direct_.clear();
  if (copies_.empty()) {
    pending_ = 0;
    check(cudaStreamSynchronize(s), "upload weights");
    return;
  }
  struct Piece {
    uint8_t* dst;
    const uint8_t* src;
    std::size_t n;
  };
  std::vector<Piece> pieces;
  for (const Copy& c : copies_)
    for (std::size_t o = 0; o < c.n; o += piece_)
      pieces.push_back({static_cast<uint8_t*>(c.dst) + o, static_cast<const uint8_t*>(c.src) + o, std::min(piece_, c.n - o)});
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
        std::memcpy(ring + b * piece_, pieces[i].src, pieces[i].n);
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
      check(cudaMemcpyAsync(pieces[i].dst, ring + b * piece_, pieces[i].n, cudaMemcpyHostToDevice, s), "upload weights");
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
