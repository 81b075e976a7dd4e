// Zero-config runs (tools/common/run_setup.h): the budget's arithmetic and
// the chunk's pick by hand-computed cases; then, on the GPU machine, a
// process that takes most of the device's memory itself and a run with no
// flags: a hybrid backend inside what is left, the whole model's tokens,
// the budget never exceeded; too little left: the CPU, with a line that
// says so (the tool prints it without -v). Skipped, with the reason,
// without a device.
#include <gtest/gtest.h>

#include <boost/program_options.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "cli_flags_util.h"
#include "common/run_flags.h"
#include "common/run_options.h"
#include "common/run_setup.h"
#include "cuda_backend.h"
#include "cuda_device.h"
#include "engine/engine.h"
#include "engine_util.h"
#include "formats/container.h"
#include "mirror/mirror_load.h"
#include "placement/vram_ledger.h"
#include "test_util.h"
#include "util/error.h"

namespace {

namespace po = boost::program_options;
namespace cli = coli::cli;
using coli::test::run_command;

constexpr uint64_t MiB = 1 << 20;

cli::RunFlags flags_of(std::vector<std::string> args, cli::Tool tool = cli::Tool::kRun) { return coli::test::cli_flags(std::move(args), tool); }
std::string usage_error(std::vector<std::string> args, cli::Tool tool = cli::Tool::kRun) { return coli::test::cli_usage_error(std::move(args), tool); }

coli::Prediction pred(double decode, double prefill) {
  coli::Prediction p;
  p.decode_tok_s = decode, p.prefill_tok_s = prefill;
  return p;
}

// The tiny fixture as an int4-g32 container, loaded as coli-run loads it.
struct Tiny {
  coli::test::TempDir dir;
  std::string path;
  coli::LoadedModel lm;
  Tiny() {
    path = dir / "m.coli";
    coli::test::convert_all(coli::test::data_dir() + "/tiny-qwen35moe-text", path, coli::QuantFormat::I4_G32);
    lm = coli::load_model(path, "off");
  }
  const coli::Model& model() const { return *lm.model; }
};

bool have_device(std::string* why) { return coli::cuda::device_count(why) > 0; }

}  // namespace

// Whole when free - margin holds it, a budget of free - margin when that
// holds the model without its routed experts, else the CPU with numbers.
TEST(RunSetup, FitsTheWholeModelABudgetOrNothing) {
  using K = cli::DeviceFit::Kind;
  const cli::DeviceFit whole = cli::fit_device(1000 * MiB, 256 * MiB, 744 * MiB, 100 * MiB);
  EXPECT_EQ(whole.kind, K::kWhole);
  EXPECT_EQ(whole.budget, 0u);
  const cli::DeviceFit tier = cli::fit_device(1000 * MiB, 256 * MiB, 745 * MiB, 100 * MiB);
  EXPECT_EQ(tier.kind, K::kTier);
  EXPECT_EQ(tier.budget, 744 * MiB);
  EXPECT_TRUE(tier.budget_auto);
  EXPECT_EQ(cli::fit_device(1000 * MiB, 256 * MiB, 4000 * MiB, 744 * MiB).kind, K::kTier) << "the floor fits exactly";
  const cli::DeviceFit cpu = cli::fit_device(1000 * MiB, 256 * MiB, 4000 * MiB, 745 * MiB);
  EXPECT_EQ(cpu.kind, K::kCpu);
  EXPECT_NE(cpu.why.find("0.98 GiB free"), std::string::npos) << cpu.why;
  EXPECT_NE(cpu.why.find("256 MiB --vram-margin"), std::string::npos) << cpu.why;
  EXPECT_NE(cpu.why.find("3.91 GiB on it whole and 0.73 GiB without its routed experts"), std::string::npos) << cpu.why;
  EXPECT_EQ(cli::fit_device(100 * MiB, 256 * MiB, 1, 1).kind, K::kCpu) << "a margin larger than what is free leaves nothing";
}

