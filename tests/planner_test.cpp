// The planner (placement/planner.h): budgets never exceeded, the same
// inputs give the same plan, the greedy order by time saved (hand-worked
// cases, including a layer whose GPU part already bounds it), and the cost
// model's predictions at the extremes.
#include <cmath>
#include <gtest/gtest.h>

#include <random>

#include "placement/planner.h"
#include "util/error.h"

namespace {

using coli::Plan;
using coli::PlannerInputs;
using coli::Prediction;
using coli::Tier;

PlannerInputs small(int layers, int experts, int k) {
  PlannerInputs in;
  in.fingerprint = 0x1234;
  in.layers = layers, in.experts = experts, in.k = k;
  in.expert_bytes = 1'000'000;
  in.rates.host_expert_gbs = 1, in.rates.disk_gbs = 0.1;  // 1 ms / 10 ms per expert read
  in.rates.gpu_layer_s = 0, in.rates.gpu_expert_s = 0, in.rates.handoff_s = 0, in.rates.token_fixed_s = 1e-9;
  return in;
}

}  // namespace

TEST(Planner, HottestFirstIntoVramThenRam) {
  PlannerInputs in = small(1, 4, 1);
  in.heat = {10, 0, 5, 1};
  in.heat_tokens = 16;
  in.vram_bytes = 1'500'000;  // one expert
  in.ram_bytes = 2'000'000;   // two
  const Plan p = coli::plan_placement(in);
  EXPECT_EQ(p.at(0, 0), Tier::kVram);
  EXPECT_EQ(p.at(0, 2), Tier::kRam);
  EXPECT_EQ(p.at(0, 3), Tier::kRam);
  EXPECT_EQ(p.at(0, 1), Tier::kDisk);
  EXPECT_EQ(p.fingerprint, 0x1234u);
}

// Layer 0's GPU expert part nearly bounds it: its hottest expert would
// save only the little CPU time above the GPU's, so the slot goes to layer
// 1, whose experts are colder but whose CPU part is well above its GPU's.
TEST(Planner, AMakespanBoundLayerGivesWay) {
  PlannerInputs in = small(2, 2, 1);
  in.rates.disk_gbs = 1;  // one read time for every tier but VRAM: t = 1 ms
  // p = (count + 0.5) / 11: layer 0 {0.864, 0.136} (CPU part 1.0 ms),
  // layer 1 {0.591, 0.591} (1.18 ms).
  in.heat = {9, 1, 6, 6};
  in.heat_tokens = 10;
  in.rates.gpu_expert_s = 0.95e-3;  // k = 1: the GPU's expert part of a layer
  in.rates.gpu_layer_s = 0.2e-3;    // serial: the same in every choice
  in.vram_bytes = 1'000'000;
  const Plan p = coli::plan_placement(in);
  EXPECT_EQ(p.at(0, 0), Tier::kDisk) << "layer 0 would save 0.05 ms";
  EXPECT_EQ(p.at(1, 0), Tier::kVram) << "layer 1 saves 0.23 ms";
  // Without the GPU's expert part the hottest expert wins.
  in.rates.gpu_expert_s = 0;
  const Plan q = coli::plan_placement(in);
  EXPECT_EQ(q.at(0, 0), Tier::kVram);
}

TEST(Planner, BudgetsNeverExceededAndPlansDeterministic) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 20; ++round) {
    PlannerInputs in = small(1 + int(rng() % 12), 2 + int(rng() % 64), 1);
    in.k = 1 + int(rng() % in.experts);
    in.expert_bytes = 1 + rng() % 5'000'000;
    in.heat.resize(std::size_t(in.layers) * in.experts);
    for (auto& c : in.heat) c = rng() % 1000;
    in.vram_bytes = rng() % (in.expert_bytes * in.layers * in.experts + 1);
    in.ram_bytes = rng() % (in.expert_bytes * in.layers * in.experts + 1);
    in.rates.gpu_layer_s = double(rng() % 100) * 1e-6;
    Prediction pr;
    const Plan a = coli::plan_placement(in, &pr), b = coli::plan_placement(in);
    EXPECT_EQ(a.tier, b.tier);
    EXPECT_EQ(a.prefill_chunk, b.prefill_chunk);
    const uint64_t vram = a.count(Tier::kVram), ram = a.count(Tier::kRam);
    EXPECT_LE(vram * in.expert_bytes, in.vram_bytes);
    EXPECT_LE(ram * in.expert_bytes, in.ram_bytes);
    // Filled as far as the budgets go.
    const uint64_t all = uint64_t(in.layers) * in.experts;
    EXPECT_EQ(vram, std::min<uint64_t>(all, in.vram_bytes / in.expert_bytes));
    EXPECT_EQ(ram, std::min<uint64_t>(all - vram, in.ram_bytes / in.expert_bytes));
    EXPECT_GE(pr.hit_rate, 0.0);
    EXPECT_LE(pr.hit_rate, 1.0 + 1e-12);
  }
}

