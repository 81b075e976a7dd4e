// plan_prefill_layer (placement/prefill_split.h): where a prompt chunk's
// experts run under a budget. Cases worked by hand.
#include <gtest/gtest.h>

#include "placement/prefill_split.h"
#include "util/error.h"

namespace {

using coli::ExpertPlace;
using coli::PrefillCosts;
using coli::plan_prefill_layer;

}  // namespace

TEST(PrefillSplit, ResidentsStayAndUnroutedExpertsAreNone) {
  const auto p = plan_prefill_layer({3, 0, 5, 0}, {1, 1, 1, 0}, PrefillCosts{1, 0, 1, 0, 4});
  EXPECT_EQ(p.place[0], ExpertPlace::kResident);
  EXPECT_EQ(p.place[1], ExpertPlace::kNone);
  EXPECT_EQ(p.place[2], ExpertPlace::kResident);
  EXPECT_EQ(p.place[3], ExpertPlace::kNone);
  EXPECT_EQ(p.uploads + p.cpu, 0);
  EXPECT_EQ(p.resident, 2);
}

// upload 1 s each, CPU 1 s per expert read + 0.5 s per token, GPU free.
// Misses by tokens: e1 (8), e3 (4), e0 (1), e2 (1).
//   k=0: cpu = (1+4)+(1+2)+(1+.5)+(1+.5) = 11     -> 11
//   k=1: gpu 1, cpu 6                             -> 6
//   k=2: gpu 2, cpu 3                             -> 3
//   k=3: gpu 3, cpu 1.5                           -> 3 (not better: keep k=2)
//   k=4: gpu 4                                    -> 4
TEST(PrefillSplit, MostTokensUploadFewestGoToTheCpu) {
  const auto p = plan_prefill_layer({1, 8, 1, 4}, {0, 0, 0, 0}, PrefillCosts{1.0, 0.0, 1.0, 0.5, 8});
  EXPECT_EQ(p.uploads, 2);
  EXPECT_EQ(p.cpu, 2);
  EXPECT_EQ(p.place[1], ExpertPlace::kUpload);
  EXPECT_EQ(p.place[3], ExpertPlace::kUpload);
  EXPECT_EQ(p.place[0], ExpertPlace::kCpu);
  EXPECT_EQ(p.place[2], ExpertPlace::kCpu);
  EXPECT_DOUBLE_EQ(p.gpu_s, 2.0);
  EXPECT_DOUBLE_EQ(p.cpu_s, 3.0);
  EXPECT_DOUBLE_EQ(p.makespan_s(), 3.0);
}

TEST(PrefillSplit, StagingSlotsCapTheUploads) {
  const auto p = plan_prefill_layer({1, 8, 1, 4}, {0, 0, 0, 0}, PrefillCosts{1.0, 0.0, 1.0, 0.5, 1});
  EXPECT_EQ(p.uploads, 1);
  EXPECT_EQ(p.place[1], ExpertPlace::kUpload);
  EXPECT_DOUBLE_EQ(p.makespan_s(), 6.0);
}

TEST(PrefillSplit, APromptOfManyTokensUploadsEveryMiss) {
  // 512 tokens x 8 over 16 experts, 4 resident; PCIe fast, the CPU slow per token.
  std::vector<int> tokens(16, 256);
  std::vector<uint8_t> resident(16, 0);
  for (int e = 0; e < 4; ++e) resident[e] = 1;
  const auto p = plan_prefill_layer(tokens, resident, PrefillCosts{32e-6, 2e-8, 20e-6, 2e-6, 16});
  EXPECT_EQ(p.uploads, 12);
  EXPECT_EQ(p.cpu, 0);
  EXPECT_EQ(p.resident, 4);
}

TEST(PrefillSplit, OneTokenPerExpertBalancesBothSides) {
  // Upload 32 us; the CPU 20 us per read + 0.1 us per token; GPU compute ~0.
  // Four misses: k=0 cpu 80.4; k=1 max(32, 60.3) = 60.3; k=2 max(64, 40.2)
  // = 64; k=3 96: one upload, three on the CPU.
  const auto p = plan_prefill_layer({1, 1, 1, 1}, {0, 0, 0, 0}, PrefillCosts{32e-6, 1e-8, 20e-6, 1e-7, 4});
  EXPECT_EQ(p.uploads, 1);
  EXPECT_EQ(p.cpu, 3);
  EXPECT_NEAR(p.makespan_s(), 60.3e-6, 1e-12);
  // One miss: the CPU (20.1 us) beats the upload (32 us).
  const auto q = plan_prefill_layer({1}, {0}, PrefillCosts{32e-6, 1e-8, 20e-6, 1e-7, 4});
  EXPECT_EQ(q.uploads, 0);
  EXPECT_EQ(q.cpu, 1);
}