// The chunk: the most prefill among the sizes that keep decode within 8 %.
TEST(RunSetup, PicksTheLargestChunkDecodeAffords) {
  EXPECT_EQ(cli::pick_chunk({pred(100, 1000), pred(99, 1500), pred(92.5, 2000), pred(90, 2500)}), 2u);
  EXPECT_EQ(cli::pick_chunk({pred(100, 1000), pred(91, 1500), pred(90, 2000), pred(89, 2500)}), 0u);
  EXPECT_EQ(cli::pick_chunk({pred(100, 1000), pred(99, 0), pred(98, 0)}), 0u) << "prompts that cannot upload gain nothing from a larger chunk";
  EXPECT_EQ(cli::pick_chunk({pred(100, 1000), pred(100, 1000), pred(100, 900)}), 0u) << "ties: the smaller chunk";
  EXPECT_EQ(cli::pick_chunk({pred(80, 1000), pred(100, 900)}), 1u) << "the first size can be the one decode cannot afford";
  EXPECT_EQ(cli::pick_chunk({pred(100, 1000)}), 0u);
}

// auto is the default budget and a list entry; the margin is a size.
TEST(RunSetup, BudgetAutoAndTheMargin) {
  EXPECT_EQ(flags_of({}).vram_budgets, std::vector<uint64_t>{cli::kBudgetAuto});
  EXPECT_EQ(flags_of({"--vram-budget", "auto"}).vram_budgets, std::vector<uint64_t>{cli::kBudgetAuto});
  EXPECT_EQ(flags_of({"--vram-budget", "auto,2G"}, cli::Tool::kBench).vram_budgets, (std::vector<uint64_t>{cli::kBudgetAuto, 2ull << 30}));
  EXPECT_EQ(flags_of({}).vram_margin, cli::kDefaultVramMargin);
  EXPECT_EQ(flags_of({"--vram-margin", "1G"}).vram_margin, 1ull << 30);
  EXPECT_EQ(flags_of({"--vram-margin", "0"}).vram_margin, 0u);
  EXPECT_NE(usage_error({"--vram-margin", "-1G"}).find("--vram-margin"), std::string::npos);
  EXPECT_NE(usage_error({"--vram-margin", "nan"}).find("--vram-margin"), std::string::npos);
  EXPECT_NE(usage_error({"--vram-budget", "x"}).find("--vram-budget"), std::string::npos);
  EXPECT_NE(usage_error({"--vram-budget", "-2G"}).find("--vram-budget"), std::string::npos);
  EXPECT_TRUE(flags_of({}).plan_auto()) << "planned by default";
  EXPECT_FALSE(flags_of({"--plan", "p.plan"}).plan_auto());
}

// The weights' span is the container's mapping: every matrix inside it.
TEST(RunSetup, HostSpanIsInsideTheContainer) {
  Tiny t;
  const auto [p, n] = cli::host_span(t.model());
  ASSERT_NE(p, nullptr);
  EXPECT_LE(n, std::filesystem::file_size(t.path) + 4096);
  EXPECT_GT(n, std::filesystem::file_size(t.path) / 2) << "the weights are most of the file";
  const auto* x = t.model().layer(0).moe.experts[0].gate.data;
  EXPECT_TRUE(x >= static_cast<const uint8_t*>(p) && x < static_cast<const uint8_t*>(p) + n);
}

