// PrefillStager: hybrid prefill's copies of a layer's experts when their
// source is pageable host memory (the container's mapping, or a coli-pin
// mirror the process has not registered). A plain cudaMemcpyAsync from
// pageable memory blocks the calling thread and runs at about 8.6 GB/s on
// the H200 machine; here host threads copy the experts into a ring of
// pinned pieces and the stager's own thread issues each piece's device
// copy as soon as it is filled, so the copy engine runs at the pinned rate
// while the caller goes on enqueuing the layers before. Sources inside a
// registered range are copied straight from there, without staging.
//
// Contract: one thread (the backend's) calls post() and wait_issued().
// post() returns at once with the job's ticket; the job's device copies
// are issued on `stream`, in post order, after `wait_before`, then `done`
// is recorded on it. The stager's thread makes the stream wait on
// `wait_before` when it takes the job, so the caller must not record that
// event again before the job is issued. wait_issued(ticket) blocks until
// that job (and every one before it) has been issued (its `done`
// recorded), so that the caller may make another stream wait on `done`. Sources must stay valid until
// the copies complete; destinations are device memory. An error in the
// stager's threads is rethrown by the next post() or wait_issued().
// The destructor waits for the issued copies.
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace coli::cuda::detail {

class PrefillStager {
 public:
  struct Copy {
    uint8_t* dst;  // device
    const uint8_t* src;
    std::size_t n;
  };
  // threads: host threads filling pieces; piece: bytes per pinned piece
  // (a ring of kRing of them, allocated at the first post); pinned: host
  // ranges registered with the device.
  PrefillStager(int device, cudaStream_t stream, int threads, std::size_t piece, std::vector<std::pair<const void*, std::size_t>> pinned);
  ~PrefillStager();
  PrefillStager(const PrefillStager&) = delete;
  PrefillStager& operator=(const PrefillStager&) = delete;

  // started / ended (optional, timed events): recorded on `stream` just
  // after the wait for wait_before and just after the job's copies, for a
  // timeline (CudaProfile::kPrefill).
  uint64_t post(std::vector<Copy> copies, cudaEvent_t wait_before, cudaEvent_t done, cudaEvent_t started = nullptr, cudaEvent_t ended = nullptr);
  // A host range registered since: copies from it go straight from now on.
  void add_pinned(const void* p, std::size_t n);
  void wait_issued(uint64_t ticket);
  uint64_t staged_bytes() const { return staged_bytes_; }  // bytes that went through the ring so far
  uint64_t direct_bytes() const { return direct_bytes_; }  // bytes copied straight from registered memory

  static constexpr int kRing = 16;

 private:
  struct Job {
    std::vector<Copy> copies;
    cudaEvent_t wait_before, done, started, ended;
  };
  struct Piece {
    uint8_t* dst;
    const uint8_t* src;
    std::size_t n;
    uint64_t seq;  // place in the ring's sequence (staged pieces only)
    bool direct;
  };
  void coordinate();   // the stager's thread: takes jobs, issues copies
  void fill_loop();    // the filling threads
  void fail(std::exception_ptr e);
  void rethrow();

  int device_;
  cudaStream_t stream_;
  std::size_t piece_;
  std::vector<std::pair<const void*, std::size_t>> pinned_;
  uint8_t* ring_ = nullptr;
  cudaEvent_t slot_done_[kRing] = {};

  std::mutex mu_;
  std::condition_variable cv_jobs_, cv_fill_, cv_issued_;
  std::deque<Job> jobs_;
  uint64_t posted_ = 0, issued_jobs_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  // The job being filled: its pieces and the next one to take.
  std::vector<Piece> pieces_;
  std::unique_ptr<std::atomic<char>[]> filled_;
  std::size_t filled_cap_ = 0;
  std::size_t next_piece_ = 0;
  std::atomic<uint64_t> issued_seq_{0};  // staged pieces issued so far (ring slots reusable below it)
  std::atomic<bool> failed_{false};
  uint64_t seq_ = 0;
  std::atomic<uint64_t> staged_bytes_{0}, direct_bytes_{0};
  std::vector<std::thread> fillers_;
  std::thread coordinator_;
};

}  // namespace coli::cuda::detail
