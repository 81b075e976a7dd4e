// coli-place through the binary: a plan for the tiny model under a VRAM
// and a RAM budget (read back with the plan parser: budgets held, the
// hottest experts of a heat file in VRAM), --explain's predictions,
// explain of a saved plan, heat as TSV and merged, probe writing a rates
// file the planner reads, and the errors: usage (2) and bad files (1).
#include <gtest/gtest.h>

#include <filesystem>

#include "engine_util.h"
#include "formats/container.h"
#include "model/weights.h"
#include "model/model_spec.h"
#include "placement/heat.h"
#include "placement/machine_rates.h"
#include "placement/plan.h"
#include "placement/plan_apply.h"
#include "placement/plan_inputs.h"
#include "placement/vram_ledger.h"
#include "test_util.h"
#include "util/parse.h"

namespace {

namespace fs = std::filesystem;
using coli::test::run_command;

std::string place() { return coli::test::bin_dir() + "/coli-place"; }
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
int run_place(const std::string& args, std::string* out) { return run_command(place() + " " + args + " 2>&1", out); }

struct Model {
  coli::test::TempDir dir;
  std::string path, rates;
  uint64_t fingerprint = 0;
  int layers = 0, experts = 0;
  uint64_t expert_bytes = 0, needs = 0;  // needs: the device's bytes besides the experts (ctx 256, ubatch 64, the runs' PCIe reads)
  uint64_t slot_bytes = 0;                // an expert's slot on the device (its parts 256-byte padded)
  Model() {
    path = dir / "m.coli";
    coli::test::convert_all(coli::test::data_dir() + "/tiny-qwen35moe-text", path, coli::QuantFormat::I8);
    coli::Container c(path);
    fingerprint = c.fingerprint();
    const coli::ModelSpec s = coli::parse_model_spec(c.config_json(), path);
    layers = s.num_layers, experts = s.num_experts;
    for (const auto& b : c.manifest().blobs)
      if (b.kind == "expert") expert_bytes = std::max(expert_bytes, b.bytes);
    // As coli-place plans by default: for runs that swap and read part of
    // the misses over PCIe (whose one-token tables the reserve holds).
    coli::VramSettings run;
    run.n_ctx = 256, run.max_chunk = 64, run.swap = true, run.pcie_read_share = coli::kPcieReadAutoShare, run.expert_slots = 0;
    needs = coli::device_needs(coli::VramLedger(c, s, run)).total();
    slot_bytes = coli::expert_slot(coli::expert_parts_of(c)).bytes();
    coli::MachineRates r;
    r.host_expert_gbs = 1, r.disk_gbs = 0.1;
    rates = dir / "rates.txt";
    coli::save_rates(rates, r, "test");
  }
};

}  // namespace

TEST(PlaceTool, PlanHoldsTheBudgetsAndPutsTheHottestInVram) {
  Model m;
  // Heat: expert e of every layer routed (e + 1) * 10 times: the highest ids are hottest.
  coli::Heat h(m.layers, m.experts);
  std::vector<uint64_t> counts(std::size_t(m.layers) * m.experts);
  for (int l = 0; l < m.layers; ++l)
    for (int e = 0; e < m.experts; ++e) counts[std::size_t(l) * m.experts + e] = uint64_t(e + 1) * 10;
  h.add_counts(counts);
  h.add_tokens(10 * m.experts);
  const std::string heat = m.dir / "heat.txt";
  coli::save_heat(heat, h, m.fingerprint);
  // Whatever the trunk needs, a budget of it plus 16 expert slots leaves
  // 16 experts for VRAM; the RAM budget holds 20.
  std::string out;
  const uint64_t ram = 20 * m.expert_bytes + m.expert_bytes / 2;
  const std::string plan_path = m.dir / "plan.txt";
  const std::string args = "-m " + m.path + " --heat " + heat + " --rates " + m.rates + " --ram " + std::to_string(ram) + " --ctx 256 --ubatch 64";
  ASSERT_EQ(run_place("plan " + args + " --vram 8G -o " + plan_path + " --explain", &out), 0) << out;
  EXPECT_TRUE(has(out, "hit rate")) << out;
  EXPECT_TRUE(has(out, "decode:")) << out;
  coli::Plan p = coli::load_plan(plan_path, m.fingerprint, m.layers, m.experts);
  EXPECT_EQ(p.count(coli::Tier::kVram), int64_t(m.layers) * m.experts) << "8 GB holds every expert of the tiny model";
  // Room for 16 experts in VRAM: the hottest (highest ids) first, in every layer.
  const uint64_t vram_budget = m.needs + 16 * m.slot_bytes + m.slot_bytes / 2;
  ASSERT_EQ(run_place(args + " --vram " + std::to_string(vram_budget) + " -o " + plan_path, &out), 0) << out;  // no subcommand: plan
  p = coli::load_plan(plan_path, m.fingerprint, m.layers, m.experts);
  const int64_t vram = p.count(coli::Tier::kVram), in_ram = p.count(coli::Tier::kRam);
  EXPECT_LE(in_ram * int64_t(m.expert_bytes), int64_t(ram));
  EXPECT_EQ(vram, 16);
  EXPECT_EQ(in_ram, 20);
  EXPECT_EQ(p.vram_budget, vram_budget);
  for (int l = 0; l < m.layers; ++l)
    for (int e = 1; e < m.experts; ++e)
      EXPECT_GE(int(p.at(l, e)), int(p.at(l, e - 1))) << "layer " << l << ": a hotter expert in a lower tier";
  // explain reads the plan back and predicts the same.
  ASSERT_EQ(run_place("explain -m " + m.path + " --plan " + plan_path + " --heat " + heat + " --rates " + m.rates + " --ctx 256 --ubatch 64", &out), 0)
      << out;
  EXPECT_TRUE(has(out, std::to_string(vram) + " in VRAM, " + std::to_string(in_ram) + " in RAM")) << out;
}