// --device cpu: the CPU, no line; with no device (CI): the CPU, no line,
// the reason kept for -v.
TEST(RunSetup, TheCpuWithoutALine) {
  Tiny t;
  const cli::RunFlags f = flags_of({"--device", "cpu", "--heat", "none"});
  cli::RunRequest r;
  r.flags = &f, r.model_path = t.path, r.model = &t.model(), r.vram_budget = f.vram_budgets[0];
  cli::RunSetup s = cli::setup_run(r);
  EXPECT_EQ(s.backend->name(), "cpu");
  EXPECT_EQ(s.chunk, cli::kDefaultChunk);
  EXPECT_EQ(cli::notice(s), "");
  std::string why;
  if (have_device(&why)) return;
  const cli::RunFlags a = flags_of({"--heat", "none"});
  r.flags = &a;
  s = cli::setup_run(r);
  EXPECT_EQ(s.backend->name(), "cpu");
  EXPECT_EQ(cli::notice(s), "") << "no device: nothing to explain without -v";
  EXPECT_FALSE(s.fallback.empty());
  // A budget given where there is no GPU is not ignored silently.
  const cli::RunFlags b = flags_of({"--heat", "none", "--vram-budget", "16T"});
  r.flags = &b, r.vram_budget = b.vram_budgets[0];
  s = cli::setup_run(r);
  EXPECT_EQ(s.backend->name(), "cpu");
  EXPECT_EQ(cli::notice(s).find("--vram-budget 16384.00 GiB ignored: no usable GPU"), 0u) << cli::notice(s);
}

namespace {

// The VRAM ledger's need of the tiny model at 512 tokens of context and
// chunk: with every expert, and without its routed experts (the floor).
std::pair<uint64_t, uint64_t> need_and_floor(Tiny& t) {
  coli::VramSettings whole, tier;
  whole.n_ctx = tier.n_ctx = 512, whole.max_chunk = tier.max_chunk = 512, tier.budget = 1;
  return {coli::VramLedger(t.model(), whole).device_floor(), coli::VramLedger(t.model(), tier).device_floor()};
}

// The whole model's greedy tokens on the GPU, per golden prompt.
std::vector<std::vector<int>> whole_model_tokens(Tiny& t) {
  std::vector<std::vector<int>> want;
  auto w = coli::cuda::make_cuda_backend(t.model());
  coli::Engine ew(t.model().spec(), *w, 512);
  for (const auto& p : coli::test::tiny_goldens()["prompts"]) want.push_back(coli::test::greedy_tokens(ew, p["ids"]));
  return want;
}

// While it lives, new host registrations are refused as the driver
// refuses them beyond the lockable memory (the registry's test seam).
struct RefuseRegistrations {
  explicit RefuseRegistrations(bool on = true) { coli::cuda::refuse_host_registrations(on); }
  ~RefuseRegistrations() { coli::cuda::refuse_host_registrations(false); }
};

// Every golden prompt's greedy tokens on e are want's (whole_model_tokens).
void expect_whole_model_tokens(coli::Engine& e, const std::vector<std::vector<int>>& want, const std::string& what = "") {
  std::size_t i = 0;
  for (const auto& p : coli::test::tiny_goldens()["prompts"]) {
    const std::vector<int> ids = p["ids"];
    EXPECT_EQ(coli::test::greedy_tokens(e, ids), want[i++]) << what << "prompt of " << ids.size();
  }
}

}  // namespace