TEST(Planner, PredictionsAtTheExtremes) {
  PlannerInputs in = small(4, 8, 2);
  in.rates.gpu_layer_s = 20e-6, in.rates.gpu_expert_s = 5e-6, in.rates.token_fixed_s = 100e-6, in.rates.handoff_s = 3e-6;
  in.rates.pcie_gbs = 10, in.rates.prefill_layer_token_s = 0.25e-6;  // 1 us per token over the 4 layers
  in.chunks = {512, 1024, 2048, 4096};
  in.vram_bytes = 32 * in.expert_bytes;  // every expert
  Prediction all;
  coli::plan_placement(in, &all);
  EXPECT_DOUBLE_EQ(all.hit_rate, 1.0);
  EXPECT_NEAR(all.decode_tok_s, 1.0 / (100e-6 + 4 * 30e-6), 1e-6);
  EXPECT_EQ(all.decode_bound, "gpu");
  EXPECT_EQ(all.prefill_bound, "gpu");
  EXPECT_NEAR(all.prefill_tok_s, 1.0 / 1e-6, 1e-3);
  // Nothing in VRAM or RAM: every token reads k experts per layer from disk.
  in.vram_bytes = 0;
  Prediction none;
  const Plan p = coli::plan_placement(in, &none);
  EXPECT_EQ(p.count(Tier::kDisk), 32);
  EXPECT_DOUBLE_EQ(none.hit_rate, 0.0);
  // The trunk, then k reads at disk rate (p = k / E each, E of them), the
  // handoff for the tokens with a miss there: k = 2 expected, 1 - e^-2 of them.
  const double per_layer = 20e-6 + 2 * 1e6 / 0.1e9 + 3e-6 * (1 - std::exp(-2.0));
  EXPECT_NEAR(none.decode_tok_s, 1.0 / (100e-6 + 4 * per_layer), 1e-3);
  EXPECT_EQ(none.decode_bound, "disk reads");
  EXPECT_NEAR(none.disk_bytes_per_token, 4 * 2 * 1e6, 1e-3);
  // Prefill: 32 MB of experts per chunk at 10 GB/s (3.2 ms) against 1 us
  // per token: the largest chunk hides the upload behind its compute.
  EXPECT_EQ(none.prefill_chunk, 4096);
  EXPECT_EQ(none.prefill_bound, "gpu");
  EXPECT_NEAR(none.prefill_tok_s, 4096 / (4096e-6 + 3.2e-3 / 4), 1.0);
  // 0.5 ms of compute (0.128 ms a layer) against 0.8 ms of upload a layer:
  // the first layer's upload, three layers waiting for the next upload,
  // the last layer's compute.
  in.chunks = {512};
  Prediction small_chunks;
  coli::plan_placement(in, &small_chunks);
  EXPECT_EQ(small_chunks.prefill_bound, "pcie");
  EXPECT_NEAR(small_chunks.prefill_tok_s, 512 / (0.8e-3 + 3 * 0.8e-3 + 0.128e-3), 1.0);
}

