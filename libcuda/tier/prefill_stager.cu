#include "prefill_stager.cuh"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "cuda_util.cuh"
#include "util/error.h"

namespace coli::cuda::detail {

namespace {
inline void relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

PrefillStager::PrefillStager(int device, cudaStream_t stream, int threads, std::size_t piece, std::vector<std::pair<const void*, std::size_t>> pinned)
    : device_(device), stream_(stream), piece_(std::max<std::size_t>(4096, piece)), pinned_(std::move(pinned)) {
  try {
    for (cudaEvent_t& e : slot_done_) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    coordinator_ = std::thread([this] { coordinate(); });
    for (int t = 0; t < std::max(1, threads); ++t) fillers_.emplace_back([this] { fill_loop(); });
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_jobs_.notify_all(), cv_fill_.notify_all();
    if (coordinator_.joinable()) coordinator_.join();
    for (std::thread& t : fillers_) t.join();
    for (cudaEvent_t e : slot_done_)
      if (e) cudaEventDestroy(e);
    throw;
  }
}

PrefillStager::~PrefillStager() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  failed_ = true;  // fillers waiting for a ring slot give up
  cv_jobs_.notify_all(), cv_fill_.notify_all(), cv_issued_.notify_all();
  coordinator_.join();
  for (std::thread& t : fillers_) t.join();
  cudaStreamSynchronize(stream_);
  for (cudaEvent_t e : slot_done_) cudaEventDestroy(e);
  if (ring_) cudaFreeHost(ring_);
}

void PrefillStager::fail(std::exception_ptr e) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_) error_ = e;
  }
  failed_ = true;
  cv_issued_.notify_all(), cv_fill_.notify_all();
}

void PrefillStager::rethrow() {
  std::lock_guard<std::mutex> lock(mu_);
  if (error_) std::rethrow_exception(error_);
}

uint64_t PrefillStager::post(std::vector<Copy> copies, cudaEvent_t wait_before, cudaEvent_t done, cudaEvent_t started, cudaEvent_t ended) {
  rethrow();
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back({std::move(copies), wait_before, done, started, ended});
    ticket = ++posted_;
  }
  cv_jobs_.notify_one();
  return ticket;
}

void PrefillStager::wait_issued(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_issued_.wait(lock, [&] { return issued_jobs_ >= ticket || error_; });
  if (error_) std::rethrow_exception(error_);
}

void PrefillStager::fill_loop() {
  if (cudaSetDevice(device_) != cudaSuccess) return fail(std::make_exception_ptr(Error("CUDA: cudaSetDevice in the prefill stager")));
  for (;;) {
    std::size_t i;
    Piece p;  // a copy: the coordinator drops the list once every staged piece is filled
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_fill_.wait(lock, [&] { return stop_ || next_piece_ < pieces_.size(); });
      if (stop_) return;
      i = next_piece_++;
      p = pieces_[i];
    }
    if (p.direct) continue;  // copied straight by the coordinator
    try {
      const int slot = static_cast<int>(p.seq % kRing);
      if (p.seq >= static_cast<uint64_t>(kRing)) {
        // The slot's previous piece must have been issued and copied.
        while (issued_seq_.load(std::memory_order_acquire) <= p.seq - kRing && !failed_) relax();
        if (failed_) return;
        check(cudaEventSynchronize(slot_done_[slot]), "prefill staging");
      }
      std::memcpy(ring_ + static_cast<std::size_t>(slot) * piece_, p.src, p.n);
      filled_[i].store(1, std::memory_order_release);
    } catch (...) {
      return fail(std::current_exception());
    }
  }
}

void PrefillStager::add_pinned(const void* p, std::size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  pinned_.push_back({p, n});
}

void PrefillStager::coordinate() {
  try {
    check(cudaSetDevice(device_), "cudaSetDevice in the prefill stager");
    std::vector<std::pair<const void*, std::size_t>> pinned;
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_jobs_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
        if (stop_) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
        pinned = pinned_;  // add_pinned may grow it between jobs
      }
      if (!ring_) check(cudaMallocHost(&ring_, kRing * piece_), "cudaMallocHost (prefill staging ring)");
      std::vector<Piece> pieces;
      for (const Copy& c : job.copies) {
        if (within_any(pinned, c.src, c.n)) {
          pieces.push_back({c.dst, c.src, c.n, 0, true});
          continue;
        }
        for (std::size_t o = 0; o < c.n; o += piece_) pieces.push_back({c.dst + o, c.src + o, std::min(piece_, c.n - o), seq_++, false});
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        pieces_ = pieces;
        if (filled_cap_ < pieces_.size()) filled_ = std::make_unique<std::atomic<char>[]>(filled_cap_ = pieces_.size());
        for (std::size_t i = 0; i < pieces_.size(); ++i) filled_[i].store(pieces_[i].direct ? 1 : 0, std::memory_order_relaxed);
        next_piece_ = 0;
      }
      // Fillers take the staged pieces in order (a direct one is taken and
      // passed over at once: filled already, nothing to copy).
      cv_fill_.notify_all();
      check(cudaStreamWaitEvent(stream_, job.wait_before), "prefill staging");
      if (job.started) check(cudaEventRecord(job.started, stream_), "event");
      for (std::size_t i = 0; i < pieces.size(); ++i) {
        const Piece& p = pieces[i];
        if (p.direct) {
          check(cudaMemcpyAsync(p.dst, p.src, p.n, cudaMemcpyHostToDevice, stream_), "prefill upload");
          direct_bytes_ += p.n;
          continue;
        }
        while (!filled_[i].load(std::memory_order_acquire)) {
          if (failed_) return;
          relax();
        }
        const int slot = static_cast<int>(p.seq % kRing);
        check(cudaMemcpyAsync(p.dst, ring_ + static_cast<std::size_t>(slot) * piece_, p.n, cudaMemcpyHostToDevice, stream_), "prefill upload");
        check(cudaEventRecord(slot_done_[slot], stream_), "event");
        issued_seq_.store(p.seq + 1, std::memory_order_release);
        staged_bytes_ += p.n;
      }
      if (job.ended) check(cudaEventRecord(job.ended, stream_), "event");
      check(cudaEventRecord(job.done, stream_), "event");
      {
        std::lock_guard<std::mutex> lock(mu_);
        pieces_.clear();
        next_piece_ = 0;
        ++issued_jobs_;
      }
      cv_issued_.notify_all();
    }
  } catch (...) {
    fail(std::current_exception());
  }
}

}  // namespace coli::cuda::detail