// On the GPU: this process holds all but a little more than the model
// without its routed experts; no budget given, the run gets a tier inside
// what is free, the whole model's greedy tokens, and never more memory
// than its budget.
TEST(RunSetupCuda, TakesTheFreeMemoryItFinds) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  Tiny t;
  const coli::ModelSpec& spec = t.model().spec();
  const auto [need, floor] = need_and_floor(t);
  ASSERT_LT(floor, need);
  // Leave the floor, half the experts' room and about 16 MiB free, then
  // make the margin what is free beyond the floor and half the experts (the
  // driver rounds the hold to its granularity, 2 MiB, more than the tiny
  // model's experts take: the free memory is measured, not assumed).
  const uint64_t target = floor + (need - floor) / 2;
  const std::vector<std::vector<int>> want = whole_model_tokens(t);  // the reference placement
  const std::size_t free0 = coli::cuda::device_free_bytes();
  ASSERT_GT(free0, target + 64 * MiB);
  coli::cuda::DeviceMemoryHold hold(free0 - target - 16 * MiB);
  const std::size_t free1 = coli::cuda::device_free_bytes();
  ASSERT_GT(free1, target + 4 * MiB);
  const uint64_t margin = free1 - target;
  const cli::RunFlags f = flags_of({"--vram-margin", std::to_string(margin), "--heat", "none", "--no-swap"});
  cli::RunRequest r;
  r.flags = &f, r.model_path = t.path, r.model = &t.model(), r.vram_budget = f.vram_budgets[0], r.n_ctx = 512;
  cli::RunSetup s = cli::setup_run(r);
  EXPECT_EQ(s.fit.kind, cli::DeviceFit::Kind::kTier);
  EXPECT_TRUE(s.fit.budget_auto);
  EXPECT_LE(s.fit.budget + margin, free1);
  EXPECT_EQ(s.backend->name(), "cuda");
  const coli::TierStats ts0 = s.backend->tier_stats();
  EXPECT_TRUE(ts0.tiered);
  EXPECT_GT(ts0.resident, 0);
  EXPECT_LT(ts0.resident, ts0.experts);
  EXPECT_EQ(s.host_memory, "container") << "no mirror: the container's mapping is registered";
  EXPECT_GT(ts0.pinned_host_bytes, 0u);
  EXPECT_EQ(s.plan_source, "even");
  const std::string line = cli::notice(s);
  // Pinned weights: prompts upload the tier's misses when the staging fits
  // beside the tier (the VRAM ledger's test), and the line says which.
  EXPECT_EQ(line.find("prompts on the GPU") != std::string::npos, ts0.prefill_upload) << line;
  EXPECT_NE(line.find("VRAM budget"), std::string::npos) << line;
  EXPECT_NE(line.find("--vram-margin"), std::string::npos) << line;
  EXPECT_NE(line.find("experts in VRAM"), std::string::npos) << line;
  std::printf("[ info     ] %s\n", line.c_str());
  coli::Engine e(spec, *s.backend, s.chunk);
  std::size_t free_min = SIZE_MAX;
  std::size_t i = 0;
  for (const auto& p : coli::test::tiny_goldens()["prompts"]) {
    const std::vector<int> ids = p["ids"];
    EXPECT_EQ(coli::test::greedy_tokens(e, ids), want[i++]) << "prompt of " << ids.size();
    free_min = std::min(free_min, coli::cuda::device_free_bytes());
  }
  const coli::TierStats ts = s.backend->tier_stats();
  EXPECT_LE(ts.vram_peak, s.fit.budget);
  const char* shared = std::getenv("COLI_TEST_SHARED_DEVICE");
  if (!(shared && std::string(shared) == "1")) {
    EXPECT_LE(free1 - free_min, s.fit.budget + 2 * MiB) << "the device's own count";
  }
  EXPECT_GT(ts.misses, 0) << "the CPU computed the experts the tier lacks";
}