TEST(PrefillSplit, DeterministicTiesAndBadInput) {
  const auto a = plan_prefill_layer({2, 2, 2, 2}, {0, 0, 0, 0}, PrefillCosts{1.0, 0.0, 1.0, 0.0, 2});
  const auto b = plan_prefill_layer({2, 2, 2, 2}, {0, 0, 0, 0}, PrefillCosts{1.0, 0.0, 1.0, 0.0, 2});
  EXPECT_EQ(a.place, b.place);
  EXPECT_EQ(a.place[0], ExpertPlace::kUpload) << "ties: the lower index uploads";
  EXPECT_THROW(plan_prefill_layer({1, 2}, {0}, PrefillCosts{}), coli::Error);
  EXPECT_THROW(plan_prefill_layer({1}, {0}, PrefillCosts{-1, 0, 0, 0, 1}), coli::Error);
  EXPECT_THROW(plan_prefill_layer({-1}, {0}, PrefillCosts{}), coli::Error);
}

TEST(PrefillSplit, CpuCountBeforeTheRoutingBalancesUploadsAndTheHost) {
  // The real shapes' orders: an upload 32 us, the CPU 30 us per read and
  // 5.4 us per pair, 16 pairs per expert (512 tokens, top 8 of 256): 116.4
  // us an expert. 160 misses: c on the CPU gives max(32 (160 - c), 116.4 c);
  // c = 34: max(4.032, 3.958) ms; c = 35: max(4.0, 4.074): 34.
  PrefillCosts c{32e-6, 0, 30e-6, 5.4e-6, 0};
  EXPECT_EQ(coli::prefill_cpu_count(160, 16, 4096, c), 34);
  // The handoff's fixed cost of 40 us moves one expert back to the GPU:
  // c = 34 gives max(4.032, 3.998) ms, c = 35 max(4.0, 4.114): still 34.
  c.cpu_fixed_s = 40e-6;
  EXPECT_EQ(coli::prefill_cpu_count(160, 16, 4096, c), 34);
  // 4096 tokens: 128 pairs each (721 us an expert): 6 of 160 on the CPU
  // would be best (max(4.928, 4.367) ms; 7 gives max(4.896, 5.088)), but
  // that saves 3.75 % of the 5.12 ms without the CPU, under the 5 % a
  // split must save: none. A host twice as fast per pair (2.7 us: 375.6 us
  // an expert) takes 12 (max(4.736, 4.547) ms, 7.5 % saved; 13 gives
  // max(4.704, 4.923)).
  EXPECT_EQ(coli::prefill_cpu_count(160, 128, 32768, c), 0);
  PrefillCosts fast = c;
  fast.cpu_token_s = 2.7e-6;
  EXPECT_EQ(coli::prefill_cpu_count(160, 128, 32768, fast), 12);
  // A host slower than anything: nothing; no miss: nothing.
  EXPECT_EQ(coli::prefill_cpu_count(160, 16, 4096, PrefillCosts{32e-6, 0, 1.0, 0, 0}), 0);
  EXPECT_EQ(coli::prefill_cpu_count(0, 16, 4096, c), 0);
  // Uploads free: nothing on the CPU; the CPU free (and no fixed cost): every miss.
  EXPECT_EQ(coli::prefill_cpu_count(10, 16, 4096, PrefillCosts{0, 0, 1e-6, 1e-6, 0}), 0);
  EXPECT_EQ(coli::prefill_cpu_count(10, 16, 4096, PrefillCosts{1e-6, 0, 0, 0, 0}), 10);
  EXPECT_THROW(coli::prefill_cpu_count(10, -1, 4096, c), coli::Error);
  // The GPU's own work and the handoff's traffic (the H200's orders: 0.31
  // us a pair, 4 MB each way at 512 tokens, 32 MB at 4096). 512 tokens,
  // 178 misses: the uploads (5.7 ms) bound the GPU (1.3 ms of compute):
  // the CPU takes 39 (GPU max(4.448, 1.076) + 0.153 = 4.601 ms, CPU 0.040
  // + 39 x 0.1164 = 4.580; 40 gives CPU 4.696 ms).
  PrefillCosts g{32e-6, 0.31e-6, 30e-6, 5.4e-6, 0};
  g.cpu_fixed_s = 40e-6, g.handoff_gpu_s = 2.0 * 512 * 2048 * 4 / 55e9;
  EXPECT_EQ(coli::prefill_cpu_count(178, 16, 4096, g), 39);
  // The mixer's 0.64 ms of uploads before the router, which the CPU cannot
  // use: 35 (GPU 4.449 - 0.640 + 0.153 = 4.089 ms, CPU 4.114; 34 gives
  // GPU 4.121 against 3.998).
  g.gpu_head_s = 0.64e-3;
  EXPECT_EQ(coli::prefill_cpu_count(178, 16, 4096, g), 35);
  g.gpu_head_s = 0;
  // 2048 tokens: 64 pairs an expert; compute (5.1 ms) and uploads (5.7 ms)
  // are close and the handoff costs 0.6 ms: nothing on the CPU.
  g.handoff_gpu_s = 2.0 * 2048 * 2048 * 4 / 55e9;
  EXPECT_EQ(coli::prefill_cpu_count(178, 64, 16384, g), 0);
  // 4096 tokens of the 40-layer model at 6G (216 misses): compute-bound.
  g.handoff_gpu_s = 2.0 * 4096 * 2048 * 4 / 55e9;
  EXPECT_EQ(coli::prefill_cpu_count(216, 128, 32768, g), 0);
}