TEST(PlaceTool, HeatPrintsAndMerges) {
  Model m;
  coli::Heat h(m.layers, m.experts);
  std::vector<uint64_t> counts(std::size_t(m.layers) * m.experts, 0);
  counts[3] = 7;
  h.add_counts(counts);
  h.add_tokens(10);
  const std::string a = m.dir / "a.txt", b = m.dir / "b.txt", merged = m.dir / "merged.txt";
  coli::save_heat(a, h, m.fingerprint);
  coli::save_heat(b, h, m.fingerprint);
  std::string out;
  ASSERT_EQ(run_command(place() + " heat " + a + " " + b + " --merge " + merged + " 2>/dev/null", &out), 0) << out;
  EXPECT_TRUE(has(out, "layer\texpert\tcount\tshare\n")) << out;
  EXPECT_TRUE(has(out, "\n0\t3\t14\t0.700000\n")) << out;
  const coli::Heat g = coli::load_heat(merged, m.fingerprint, m.layers, m.experts);
  EXPECT_EQ(g.tokens(), 20u);
  EXPECT_EQ(g.count(0, 3), 14u);
}

TEST(PlaceTool, ProbeWritesRatesThePlannerReads) {
  Model m;
  const std::string rates = m.dir / "probe.txt";
  std::string out;
  ASSERT_EQ(run_place("probe -m " + m.path + " -t 2 --seconds 0.05 -o " + rates, &out), 0) << out;
  const coli::MachineRates r = coli::load_rates(rates);
  EXPECT_GT(r.host_expert_gbs, 0);
  ASSERT_EQ(run_place("-m " + m.path + " --vram 1G --rates " + rates + " --explain", &out), 0) << out;
  EXPECT_TRUE(has(out, "predicted")) << out;
}

TEST(PlaceTool, ErrorsAndUsage) {
  Model m;
  std::string out;
  EXPECT_EQ(run_place("-m " + m.path, &out), 2) << out;  // no --vram
  EXPECT_TRUE(has(out, "--vram")) << out;
  EXPECT_EQ(run_place("frobnicate", &out), 2) << out;
  EXPECT_EQ(run_place("--help", &out), 0) << out;
  EXPECT_TRUE(has(out, "coli-place")) << out;
  const std::string bad = m.dir / "bad-plan.txt";
  coli::test::write_file(bad, "coli-plan 1\nmodel 0123456789abcdef layers 1 experts 2\n");
  EXPECT_EQ(run_place("explain -m " + m.path + " --plan " + bad + " --rates " + m.rates, &out), 1) << out;
  EXPECT_TRUE(has(out, bad)) << out;
  coli::test::write_file(bad, "coli-rates 1\npcie_gbs fast\n");
  EXPECT_EQ(run_place("-m " + m.path + " --vram 1G --rates " + bad, &out), 1) << out;
  EXPECT_TRUE(has(out, bad + ":2:")) << out;
}

