#include "util/worker_pool.h"

#include <algorithm>
#include <utility>

namespace coli {

WorkerPool::WorkerPool(int helpers) {
  for (int i = 0; i < helpers; ++i) threads_.emplace_back([this, i] { helper(i); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void WorkerPool::drain() {
  for (std::size_t i; !failed_ && (i = next_++) < n_;) {
    try {
      (*fn_)(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
      failed_ = true;
    }
  }
}

void WorkerPool::helper(int index) {
  unsigned long long seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Only the helpers a batch asks for wake for it; the others sleep on.
      start_cv_.wait(lock, [&] { return stop_ || (gen_ != seen && index < joining_); });
      if (stop_) return;
      seen = gen_;
    }
    drain();
    std::lock_guard<std::mutex> lock(mu_);
    if (--busy_ == 0) done_cv_.notify_one();
  }
}

void WorkerPool::run(std::size_t n, const std::function<void(std::size_t)>& fn) {
  if (n == 0) return;
  const int join = static_cast<int>(std::min<std::size_t>(threads_.size(), n - 1));
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn, n_ = n, joining_ = join, busy_ = join, error_ = nullptr;
    next_ = 0, failed_ = false;
    ++gen_;
  }
  if (join > 0) start_cv_.notify_all();
  drain();
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return busy_ == 0; });
  fn_ = nullptr, joining_ = 0;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

}  // namespace coli