TEST(PrefillSplit, CpuCountFromExpectedPairsTakesTheLeastRouted) {
  // An upload 32 us, the CPU 30 us a read and 5.4 us a pair. Ten misses,
  // five expected to get no pair and five 20 each: the CPU takes the five
  // empty ones for nothing (GPU 5 x 32 = 160 us), and one of 20 pairs
  // (30 + 108 = 138 us against the GPU's 128): 6. A seventh costs the host
  // 276 us.
  const PrefillCosts c{32e-6, 0, 30e-6, 5.4e-6, 0};
  const std::vector<double> skewed{0, 0, 0, 0, 0, 20, 20, 20, 20, 20};
  EXPECT_EQ(coli::prefill_cpu_count(skewed, 100, c), 6);
  // The same 100 pairs spread evenly (10 an expert, 84 us each): 3 (max(224,
  // 252) us; 2 gives max(256, 168)), as the count from the mean says.
  EXPECT_EQ(coli::prefill_cpu_count(std::vector<double>(10, 10.0), 100, c), 3);
  EXPECT_EQ(coli::prefill_cpu_count(10, 10.0, 100, c), 3);
  // Half a pair expected: half a read (15 + 2.7 us); 4 such and 4 of 40
  // pairs (246 us each): the four halves and nothing else (GPU 128 us).
  EXPECT_EQ(coli::prefill_cpu_count(std::vector<double>{0.5, 0.5, 0.5, 0.5, 40, 40, 40, 40}, 162, c), 4);
  // With at least one pair each it is the mean's count on the cases above.
  PrefillCosts g{32e-6, 0.31e-6, 30e-6, 5.4e-6, 0};
  g.cpu_fixed_s = 40e-6, g.handoff_gpu_s = 2.0 * 512 * 2048 * 4 / 55e9, g.gpu_head_s = 0.64e-3;
  EXPECT_EQ(coli::prefill_cpu_count(std::vector<double>(178, 16.0), 4096, g), coli::prefill_cpu_count(178, 16, 4096, g));
  EXPECT_EQ(coli::prefill_cpu_count(std::vector<double>(178, 16.0), 4096, g), 35);
  EXPECT_EQ(coli::prefill_cpu_count(std::vector<double>{}, 4096, g), 0);
  EXPECT_THROW(coli::prefill_cpu_count(std::vector<double>{3, 1}, 4, c), coli::Error);
  EXPECT_THROW(coli::prefill_cpu_count(std::vector<double>{-1, 1}, 4, c), coli::Error);
}