// The driver refuses to pin the container's mapping (as it does beyond the
// memory the process may lock: RLIMIT_MEMLOCK, a cgroup's limit; here the
// registry's test seam refuses): the run is the pageable one, prompts on
// the CPU, the line says why, the tokens are the whole model's.
TEST(RunSetupCuda, RefusedPinningRunsPageableAndSaysSo) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  Tiny t;
  const coli::ModelSpec& spec = t.model().spec();
  const auto [need, floor] = need_and_floor(t);
  const std::vector<std::vector<int>> want = whole_model_tokens(t);
  const cli::RunFlags f = flags_of({"--vram-budget", std::to_string(floor + (need - floor) / 2), "--heat", "none", "--no-swap"});
  cli::RunRequest r;
  r.flags = &f, r.model_path = t.path, r.model = &t.model(), r.vram_budget = f.vram_budgets[0], r.n_ctx = 512;
  const std::size_t ranges = coli::cuda::registered_host_ranges();
  {
    RefuseRegistrations refusal;
    cli::RunSetup s = cli::setup_run(r);
    ASSERT_EQ(s.fit.kind, cli::DeviceFit::Kind::kTier);
    EXPECT_EQ(s.host_memory, "pageable");
    EXPECT_NE(s.pageable_why.find("refused to pin"), std::string::npos) << s.pageable_why;
    const coli::TierStats ts = s.backend->tier_stats();
    EXPECT_TRUE(ts.tiered);
    EXPECT_EQ(ts.pinned_host_bytes, 0u);
    EXPECT_FALSE(ts.prefill_upload) << "pageable: prompts' missing experts on the CPU";
    EXPECT_EQ(ts.pcie_read, 0) << "nothing pinned to read over PCIe";
    EXPECT_EQ(coli::cuda::registered_host_ranges(), ranges);
    const std::string line = cli::notice(s);
    EXPECT_NE(line.find("weights pageable (the driver refused to pin"), std::string::npos) << line;
    EXPECT_NE(line.find("prompts' missing experts on the CPU in chunks"), std::string::npos) << line;
    std::printf("[ info     ] %s\n", line.c_str());
    coli::Engine e(spec, *s.backend, s.chunk);
    expect_whole_model_tokens(e, want);
    EXPECT_GT(s.backend->tier_stats().misses, 0);
  }
  // Allowed again: the same request pins the container.
  cli::RunSetup s = cli::setup_run(r);
  EXPECT_EQ(s.host_memory, "container");
  EXPECT_GT(s.container_pin.bytes(), 0u);
  EXPECT_GT(s.backend->tier_stats().pinned_host_bytes, 0u);
  EXPECT_EQ(coli::cuda::registered_host_ranges(), ranges + 1) << "the backend shares the tool's registration";
}

// coli-run's background pin (RunRequest::pin_in_background): the line
// says the weights are being pinned, the run switches over at its first
// chunk once the pin is there (PCIe reads, prompt uploads) with the whole
// model's tokens, and pin_outcome() says what it pinned; refused, the run
// stays pageable (uploads off) and the outcome is the line a tool prints
// always. Nothing stays registered.
TEST(RunSetupCuda, ABackgroundPinIsTakenOrRefusedWithALine) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  Tiny t;
  const coli::ModelSpec& spec = t.model().spec();
  const auto [need, floor] = need_and_floor(t);
  const std::vector<std::vector<int>> want = whole_model_tokens(t);
  const cli::RunFlags f = flags_of({"--vram-budget", std::to_string(floor + (need - floor) / 2), "--heat", "none", "--no-swap"});
  cli::RunRequest r;
  r.flags = &f, r.model_path = t.path, r.model = &t.model(), r.vram_budget = f.vram_budgets[0], r.n_ctx = 512;
  r.pin_in_background = true;
  const std::size_t ranges = coli::cuda::registered_host_ranges();
  for (const bool refuse : {false, true}) {
    RefuseRegistrations refusal(refuse);
    cli::RunSetup s = cli::setup_run(r);
    ASSERT_EQ(s.fit.kind, cli::DeviceFit::Kind::kTier);
    EXPECT_EQ(s.host_memory, "container");
    ASSERT_TRUE(s.pin_future.valid());
    const std::string line = cli::notice(s);
    EXPECT_NE(line.find("weights being pinned in the background"), std::string::npos) << line;
    std::printf("[ info     ] %s\n", line.c_str());
    s.pin_future.wait();  // taken over at the first chunk
    coli::Engine e(spec, *s.backend, s.chunk);
    expect_whole_model_tokens(e, want, refuse ? "refused, " : "");
    const coli::TierStats ts = s.backend->tier_stats();
    EXPECT_FALSE(ts.pin_pending);
    EXPECT_EQ(ts.pin_switch_tokens, 0) << "switched before the first chunk";
    bool refused = false;
    const std::string outcome = cli::pin_outcome(s, &refused);
    std::printf("[ info     ] %s\n", outcome.c_str());
    EXPECT_EQ(refused, refuse);
    if (refuse) {
      EXPECT_EQ(ts.pinned_host_bytes, 0u);
      EXPECT_FALSE(ts.prefill_upload);
      EXPECT_EQ(ts.pcie_read, 0);
      EXPECT_EQ(ts.prefill_upload_bytes, 0u);
      EXPECT_EQ(s.host_memory, "pageable");
      EXPECT_NE(outcome.find("refused to pin"), std::string::npos) << outcome;
      EXPECT_EQ(coli::cuda::registered_host_ranges(), ranges);
    } else {
      EXPECT_GT(ts.pinned_host_bytes, 0u);
      EXPECT_EQ(ts.pcie_read, ts.experts - ts.resident) << "the tool's auto PCIe-read share on the pinned container";
      EXPECT_EQ(ts.prefill_upload_bytes > 0, ts.prefill_upload) << "prompts upload when the staging fit";
      EXPECT_NE(outcome.find("pinned the container"), std::string::npos) << outcome;
      EXPECT_EQ(coli::cuda::registered_host_ranges(), ranges + 1) << "one registration, the tool's and the backend's";
      EXPECT_NE(cli::notice(s).find("weights pinned (the container registered"), std::string::npos) << cli::notice(s);
    }
  }
  EXPECT_EQ(coli::cuda::registered_host_ranges(), ranges);
}

