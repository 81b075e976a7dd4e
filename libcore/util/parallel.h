// parallel_for: runs fn(i) for i in [0, n) on `threads` threads (jobs taken
// in order from a shared counter). The first exception thrown by a job is
// rethrown after all threads stop; the remaining jobs are skipped.
#pragma once
#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace coli {

inline int default_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

template <class Fn>
void parallel_for(std::size_t n, int threads, Fn&& fn) {
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex mu;
  auto worker = [&] {
    for (std::size_t i; !failed && (i = next++) < n;) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  const int t = static_cast<int>(std::min<std::size_t>(std::max(1, threads), n ? n : 1));
  std::vector<std::thread> pool;
  for (int i = 1; i < t; ++i) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace coli