// calibrate: a prompt file's routing, counted on the CPU, merged into a
// heat file: every token counted once, k experts per token and layer.
TEST(PlaceTool, CalibrateRecordsThePromptsRouting) {
  Model m;
  const std::string prompts = m.dir / "prompts.txt", heat = m.dir / "cal-heat.txt";
  const std::string tok = " --tokenizer " + coli::test::data_dir() + "/tiny-tokenizer";  // the tiny checkpoint has none
  coli::test::write_file(prompts, "The quick brown fox\n\nHello, world! 123\nsummarise this line\n");
  std::string out;
  ASSERT_EQ(run_place("calibrate -m " + m.path + " --prompts " + prompts + " --heat " + heat + tok + " --device cpu -t 2", &out), 0) << out;
  EXPECT_TRUE(has(out, "3 prompts")) << out;
  const coli::Heat h = coli::load_heat(heat, m.fingerprint, m.layers, m.experts);
  EXPECT_GT(h.tokens(), 6u);
  coli::Container c(m.path);
  const int k = coli::parse_model_spec(c.config_json(), m.path).num_experts_per_tok;
  for (int l = 0; l < m.layers; ++l) {
    uint64_t sum = 0;
    for (int e = 0; e < m.experts; ++e) sum += h.count(l, e);
    EXPECT_EQ(sum, h.tokens() * uint64_t(k)) << "layer " << l;
  }
  // Again: merged (the file's tokens double).
  ASSERT_EQ(run_place("calibrate -m " + m.path + " --prompts " + prompts + " --heat " + heat + tok + " --device cpu -t 2", &out), 0) << out;
  EXPECT_EQ(coli::load_heat(heat, m.fingerprint, m.layers, m.experts).tokens(), 2 * h.tokens());
}

// coli-run --plan: a plan of this model is taken (and auto plans at the
// start), one of another model or a broken file is an error naming it;
// the tokens never depend on the plan (here: the CPU, which has no tier).
TEST(PlaceTool, RunFollowsAPlanAndRefusesAnotherModels) {
  Model m;
  const std::string plan = m.dir / "run.plan", run = coli::test::bin_dir() + "/coli-run -m " + m.path + " --prompt-ids 1,2,3 -n 4 --temp 0 --heat none";
  std::string out, base;
  ASSERT_EQ(run_place("-m " + m.path + " --vram 1G --rates " + m.rates + " -o " + plan, &out), 0) << out;
  ASSERT_EQ(run_command(run + " 2>/dev/null", &base), 0) << base;
  for (const std::string& p : {plan, std::string("auto")}) {
    ASSERT_EQ(run_command(run + " --vram-budget 1G --plan " + p + " 2>/dev/null", &out), 0) << p;
    EXPECT_EQ(out, base) << p;
  }
  coli::Plan other = coli::load_plan(plan, m.fingerprint, m.layers, m.experts);
  other.fingerprint ^= 1;
  const std::string wrong = m.dir / "other.plan";
  coli::save_plan(wrong, other);
  EXPECT_EQ(run_command(run + " --vram-budget 1G --plan " + wrong + " 2>&1", &out), 1) << out;
  EXPECT_TRUE(has(out, wrong)) << out;
}

// A plan's RAM part on a run without a tier: the VRAM and RAM experts'
// bytes advised into memory, the disk ones not; the tokens unchanged.
TEST(PlaceTool, RamPartIsAdvisedWithoutATier) {
  Model m;
  auto model = coli::Model::load(m.path);
  coli::Plan p;
  p.fingerprint = m.fingerprint, p.layers = m.layers, p.experts = m.experts;
  p.tier.assign(std::size_t(m.layers) * m.experts, coli::Tier::kDisk);
  uint64_t want = 0;
  for (int l = 0; l < m.layers; ++l)
    for (int e = 0; e < m.experts; e += 3) {
      p.tier[std::size_t(l) * m.experts + e] = e % 2 ? coli::Tier::kRam : coli::Tier::kVram;
      const coli::ExpertWeights& x = model->layer(l).moe.experts[e];
      want += x.gate.bytes() + x.up.bytes() + x.down.bytes();
    }
  EXPECT_EQ(coli::advise_plan_ram(*model, p), want);
  const std::string plan = m.dir / "ram.plan";
  coli::save_plan(plan, p);
  const std::string run = coli::test::bin_dir() + "/coli-run -m " + m.path + " --prompt-ids 1,2,3 -n 4 --temp 0 --heat none --device cpu";
  std::string base, out;
  ASSERT_EQ(run_command(run + " 2>/dev/null", &base), 0);
  ASSERT_EQ(run_command(run + " --plan " + plan + " -v 2>&1 >/dev/null", &out), 0) << out;
  EXPECT_TRUE(has(out, "asked into memory")) << out;
  ASSERT_EQ(run_command(run + " --plan " + plan + " 2>/dev/null", &out), 0);
  EXPECT_EQ(out, base);
  ASSERT_EQ(run_command(run + " --plan auto 2>/dev/null", &out), 0) << out;  // the default: planned when a budget is in force
  EXPECT_EQ(out, base);
  p.layers = 1, p.tier.resize(m.experts);
  EXPECT_THROW(coli::advise_plan_ram(*model, p), coli::Error);
}
