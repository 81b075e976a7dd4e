// The expert tier's host-side parts, CPU-only: the budget ledger, the
// initial fill, byte sizes on the command line, and the CPU's ExpertHost
// against the CPU backend's own routed experts.
#include <gtest/gtest.h>

#include <cmath>

#include <numeric>

#include "cpu_backend.h"
#include "cpu_expert_host.h"
#include "model/weights.h"
#include "placement/device_budget.h"
#include "placement/tier_plan.h"
#include "placement/vram_ledger.h"
#include "test_util.h"
#include "util/error.h"
#include "util/parse.h"

using namespace coli;

TEST(DeviceBudget, ChargesCreditsAndNamesWhatDidNotFit) {
  DeviceBudget b(100);
  b.charge("weights", 60);
  b.charge("slots", 40);
  EXPECT_EQ(b.in_use(), 100u);
  EXPECT_EQ(b.available(), 0u);
  try {
    b.charge("the KV cache", 1);
    FAIL() << "over budget";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the KV cache needs 1 B with 100 B already in use"), std::string::npos) << e.what();
  }
  EXPECT_EQ(b.in_use(), 100u) << "a refused charge takes nothing";
  b.credit(40);
  b.charge("slots", 30);
  EXPECT_EQ(b.in_use(), 90u);
  EXPECT_EQ(b.peak(), 100u);
  EXPECT_THROW(b.charge("huge", UINT64_MAX), Error);  // no overflow past the limit
  DeviceBudget unlimited(0);
  unlimited.charge("x", 1ull << 40);
  EXPECT_EQ(unlimited.available(), UINT64_MAX);
  EXPECT_EQ(unlimited.peak(), 1ull << 40);
}

TEST(TierPlan, SpreadsEvenlyWithoutHeat) {
  const TierPlan p = plan_tier(3, 4, 7, nullptr);  // 7 slots over 3 layers: 3, 2, 2
  EXPECT_EQ(p.source, "even");
  EXPECT_EQ(p.count, 7);
  EXPECT_EQ(p.resident_in_layer(0), 3);
  EXPECT_EQ(p.resident_in_layer(1), 2);
  EXPECT_EQ(p.resident_in_layer(2), 2);
  EXPECT_TRUE(p.is_resident(0, 0) && p.is_resident(0, 1) && p.is_resident(0, 2) && !p.is_resident(0, 3));
  EXPECT_TRUE(p.is_resident(2, 1) && !p.is_resident(2, 2));
  EXPECT_TRUE(plan_tier(3, 4, 99, nullptr).all());
  EXPECT_EQ(plan_tier(3, 4, 99, nullptr).source, "all");
  EXPECT_EQ(plan_tier(3, 4, -5, nullptr).count, 0);
}

TEST(TierPlan, TakesTheGlobalHottestThenTheSpread) {
  // 2 layers x 4 experts; layer 1 is much hotter: the global top-N, not N per layer.
  const std::vector<uint64_t> heat = {5, 0, 1, 0,  //
                                      9, 8, 7, 0};
  const TierPlan p = plan_tier(2, 4, 4, &heat);
  EXPECT_EQ(p.source, "heat");
  EXPECT_TRUE(p.is_resident(1, 0) && p.is_resident(1, 1) && p.is_resident(1, 2) && p.is_resident(0, 0));
  EXPECT_EQ(p.resident_in_layer(0), 1);
  // Six slots: the five warm pairs, then the spread's first cold pair (expert 1 of layer 0).
  const TierPlan q = plan_tier(2, 4, 6, &heat);
  EXPECT_TRUE(q.is_resident(0, 2) && q.is_resident(0, 1) && !q.is_resident(0, 3) && !q.is_resident(1, 3));
  EXPECT_EQ(plan_tier(2, 4, 6, &heat).resident, q.resident) << "deterministic";
  const std::vector<uint64_t> wrong(7);
  EXPECT_THROW(plan_tier(2, 4, 1, &wrong), Error);
}

