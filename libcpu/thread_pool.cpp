#include "thread_pool.h"

#include <immintrin.h>

#include <chrono>

namespace coli::cpu {

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::work(int id) {
  if (static_) {
    for (int i = id; i < n_; i += size()) (*fn_)(i);
    return;
  }
  for (int i; (i = next_.fetch_add(1, std::memory_order_relaxed)) < n_;) (*fn_)(i);
}

void ThreadPool::run(int n, const std::function<void(int)>& fn) { launch(n, fn, false); }
void ThreadPool::run_static(int n, const std::function<void(int)>& fn) { launch(n, fn, true); }

void ThreadPool::launch(int n, const std::function<void(int)>& fn, bool fixed) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  static_ = fixed;
  fn_ = &fn;
  n_ = n;
  next_.store(0, std::memory_order_relaxed);
  active_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  {
    // Publish the job; wake sleepers (spinners see the generation change).
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  if (sleepers_.load(std::memory_order_acquire) > 0) cv_.notify_all();
  work(0);
  while (active_.load(std::memory_order_acquire) > 0) _mm_pause();
}

void ThreadPool::set_hot(bool on) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    hot_.store(on, std::memory_order_relaxed);
  }
  if (on) cv_.notify_all();  // sleepers spin again
}

void ThreadPool::worker_loop(int id) {
  uint64_t seen = 0;
  while (true) {
    // Spin for a while for the next job, then sleep (unless hot).
    auto t0 = std::chrono::steady_clock::now();
    int spins = 0;
    while (generation_.load(std::memory_order_acquire) == seen) {
      _mm_pause();
      if (++spins % 1024 == 0 && !hot_.load(std::memory_order_relaxed) && std::chrono::steady_clock::now() - t0 > std::chrono::microseconds(200)) {
        std::unique_lock<std::mutex> lock(mu_);
        sleepers_.fetch_add(1);
        cv_.wait(lock, [&] { return generation_.load() != seen || hot_.load(); });
        sleepers_.fetch_sub(1);
        t0 = std::chrono::steady_clock::now();
      }
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_) return;
    work(id);
    active_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace coli::cpu