TEST(PrefillSplit, TheHostTakesTheLeastRoutedNonResidents) {
  // Six experts, 1 and 4 resident. No routing seen: the others from the
  // last id down (the order before routing was measured).
  const std::vector<uint8_t> resident{0, 1, 0, 0, 1, 0};
  EXPECT_EQ(coli::prefill_cpu_order(resident, {}), (std::vector<int>{5, 3, 2, 0}));
  // Shares: 0 and 5 got nothing, 2 a little; ties keep the higher id first.
  const std::vector<double> share{0.0, 0.4, 0.05, 0.3, 0.25, 0.0};
  const std::vector<int> order = coli::prefill_cpu_order(resident, share);
  EXPECT_EQ(order, (std::vector<int>{5, 0, 2, 3}));
  EXPECT_THROW(coli::prefill_cpu_order(resident, {0.5, 0.5}), coli::Error);
  // The first n of the order; a current choice of as many kept while it
  // brings at most 10 % + 0.002 more than the best.
  const std::vector<uint8_t> none(6, 0);
  EXPECT_EQ(coli::prefill_cpu_choice(order, 2, share, none), (std::vector<uint8_t>{1, 0, 0, 0, 0, 1}));
  EXPECT_EQ(coli::prefill_cpu_choice(order, 3, share, none), (std::vector<uint8_t>{1, 0, 1, 0, 0, 1}));
  EXPECT_EQ(coli::prefill_cpu_choice(order, 9, share, none), (std::vector<uint8_t>{1, 0, 1, 1, 0, 1})) << "at most the non-residents";
  EXPECT_EQ(coli::prefill_cpu_choice(order, 0, share, none), none);
  // {0, 2}: 0.05 against the best {5, 0}'s 0: more than 0.002 over: the best.
  EXPECT_EQ(coli::prefill_cpu_choice(order, 2, share, {1, 0, 1, 0, 0, 0}), (std::vector<uint8_t>{1, 0, 0, 0, 0, 1}));
  // {5, 0, 3} brings 0.30 against {5, 0, 2}'s 0.05: the best.
  EXPECT_EQ(coli::prefill_cpu_choice(order, 3, share, {1, 0, 0, 1, 0, 1}), (std::vector<uint8_t>{1, 0, 1, 0, 0, 1}));
  // Near ties are kept: shares 0.100 and 0.105 (within 10 %).
  const std::vector<double> close{0.105, 0.0, 0.100, 0.2, 0.0, 0.595};
  const std::vector<uint8_t> all_free(6, 0);
  const std::vector<int> o2 = coli::prefill_cpu_order(all_free, close);
  EXPECT_EQ(o2, (std::vector<int>{4, 1, 2, 0, 3, 5}));
  EXPECT_EQ(coli::prefill_cpu_choice(o2, 3, close, {1, 1, 0, 0, 1, 0}), (std::vector<uint8_t>{1, 1, 0, 0, 1, 0})) << "0.105 <= 1.1 x 0.100 + 0.002";
  EXPECT_EQ(coli::prefill_cpu_choice(o2, 3, close, {0, 1, 0, 1, 1, 0}), (std::vector<uint8_t>{0, 1, 1, 0, 1, 0})) << "0.2 is not";
  EXPECT_EQ(coli::prefill_cpu_choice(o2, 2, close, {1, 1, 0, 0, 1, 0}), (std::vector<uint8_t>{0, 1, 0, 0, 1, 0})) << "another count: the best";
  // A resident flagged in current does not count (order holds the non-residents).
  EXPECT_EQ(coli::prefill_cpu_choice(order, 2, share, {1, 1, 0, 0, 0, 1}), (std::vector<uint8_t>{1, 0, 0, 0, 0, 1}));
  // Without shares: the first n by id, whatever current holds.
  EXPECT_EQ(coli::prefill_cpu_choice(coli::prefill_cpu_order(resident, {}), 2, {}, {1, 0, 1, 0, 0, 0}), (std::vector<uint8_t>{0, 0, 0, 1, 0, 1}));
}

TEST(PrefillSplit, RoutingSharesMoveHalfwayToEachChunks) {
  std::vector<double> share;
  EXPECT_FALSE(coli::update_routing_share(share, false, {0, 0, 0, 0})) << "a chunk that routed nothing";
  EXPECT_TRUE(share.empty());
  ASSERT_TRUE(coli::update_routing_share(share, false, {0, 10, 30, 0}));
  EXPECT_EQ(share, (std::vector<double>{0.0, 0.25, 0.75, 0.0}));
  ASSERT_TRUE(coli::update_routing_share(share, true, {20, 20, 0, 0}));
  EXPECT_EQ(share, (std::vector<double>{0.25, 0.375, 0.375, 0.0}));
  EXPECT_FALSE(coli::update_routing_share(share, true, {0, 0, 0, 0}));
  EXPECT_EQ(share, (std::vector<double>{0.25, 0.375, 0.375, 0.0}));
  EXPECT_THROW(coli::update_routing_share(share, true, {1, 2}), coli::Error);
}

