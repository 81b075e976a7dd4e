// WorkerPool: every job of a batch runs exactly once, on several threads
// when there are helpers, batch after batch; a job's exception comes back
// from run and the pool stays usable.
#include "util/worker_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

namespace coli {
namespace {

TEST(WorkerPool, EveryJobRunsOnceInEveryBatch) {
  for (int helpers : {0, 1, 3, 15}) {
    WorkerPool pool(helpers);
    EXPECT_EQ(pool.helpers(), helpers);
    for (std::size_t n : {0u, 1u, 2u, 5u, 16u, 100u}) {
      for (int batch = 0; batch < 20; ++batch) {
        std::vector<std::atomic<int>> hits(n);
        pool.run(n, [&](std::size_t i) { ++hits[i]; });
        for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << helpers << " helpers, job " << i << " of " << n << ", batch " << batch;
      }
    }
  }
}

TEST(WorkerPool, HelpersTakePart) {
  WorkerPool pool(3);
  std::mutex mu;
  std::set<std::thread::id> ids;
  std::atomic<int> arrived{0};
  // Four jobs that each wait until all four have started: they can only
  // finish when four threads run them at once.
  pool.run(4, [&](std::size_t) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ids.insert(std::this_thread::get_id());
    }
    ++arrived;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);  // fails, not hangs, without helpers
    while (arrived.load() < 4 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  });
  EXPECT_EQ(arrived.load(), 4);
  EXPECT_EQ(ids.size(), 4u);
}

TEST(WorkerPool, AJobsExceptionComesBackAndThePoolGoesOn) {
  WorkerPool pool(2);
  std::atomic<int> ran{0};
  EXPECT_THROW(pool.run(8,
                        [&](std::size_t i) {
                          ++ran;
                          if (i == 3) throw std::runtime_error("job 3");
                        }),
               std::runtime_error);
  EXPECT_GE(ran.load(), 1);
  std::vector<std::atomic<int>> hits(10);
  pool.run(10, [&](std::size_t i) { ++hits[i]; });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

}  // namespace
}  // namespace coli
