// WorkerPool: a fixed set of helper threads that, with the calling thread,
// run one batch of small jobs at a time, for work too short to pay for
// starting threads (parallel_for starts its own): coli-serve's scheduler
// samples the rows of each decode step this way, 16 scans of a vocabulary's
// logits in a few hundred microseconds.
//
// Contract: run(n, fn) calls fn(i) once for every i in [0, n), on the
// caller's thread and up to `helpers` others, and returns when every call
// has returned. A job that throws stops the batch's remaining jobs (those
// not yet started) and its exception is rethrown by run; the first one
// wins. Jobs of one batch run concurrently: fn must be safe for that.
//
// Threads: one run at a time (run is for one owner thread, as a scheduler;
// it is not reentrant). Helpers sleep between batches; the destructor
// stops and joins them.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace coli {

class WorkerPool {
 public:
  explicit WorkerPool(int helpers);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void run(std::size_t n, const std::function<void(std::size_t)>& fn);
  int helpers() const { return static_cast<int>(threads_.size()); }

 private:
  void helper(int index);
  void drain();  // takes jobs of the current batch until none is left

  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  std::vector<std::thread> threads_;
  // The current batch (written under mu_ before gen_ moves on).
  const std::function<void(std::size_t)>* fn_ = nullptr;
  std::size_t n_ = 0;
  int joining_ = 0;  // helpers taking part in this batch (index < joining_)
  int busy_ = 0;     // of those, how many have not finished it
  unsigned long long gen_ = 0;
  bool stop_ = false;
  std::atomic<std::size_t> next_{0};
  std::atomic<bool> failed_{false};
  std::exception_ptr error_;
};

}  // namespace coli