// Too little left for the model without its experts: the CPU, and the
// line says why; coli-run prints it without -v. A margin or budget larger
// than the card is a usage error.
TEST(RunSetupCuda, TooLittleMemoryRunsOnTheCpuAndSaysSo) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  Tiny t;
  const std::size_t total = coli::cuda::device_total_bytes();
  const std::string margin = std::to_string(total - MiB);  // leaves nothing whatever is free
  const cli::RunFlags f = flags_of({"--vram-margin", margin, "--heat", "none"});
  cli::RunRequest r;
  r.flags = &f, r.model_path = t.path, r.model = &t.model(), r.vram_budget = f.vram_budgets[0];
  cli::RunSetup s = cli::setup_run(r);
  EXPECT_EQ(s.fit.kind, cli::DeviceFit::Kind::kCpu);
  EXPECT_EQ(s.backend->name(), "cpu");
  const std::string line = cli::notice(s);
  EXPECT_NE(line.find("running on the CPU"), std::string::npos) << line;
  EXPECT_NE(line.find("without its routed experts"), std::string::npos) << line;
  const cli::RunFlags c = flags_of({"--vram-margin", margin, "--heat", "none", "--device", "cuda"});
  r.flags = &c;
  EXPECT_THROW(cli::setup_run(r), coli::Error) << "--device cuda: an error, not the CPU";

  const std::string run = coli::test::bin_dir() + "/coli-run -m " + t.path + " --prompt-ids 1,2,3 -n 2 --temp 0 --heat none";
  std::string out;
  EXPECT_EQ(run_command(run + " --vram-margin " + margin + " 2>&1", &out), 0) << out;
  EXPECT_NE(out.find("coli-run: not enough GPU memory: "), std::string::npos) << out;
  EXPECT_NE(out.find("running on the CPU"), std::string::npos) << out;
  EXPECT_EQ(run_command(run + " --vram-margin " + std::to_string(total) + " 2>&1", &out), 2) << out;
  EXPECT_NE(out.find("--vram-margin"), std::string::npos) << out;
  EXPECT_EQ(run_command(run + " --vram-budget " + std::to_string(total + MiB) + " 2>&1", &out), 2) << out;
  EXPECT_NE(out.find("--vram-budget"), std::string::npos) << out;
  // No flags on a card that holds it: the whole GPU, no line.
  EXPECT_EQ(run_command(run + " 2>&1", &out), 0) << out;
  EXPECT_EQ(out.find("coli-run: VRAM budget"), std::string::npos) << out;
  EXPECT_EQ(out.find("not enough GPU memory"), std::string::npos) << out;
}