TEST(Planner, BadInputsAreErrors) {
  PlannerInputs in = small(2, 4, 1);
  PlannerInputs bad = in;
  bad.k = 5;
  EXPECT_THROW(coli::plan_placement(bad), coli::Error);
  bad = in, bad.heat = {1, 2, 3};
  EXPECT_THROW(coli::plan_placement(bad), coli::Error);
  bad = in, bad.expert_bytes = 0;
  EXPECT_THROW(coli::plan_placement(bad), coli::Error);
  bad = in, bad.rates.pcie_gbs = 0;
  EXPECT_THROW(coli::plan_placement(bad), coli::Error);
  bad = in, bad.chunks = {};
  EXPECT_THROW(coli::plan_placement(bad), coli::Error);
  bad = in, bad.rates.token_fixed_s = 0;
  EXPECT_THROW(coli::plan_placement(bad), coli::Error);
  Plan other = coli::plan_placement(in);
  other.layers = 3;
  EXPECT_THROW(coli::predict(in, other), coli::Error);
}

// --prefill-upload: the two staging areas take 2 x (the most experts a
// layer leaves out + the swaps' extra) slots, so the plan keeps fewer in
// VRAM. 4 layers x 4 experts, 12 slots, no extra: 3 per layer would need 2
// more for staging (14); 2 per layer leave 2 out, staging 4: 8 + 4 = 12.
TEST(Planner, PrefillStagingComesOutOfTheSlots) {
  PlannerInputs in = small(4, 4, 1);
  in.vram_bytes = 12 * in.expert_bytes;
  in.prefill_staging_extra = 0;
  const Plan p = coli::plan_placement(in);
  EXPECT_EQ(p.count(Tier::kVram), 8);
  for (int l = 0; l < 4; ++l) EXPECT_EQ(p.count(Tier::kVram, l), 2) << "layer " << l;
  // With 2 extra per area (the swaps): 3 per layer need 2 x (1 + 2) more
  // (18), 6 resident leave 3 out of a layer (staging 8, 14), 4 resident
  // (one per layer) with staging 2 x min(4, 3 + 2) = 8 make 12.
  in.prefill_staging_extra = 2;
  const Plan q = coli::plan_placement(in);
  EXPECT_EQ(q.count(Tier::kVram), 4);
  for (int l = 0; l < 4; ++l) EXPECT_EQ(q.count(Tier::kVram, l), 1) << "layer " << l;
  // Without uploads, every slot holds an expert.
  in.prefill_staging_extra = -1;
  EXPECT_EQ(coli::plan_placement(in).count(Tier::kVram), 12);
}

// The round trip is paid by the tokens that miss in the layer: a layer
// whose only non-resident expert is cold pays 1 - e^-p of handoff_s, one
// whose non-residents take k misses per token nearly all of it.
TEST(Planner, RareMissesPayTheHandoffRarely) {
  PlannerInputs in = small(1, 4, 1);
  in.rates.gpu_layer_s = 20e-6, in.rates.handoff_s = 100e-6, in.rates.token_fixed_s = 50e-6;
  in.heat = {500, 399, 100, 0};  // p = (count + 1/4) / 1001
  in.heat_tokens = 1000;
  Plan plan;
  plan.fingerprint = in.fingerprint, plan.layers = 1, plan.experts = 4;
  plan.tier = {Tier::kVram, Tier::kVram, Tier::kVram, Tier::kRam};
  const double p3 = 0.25 / 1001;
  const Prediction cold = coli::predict(in, plan);
  EXPECT_NEAR(1 / cold.decode_tok_s, 50e-6 + 20e-6 + p3 * 1e-3 + 100e-6 * (1 - std::exp(-p3)), 1e-12);
  plan.tier = {Tier::kRam, Tier::kVram, Tier::kVram, Tier::kVram};
  const double p0 = 500.25 / 1001;
  const Prediction hot = coli::predict(in, plan);
  EXPECT_NEAR(1 / hot.decode_tok_s, 50e-6 + 20e-6 + p0 * 1e-3 + 100e-6 * (1 - std::exp(-p0)), 1e-12);
  EXPECT_LT(100e-6 * (1 - std::exp(-p3)), 0.03e-6);  // the cold layer: under 0.03 us of the 100
}