// Dense MLP layers (qwen3_moe's mlp_only_layers) have no routed experts:
// the plan spreads and ranks only the sparse layers' pairs, clamps the
// slots to them, and a dense pair's heat does not make it resident.
TEST(TierPlan, DenseLayersHoldNoExperts) {
  const std::vector<uint8_t> sparse = {0, 1, 0, 1, 1};  // layers 1, 3, 4 have 4 experts each
  const coli::TierPlan even = coli::plan_tier(5, 4, 5, nullptr, &sparse);
  EXPECT_EQ(even.source, "even");
  EXPECT_EQ(even.count, 5);
  EXPECT_EQ(even.pairs(), 12);
  EXPECT_FALSE(even.has_experts(0));
  EXPECT_TRUE(even.has_experts(3));
  // Expert 0 of layers 1, 3, 4, then expert 1 of layers 1 and 3.
  EXPECT_EQ(even.resident_in_layer(0), 0);
  EXPECT_EQ(even.resident_in_layer(2), 0);
  EXPECT_EQ(even.resident_in_layer(1), 2);
  EXPECT_EQ(even.resident_in_layer(3), 2);
  EXPECT_EQ(even.resident_in_layer(4), 1);
  EXPECT_TRUE(even.is_resident(4, 0) && even.is_resident(1, 1) && !even.is_resident(4, 1));
  EXPECT_EQ(coli::prefill_stage_slots(even, false), 3) << "layer 4's 3 non-residents: a dense layer stages nothing";
  std::vector<uint64_t> heat(20, 0);
  heat[0 * 4 + 2] = 100;  // a dense layer's pair: nothing routes there, never resident
  heat[3 * 4 + 3] = 7, heat[1 * 4 + 2] = 5;
  const coli::TierPlan hot = coli::plan_tier(5, 4, 3, &heat, &sparse);
  EXPECT_EQ(hot.source, "heat");
  EXPECT_FALSE(hot.is_resident(0, 2));
  EXPECT_TRUE(hot.is_resident(3, 3) && hot.is_resident(1, 2));
  EXPECT_EQ(hot.count, 3);
  const coli::TierPlan all = coli::plan_tier(5, 4, 1000, nullptr, &sparse);
  EXPECT_EQ(all.count, 12) << "clamped to the sparse layers' pairs";
  EXPECT_TRUE(all.all());
  EXPECT_EQ(all.source, "all");
  const std::vector<uint8_t> every(5, 1);
  const coli::TierPlan plain = coli::plan_tier(5, 4, 20, nullptr, &every);
  EXPECT_TRUE(plain.sparse.empty()) << "no dense layer: the plain plan";
  EXPECT_TRUE(plain.all());
  const std::vector<uint8_t> short_kinds(4, 1);
  EXPECT_THROW(coli::plan_tier(5, 4, 3, nullptr, &short_kinds), coli::Error) << "a kind for every layer";
}

TEST(ParseSize, UnitsAsLlamaCppUsersWriteThem) {
  EXPECT_EQ(parse_size("4096", "--vram-budget"), 4096u);
  EXPECT_EQ(parse_size("8G", "--vram-budget"), 8ull << 30);
  EXPECT_EQ(parse_size("8GiB", "--vram-budget"), 8ull << 30);
  EXPECT_EQ(parse_size("12000m", "--vram-budget"), 12000ull << 20);
  EXPECT_EQ(parse_size("1.5G", "--vram-budget"), 3ull << 29);
  EXPECT_EQ(parse_size("64KB", "--vram-budget"), 64ull << 10);
  for (const char* bad : {"", "G", "-1G", "8X", "nan", "inf", "0x10", "8 G", "1e30T"}) EXPECT_THROW(parse_size(bad, "--vram-budget"), UsageError) << bad;
}

