#include "staged_upload.cuh"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "cuda_util.cuh"

namespace coli::cuda::detail {

namespace {
constexpr std::size_t kPiece = std::size_t(16) << 20;
constexpr int kBuffers = 8;

inline void relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

StagedUploader::StagedUploader(int threads) : threads_(std::max(1, threads)) {}
StagedUploader::~StagedUploader() = default;

void StagedUploader::add(void* dst, const void* src, std::size_t n) {
  if (n == 0) return;
  copies_.push_back({dst, src, n});
  pending_ += n;
}

void StagedUploader::flush(cudaStream_t s) {
  if (copies_.empty()) return;
  struct Piece {
    uint8_t* dst;
    const uint8_t* src;
    std::size_t n;
  };
  std::vector<Piece> pieces;
  for (const Copy& c : copies_)
    for (std::size_t o = 0; o < c.n; o += kPiece)
      pieces.push_back({static_cast<uint8_t*>(c.dst) + o, static_cast<const uint8_t*>(c.src) + o, std::min(kPiece, c.n - o)});
  copies_.clear(), pending_ = 0;
  const int nbuf = static_cast<int>(std::min<std::size_t>(kBuffers, pieces.size()));
  uint8_t* ring = nullptr;
  check(cudaMallocHost(&ring, nbuf * kPiece), "cudaMallocHost (upload staging)");
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
  auto worker = [&] {
    for (std::size_t i; !failed && (i = next.fetch_add(1)) < np;) {
      try {
        const int b = static_cast<int>(i % nbuf);
        if (i >= static_cast<std::size_t>(nbuf)) {
          while (issued.load(std::memory_order_acquire) <= i - nbuf && !failed) relax();
          if (failed) return;
          check(cudaEventSynchronize(done[b]), "upload staging");
        }
        std::memcpy(ring + b * kPiece, pieces[i].src, pieces[i].n);
        filled[i].store(1, std::memory_order_release);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads_; ++t) pool.emplace_back(worker);
  try {
    for (std::size_t i = 0; i < np && !failed; ++i) {
      while (!filled[i].load(std::memory_order_acquire) && !failed) relax();
      if (failed) break;
      const int b = static_cast<int>(i % nbuf);
      check(cudaMemcpyAsync(pieces[i].dst, ring + b * kPiece, pieces[i].n, cudaMemcpyHostToDevice, s), "upload weights");
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
