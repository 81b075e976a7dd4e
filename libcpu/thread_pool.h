// ThreadPool: persistent workers for the many small parallel jobs of a
// decode step (hundreds per token). run(n, fn) calls fn(i) for i in [0, n)
// on all threads (the caller included) and returns when every call is done.
// Workers spin briefly between jobs, then sleep, so back-to-back runs cost
// well under a microsecond of hand-off while an idle pool burns no CPU.
// Not reentrant: fn must not call run() on the same pool.
#pragma once
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace coli::cpu {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);  // threads <= 0: all cores
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  void run(int n, const std::function<void(int)>& fn);
  // The same with a fixed assignment: thread k runs jobs k, k + size(), ...
  // Jobs that touch per-job state (a head's recurrent state) then find it in
  // the same core's cache on every call.
  void run_static(int n, const std::function<void(int)>& fn);
  // Hot: the workers spin between runs instead of sleeping after a while
  // (and sleeping ones wake up), for a caller whose runs come every few
  // tens of microseconds for a known stretch (a hybrid chunk's layers:
  // waking 14 sleeping workers costs more than a layer's expert work when
  // few of its experts miss). Cold again: they sleep after the usual spin.
  void set_hot(bool on);

 private:
  void worker_loop(int id);
  void work(int id);
  void launch(int n, const std::function<void(int)>& fn, bool fixed);

  std::vector<std::thread> workers_;
  const std::function<void(int)>* fn_ = nullptr;
  int n_ = 0;
  std::atomic<int> next_{0};
  bool static_ = false;
  std::atomic<int> active_{0};       // workers still inside the current run
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<int> sleepers_{0};
  std::atomic<bool> hot_{false};
};

}  // namespace coli::cpu
