#include "sampling/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>
#include <random>

#include "util/error.h"

using namespace coli;

TEST(Sampler, GreedyIsArgmaxAfterPenalties) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  std::vector<float> l = {0.1f, 2.0f, 1.9f, -1.0f};
  EXPECT_EQ(s.sample(l, {}), 1);
  p.repeat_penalty = 1.1f;  // 2.0 / 1.1 = 1.818 < 1.9
  Sampler s2(p);
  const std::vector<int> hist = {1};
  EXPECT_EQ(s2.sample(l, hist), 2);
}

TEST(Sampler, PenaltiesHandComputed) {
  SamplingParams p;
  p.temperature = 1;
  p.top_k = 0;
  p.top_p = 1;
  p.min_p = 0;
  p.repeat_penalty = 2.0f;
  p.presence_penalty = 0.5f;
  Sampler s(p);
  std::vector<float> l = {1.0f, -1.0f, 0.0f};
  const std::vector<int> hist = {0, 1, 0};
  // logits after penalties: 1/2 - 0.5 = 0, -1*2 - 0.5 = -2.5, 0.
  auto d = s.distribution(l, hist);
  std::map<int, float> m(d.begin(), d.end());
  const double z = 1 + std::exp(-2.5) + 1;
  EXPECT_NEAR(m[0], 1 / z, 1e-6);
  EXPECT_NEAR(m[1], std::exp(-2.5) / z, 1e-6);
  EXPECT_NEAR(m[2], 1 / z, 1e-6);
}

TEST(Sampler, TopKTopPMinPFilters) {
  // Probabilities at T=1 of logits log(0.5, 0.25, 0.15, 0.1): exactly these.
  std::vector<float> l = {std::log(0.5f), std::log(0.25f), std::log(0.15f), std::log(0.1f)};
  SamplingParams p;
  p.temperature = 1;
  p.top_p = 1;
  p.min_p = 0;
  p.top_k = 2;
  auto d = Sampler(p).distribution(l, {});
  ASSERT_EQ(d.size(), 2u);
  EXPECT_NEAR(d[0].second, 2.0 / 3, 1e-6);
  p.top_k = 0;
  p.top_p = 0.8f;  // 0.5 + 0.25 = 0.75 < 0.8: three kept
  EXPECT_EQ(Sampler(p).distribution(l, {}).size(), 3u);
  p.top_p = 1;
  p.min_p = 0.29f;  // floor 0.145: 0.5, 0.25, 0.15 kept
  EXPECT_EQ(Sampler(p).distribution(l, {}).size(), 3u);
  p.min_p = 0.31f;
  EXPECT_EQ(Sampler(p).distribution(l, {}).size(), 2u);
  // Temperature sharpens what is left.
  p.min_p = 0;
  p.temperature = 0.5f;
  d = Sampler(p).distribution(l, {});
  EXPECT_NEAR(d[0].second, 0.25 / (0.25 + 0.0625 + 0.0225 + 0.01), 1e-5);
}

TEST(Sampler, SeededDrawsAreReproducibleAndFollowTheDistribution) {
  std::vector<float> l = {std::log(0.6f), std::log(0.3f), std::log(0.1f)};
  SamplingParams p;
  p.temperature = 1;
  p.top_k = 0;
  p.top_p = 1;
  p.min_p = 0;
  p.seed = 1234;
  Sampler a(p), b(p);
  std::vector<int> count(3);
  for (int i = 0; i < 20000; ++i) {
    const int x = a.sample(l, {});
    ASSERT_EQ(x, b.sample(l, {}));
    ++count[x];
  }
  EXPECT_NEAR(count[0] / 20000.0, 0.6, 0.02);
  EXPECT_NEAR(count[1] / 20000.0, 0.3, 0.02);
  EXPECT_NEAR(count[2] / 20000.0, 0.1, 0.02);
}

// The top-k scan (blocks skipped on their maximum, a heap of the best)
// keeps exactly what a sort of every id keeps, in the same order: by
// logit, ties to the lower id. Logits on a coarse grid make ties common,
// across blocks and inside them; lengths not a multiple of the block, and
// k from 1 to past a block.
TEST(Sampler, TopKScanMatchesAFullSort) {
  std::mt19937 g(7);
  for (const std::size_t n : {std::size_t(5), std::size_t(63), std::size_t(64), std::size_t(1000), std::size_t(4097)}) {
    for (const int grid : {3, 50}) {
      std::uniform_int_distribution<int> u(0, grid);
      std::vector<float> l(n);
      for (auto& x : l) x = 0.25f * u(g);
      for (const int k : {1, 2, 7, 40, 65, 200}) {
        if (static_cast<std::size_t>(k) >= n) continue;
        SamplingParams p;
        p.temperature = 1, p.top_p = 1, p.min_p = 0, p.top_k = k;
        const auto d = Sampler(p).distribution(l, {});
        std::vector<int> ids(n);
        std::iota(ids.begin(), ids.end(), 0);
        std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return l[a] > l[b]; });  // equal logits keep the lower id first
        ASSERT_EQ(d.size(), static_cast<std::size_t>(k)) << n << " " << grid << " " << k;
        double z = 0;
        for (int i = 0; i < k; ++i) z += std::exp(double(l[ids[i]]) - l[ids[0]]);
        for (int i = 0; i < k; ++i) {
          EXPECT_EQ(d[i].first, ids[i]) << "n " << n << " grid " << grid << " k " << k << " rank " << i;
          EXPECT_NEAR(d[i].second, std::exp(double(l[ids[i]]) - l[ids[0]]) / z, 1e-6);
        }
      }
    }
  }
  // Greedy: the first largest, with and without a penalty's copy.
  std::vector<float> l(1000, 1.0f);
  l[700] = 3.0f, l[900] = 3.0f, l[5] = 2.0f;
  SamplingParams p;
  p.temperature = 0;
  EXPECT_EQ(Sampler(p).sample(l, {}), 700);
  p.repeat_penalty = 2.0f;
  const std::vector<int> hist = {700, 900};  // both to 1.5: 2.0 leads
  EXPECT_EQ(Sampler(p).sample(l, hist), 5);
  EXPECT_THROW(Sampler(p).sample(std::vector<float>{}, {}), coli::Error);
}