TEST(ParsePrefillCpu, AutoOffOrACount) {
  EXPECT_EQ(coli::parse_prefill_cpu("auto", "--prefill-cpu"), -1);
  EXPECT_EQ(coli::parse_prefill_cpu("off", "--prefill-cpu"), 0);
  EXPECT_EQ(coli::parse_prefill_cpu("0", "--prefill-cpu"), 0);
  EXPECT_EQ(coli::parse_prefill_cpu("40", "--prefill-cpu"), 40);
  EXPECT_EQ(coli::parse_prefill_cpu("65536", "--prefill-cpu"), 65536);
  for (const char* bad : {"", "-1", "65537", "99999999999", "nan", "1e3", "0x10", "4 ", "+4", "auto1", "/dev/zero"}) {
    try {
      coli::parse_prefill_cpu(bad, "--prefill-cpu");
      ADD_FAILURE() << bad << " was taken";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--prefill-cpu"), std::string::npos) << e.what();
    }
  }
}

TEST(ParsePcieRead, AutoOffOrAShare) {
  EXPECT_EQ(parse_pcie_read("auto", "--pcie-read"), -1);
  EXPECT_EQ(parse_pcie_read("off", "--pcie-read"), 0);
  EXPECT_EQ(parse_pcie_read("0", "--pcie-read"), 0);
  EXPECT_EQ(parse_pcie_read("0.35", "--pcie-read"), 0.35);
  EXPECT_EQ(parse_pcie_read("1", "--pcie-read"), 1);
  for (const char* bad : {"", "-1", "1.5", "nan", "inf", "0x1", "0.3x", "abc", "1e9", "Auto"}) {
    try {
      parse_pcie_read(bad, "--pcie-read");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--pcie-read"), std::string::npos) << e.what();
    }
  }
}

TEST(ParsePcieRead, AutoTakesTheShareWithAMirrorOnly) {
  EXPECT_EQ(pcie_read_share(-1, true, false), kPcieReadAutoShare);
  EXPECT_EQ(pcie_read_share(-1, false, false), 0) << "no mirror: nothing registered to read";
  EXPECT_EQ(pcie_read_share(-1, true, true), 0) << "--decode-upload takes the misses";
  EXPECT_EQ(pcie_read_share(0.5, false, false), 0.5) << "a given share is kept";
  EXPECT_EQ(pcie_read_share(0, true, false), 0);
  EXPECT_EQ(check_pcie_read_offset(2, "--pcie-read-offset"), 2);
  for (double bad : {-1.0, 65.0, std::nan("")}) EXPECT_THROW(check_pcie_read_offset(bad, "--pcie-read-offset"), UsageError) << bad;
}

TEST(CpuExpertHost, ComputesThePairsItIsGivenAndZerosTheRest) {
  auto m = Model::load(test::data_dir() + "/tiny-qwen35moe-text");
  const int H = m->spec().hidden_size, T = 3;
  std::vector<float> hn(std::size_t(T) * H);
  for (std::size_t i = 0; i < hn.size(); ++i) hn[i] = std::sin(0.37f * i);
  const std::vector<ExpertPair> pairs = {{0, 3, 0.5f}, {2, 1, 0.25f}, {0, 7, 0.125f}};  // token 1 has none
  cpu::CpuExpertHost host(*m, 2);
  std::vector<float> out(std::size_t(T) * H, 42.0f);
  host.compute(1, pairs.data(), 3, hn.data(), T, out.data());
  cpu::CpuBackend ref(*m);  // the scalar reference
  std::vector<float> want(std::size_t(T) * H, 0.0f);
  ref.routed_experts(1, pairs.data(), 3, hn.data(), want.data());
  for (int h = 0; h < H; ++h) EXPECT_EQ(out[H + h], 0.0f) << "token 1 has no pairs";
  float err = 0, scale = 0;
  for (std::size_t i = 0; i < out.size(); ++i) err = std::max(err, std::fabs(out[i] - want[i])), scale = std::max(scale, std::fabs(want[i]));
  EXPECT_GT(scale, 0.0f);
  EXPECT_LT(err, 1e-4f * (1 + scale));
  std::vector<float> none(std::size_t(T) * H, 7.0f);
  host.compute(1, nullptr, 0, hn.data(), T, none.data());
  EXPECT_EQ(std::count(none.begin(), none.end(), 0.0f), static_cast<long>(none.size()));
}