// The runs' PCIe reads (--pcie-read): over a layer's misses M ~
// Binomial(k, m / k) the split g = min(round(f M), round(s (M + o)), M)
// gives the GPU G pairs and the host H on average; the layer takes the
// trunk and the longer of the GPU's part (its k experts and G reads over
// PCIe) and the host's (H reads and the round trip when it has any).
// Hand-worked: 1 layer of 4 experts, k = 2.
TEST(Planner, PcieReadsSplitEachStepsMisses) {
  PlannerInputs in = small(1, 4, 2);
  in.rates.gpu_layer_s = 20e-6, in.rates.gpu_expert_s = 5e-6, in.rates.handoff_s = 100e-6, in.rates.token_fixed_s = 50e-6;
  in.rates.pcie_read_gbs = 0.5;  // 2 ms per expert over PCIe; the host reads one in 1 ms
  Plan plan;
  plan.fingerprint = in.fingerprint, plan.layers = 1, plan.experts = 4;
  plan.tier = {Tier::kRam, Tier::kRam, Tier::kRam, Tier::kRam};
  const Prediction off = coli::predict(in, plan);
  // Off: both misses on the host (p = 1/2 each): max(10 us, 2 ms) + (1 - e^-2) of the round trip.
  EXPECT_NEAR(1 / off.decode_tok_s, 50e-6 + 20e-6 + 2e-3 + 100e-6 * (1 - std::exp(-2.0)), 1e-12);
  EXPECT_EQ(off.pcie_read_pairs, 0);
  // Every step misses both (q = 1): share 0.5, offset 0 gives round(1) = 1
  // to the GPU: max(10 us + 2 ms, 1 ms + the round trip).
  in.pcie_read_share = 0.5, in.pcie_read_offset = 0;
  const Prediction half = coli::predict(in, plan);
  EXPECT_NEAR(1 / half.decode_tok_s, 50e-6 + 20e-6 + 10e-6 + 2e-3, 1e-12);
  EXPECT_NEAR(half.pcie_read_pairs, 0.5, 1e-12);
  // Two of the four in VRAM: m = 1, so M = 0, 1, 2 with 1/4, 1/2, 1/4.
  // Share 0.35, offset 2: M = 1 gives round(1.05) = 1 to the GPU (no round
  // trip), M = 2 round(1.4) = 1 and the host the other: G = 0.75, H = 0.25,
  // P(H > 0) = 0.25; max(10 us + 1.5 ms, 0.25 ms + 25 us).
  plan.tier = {Tier::kVram, Tier::kVram, Tier::kRam, Tier::kRam};
  in.pcie_read_share = 0.35, in.pcie_read_offset = 2;
  const Prediction split = coli::predict(in, plan);
  EXPECT_NEAR(1 / split.decode_tok_s, 50e-6 + 20e-6 + 10e-6 + 1.5e-3, 1e-12);
  // A fast bus: the host's part bounds it (H reads and its round trip).
  in.rates.pcie_read_gbs = 100;
  EXPECT_NEAR(1 / coli::predict(in, plan).decode_tok_s, 50e-6 + 20e-6 + 0.25e-3 + 25e-6, 1e-12);
  in.rates.pcie_read_gbs = 0.5;
  EXPECT_NEAR(split.pcie_read_pairs, (0.5 * 1 + 0.25 * 1) / 2, 1e-12);
  // Experts on disk are not readable over PCIe: with the two misses' experts
  // on disk the split gives the GPU none, and the model is the binomial
  // expectation of the host's reads (10 ms each) and the round trip.
  plan.tier = {Tier::kVram, Tier::kVram, Tier::kDisk, Tier::kDisk};
  const Prediction disk = coli::predict(in, plan);
  EXPECT_EQ(disk.pcie_read_pairs, 0);
  EXPECT_NEAR(1 / disk.decode_tok_s, 50e-6 + 20e-6 + 1e-2 + 100e-6 * (1 - std::exp(-1.0)), 1e-12) << "no RAM misses: the model without reads";
  PlannerInputs bad = in;
  bad.pcie_read_share = 1.5;
  EXPECT_THROW(coli::predict(bad, plan), coli::Error);
  bad = in, bad.rates.pcie_read_gbs = 0;
  EXPECT_THROW(coli::predict(bad, plan), coli::Error);
}