TEST(PrefillSplit, MeasuredWaitsMoveExpertsBackToTheGpu) {
  // The 40-layer pp512 of call F: the GPU waited 1.14 ms a layer for the
  // host's 50 experts; an expert costs the host 29.5 + 16 x 5.4 = 115.9 us
  // and the GPU 32 us to upload: 1.14 / 0.1479 = 7.7 experts would
  // balance that wait; half of them go back (one chunk's waits are noisy).
  const double cpu_expert = 29.5e-6 + 16 * 5.4e-6, upload = 32e-6;
  EXPECT_NEAR(coli::prefill_cpu_bias(0, 1.14e-3, cpu_expert, upload, 50), -0.5 * 1.14e-3 / (cpu_expert + upload), 1e-12);
  EXPECT_NEAR(coli::prefill_cpu_bias(-2.5, 0.296e-3, cpu_expert, upload, 50), -3.5, 1e-3);
  // No wait (or one under 20 us): half an expert back towards the model's count, never past it.
  EXPECT_DOUBLE_EQ(coli::prefill_cpu_bias(-3.0, 0, cpu_expert, upload, 50), -2.5);
  EXPECT_DOUBLE_EQ(coli::prefill_cpu_bias(-3.0, 19e-6, cpu_expert, upload, 50), -2.5);
  EXPECT_DOUBLE_EQ(coli::prefill_cpu_bias(-0.3, 0, cpu_expert, upload, 50), 0.0);
  EXPECT_DOUBLE_EQ(coli::prefill_cpu_bias(0, 0, cpu_expert, upload, 50), 0.0);
  EXPECT_THROW(coli::prefill_cpu_bias(0, -1e-3, cpu_expert, upload, 50), coli::Error);
  EXPECT_THROW(coli::prefill_cpu_bias(0.5, 0, cpu_expert, upload, 50), coli::Error);
  EXPECT_THROW(coli::prefill_cpu_bias(0, 0, cpu_expert, upload, -1), coli::Error);
  // A cold first chunk: 10 ms a layer against 8 host experts a layer would
  // move 33.8 back; at most half of the 8 go.
  EXPECT_DOUBLE_EQ(coli::prefill_cpu_bias(-1.0, 10e-3, cpu_expert, upload, 8), -5.0);
  EXPECT_DOUBLE_EQ(coli::prefill_cpu_bias(-1.0, 10e-3, cpu_expert, upload, 0), -1.0);
}

TEST(PrefillSplit, SharesAreTrustedAsFarAsChunksBearThemOut) {
  // A 512-token chunk of a 256-expert top-8 layer: 4,096 pairs, 16 an expert on average.
  EXPECT_DOUBLE_EQ(coli::expected_pairs(0.0, 4096, 256, 0), 16.0) << "untrusted shares: the mean";
  EXPECT_DOUBLE_EQ(coli::expected_pairs(0.0, 4096, 256, 1), 0.0) << "trusted: the share's own";
  EXPECT_NEAR(coli::expected_pairs(0.01, 4096, 256, 0.5), 16 + 0.5 * (40.96 - 16), 1e-12);
  EXPECT_THROW(coli::expected_pairs(0.01, 4096, 0, 0.5), coli::Error);
  EXPECT_THROW(coli::expected_pairs(0.01, 4096, 256, 1.5), coli::Error);
  // 100 host experts by the mean 1,600 pairs. Shares from a short first
  // chunk (or another text) said 0; the mean's 1,600 came: no trust.
  EXPECT_DOUBLE_EQ(coli::update_routing_trust(0, 1600, 0, 1600), 0.0);
  // The shares said 100 and 100 came: halfway to full trust, then 3/4.
  EXPECT_DOUBLE_EQ(coli::update_routing_trust(0, 100, 100, 1600), 0.5);
  EXPECT_DOUBLE_EQ(coli::update_routing_trust(0.5, 100, 100, 1600), 0.75);
  // Half way between: (850 - 1600) / (100 - 1600) = 0.5, averaged with 0.
  EXPECT_DOUBLE_EQ(coli::update_routing_trust(0, 850, 100, 1600), 0.25);
  // More than the mean came: the chunk trusts them not at all; fewer than
  // the shares said: fully, no more.
  EXPECT_DOUBLE_EQ(coli::update_routing_trust(0.5, 2000, 100, 1600), 0.25);
  EXPECT_DOUBLE_EQ(coli::update_routing_trust(0, 0, 100, 1600), 0.5);
  // A set the shares expect above the mean: (3000 - 1600) / (3200 - 1600).
  EXPECT_DOUBLE_EQ(coli::update_routing_trust(0, 3000, 3200, 1600), 0.4375);
  // Expected within 10 % of the mean, or no mean: the chunk says nothing.
  EXPECT_DOUBLE_EQ(coli::update_routing_trust(0.3, 0, 1500, 1600), 0.3);
  EXPECT_DOUBLE_EQ(coli::update_routing_trust(0.3, 0, 0, 0), 0.3);
  EXPECT_THROW(coli::update_routing_trust(1.5, 0, 0, 10), coli::Error);
  EXPECT_THROW(coli::update_routing_trust(0.5, -1, 0, 10), coli::Error);
}
