// The tools' run-options layer (tools/common): coli-run --plan auto plans
// exactly as coli-place does for the same container, heat, rates, budgets,
// context and chunk (the coli-place binary against the function coli-run
// calls), with coli-place's PCIe-read share; the flags turned into the
// CUDA backend's options; and the flags' checks and their messages.
#include <gtest/gtest.h>

#include <boost/program_options.hpp>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/heat_flag.h"
#include "cli_flags_util.h"
#include "common/run_flags.h"
#include "common/run_options.h"
#include "common/run_plan.h"
#include "engine_util.h"
#include "formats/container.h"
#include "model/model_spec.h"
#include "placement/heat.h"
#include "placement/heat_recorder.h"
#include "placement/machine_rates.h"
#include "placement/plan.h"
#include "placement/plan_inputs.h"
#include "test_util.h"
#include "util/parse.h"

namespace {

namespace po = boost::program_options;
namespace cli = coli::cli;
using coli::test::run_command;

// XDG_CACHE_HOME set to dir while it lives (this machine's rates cache is
// read from there), restored after.
class CacheHome {
 public:
  explicit CacheHome(const std::string& dir) {
    if (const char* v = std::getenv("XDG_CACHE_HOME")) old_ = v;
    ::setenv("XDG_CACHE_HOME", dir.c_str(), 1);
  }
  ~CacheHome() {
    if (old_) ::setenv("XDG_CACHE_HOME", old_->c_str(), 1);
    else ::unsetenv("XDG_CACHE_HOME");
  }

 private:
  std::optional<std::string> old_;
};

// The tiny model as an int8 container, a heat file whose highest expert ids
// are hottest, and measured rates in this machine's cache under dir/cache.
struct Model {
  coli::test::TempDir dir;
  std::string path, heat, cache;
  coli::ModelSpec spec;
  uint64_t expert_bytes = 0, needs = 0;  // needs: the device's bytes besides the experts (ctx 256, chunk 64)
  Model() {
    path = dir / "m.coli", heat = dir / "heat.txt", cache = dir / "cache";
    coli::test::convert_all(coli::test::data_dir() + "/tiny-qwen35moe-text", path, coli::QuantFormat::I8);
    const coli::Container c(path);
    spec = coli::parse_model_spec(c.config_json(), path);
    for (const auto& b : c.manifest().blobs)
      if (b.kind == "expert") expert_bytes = std::max(expert_bytes, b.bytes);
    needs = coli::device_needs(c, spec, 256, 64).total();
    coli::Heat h(spec.num_layers, spec.num_experts);
    std::vector<uint64_t> counts(std::size_t(spec.num_layers) * spec.num_experts);
    for (std::size_t i = 0; i < counts.size(); ++i) counts[i] = uint64_t(i % spec.num_experts + 1) * 10;
    h.add_counts(counts);
    h.add_tokens(10 * spec.num_experts);
    coli::save_heat(heat, h, c.fingerprint());
    coli::MachineRates r;
    r.host_expert_gbs = 1, r.disk_gbs = 0.1;
    std::filesystem::create_directories(std::filesystem::path(rates()).parent_path());
    coli::save_rates(rates(), r, "test");
  }
  std::string rates() const { return coli::default_rates_path(cache.c_str(), nullptr, cli::host_name(), coli::expert_format_name(coli::Container(path))); }
  uint64_t all_experts() const { return uint64_t(spec.num_layers) * spec.num_experts * expert_bytes; }
};

// coli-run's flags as its command line gives them.
cli::RunFlags run_flags(std::vector<std::string> args, cli::Tool tool = cli::Tool::kRun) { return coli::test::cli_flags(std::move(args), tool); }
std::string usage_error(std::vector<std::string> args, cli::Tool tool = cli::Tool::kRun) { return coli::test::cli_usage_error(std::move(args), tool); }

}  // namespace

// The same container, heat, rates file, budgets, context and chunk: the
// plan coli-place writes is the plan coli-run --plan auto makes, byte for
// byte (its predictions included), with the PCIe reads on and off.
TEST(RunPlanAuto, PlansAsColiPlaceDoes) {
  Model m;
  const CacheHome home(m.cache);
  const std::string vram = std::to_string(m.needs + 16 * m.expert_bytes + m.expert_bytes / 2);
  for (const std::string pcie : {"auto", "off"}) {
    const std::string plan_file = m.dir / ("place-" + pcie + ".plan");
    std::string out;
    ASSERT_EQ(run_command("XDG_CACHE_HOME=" + m.cache + " " + coli::test::bin_dir() + "/coli-place plan -m " + m.path + " --vram " + vram + " --ram " +
                              std::to_string(m.all_experts()) + " --heat " + m.heat + " --rates " + m.rates() + " --ctx 256 --ubatch 64 --pcie-read " +
                              pcie + " -o " + plan_file + " 2>&1",
                          &out),
              0)
        << out;
    const cli::RunFlags flags = run_flags({"--vram-budget", vram, "--plan", "auto", "--heat", m.heat, "--pcie-read", pcie});
    coli::Prediction predicted;
    std::string rates_from;
    const coli::Plan run = cli::plan_for_run(m.path, m.spec, flags, 256, 64, nullptr, &predicted, &rates_from);
    EXPECT_EQ(rates_from, m.rates()) << "coli-run reads this machine's cached rates";
    const coli::Plan place = coli::load_plan(plan_file, run.fingerprint, m.spec.num_layers, m.spec.num_experts);
    EXPECT_EQ(run.tier, place.tier) << pcie;
    EXPECT_EQ(run.vram_budget, place.vram_budget);
    EXPECT_EQ(run.ram_budget, place.ram_budget);
    EXPECT_EQ(run.prefill_chunk, place.prefill_chunk);
    EXPECT_EQ(coli::format_plan(run), coli::test::read_file(plan_file)) << pcie;
    EXPECT_GT(run.count(coli::Tier::kVram), 0) << "a budget of 16 experts places some";
    EXPECT_LT(run.count(coli::Tier::kVram), int64_t(m.spec.num_layers) * m.spec.num_experts) << "and not all";
  }
  // The share is in the plan (its predictions): planning without it, as
  // --plan auto once did, would not give coli-place's plan.
  EXPECT_NE(coli::test::read_file(m.dir / "place-auto.plan"), coli::test::read_file(m.dir / "place-off.plan"));
}

// The share --plan auto plans with: coli-place's (auto: 0.35, the mirror
// being the RAM tier the runs read; off: 0), whether or not this run has a
// mirror; the offset as given.
TEST(RunPlanAuto, PlansWithColiPlacesPcieReadShare) {
  Model m;
  const CacheHome home(m.cache);
  const coli::Container c(m.path);
  for (const auto& [flag, share] : {std::pair<std::string, double>{"auto", coli::kPcieReadAutoShare}, {"off", 0.0}, {"0.5", 0.5}}) {
    const cli::RunFlags f = run_flags({"--vram-budget", "1G", "--plan", "auto", "--pcie-read", flag, "--pcie-read-offset", "3", "--heat", "none"});
    cli::PlanRequest r;
    r.vram_budget = f.vram_budgets[0], r.ctx = 256, r.chunk = 64;
    r.pcie_read = f.tier.pcie_read, r.pcie_read_offset = f.tier.pcie_read_offset, r.heat = f.heat;
    const coli::PlannerInputs in = cli::plan_inputs(c, m.spec, r);
    EXPECT_EQ(in.pcie_read_share, share) << flag;
    EXPECT_EQ(in.pcie_read_offset, 3) << flag;
    EXPECT_EQ(in.ram_bytes, m.all_experts()) << "no RAM budget: every expert";
    EXPECT_EQ(in.chunks, std::vector<int>{64});
    EXPECT_TRUE(in.heat.empty()) << "--heat none: even";
  }
}

// The flags into CudaOptions: the tier's only under a budget, the
// environment's base kept, auto's PCIe share only with a mirror.
TEST(RunOptions, FlagsBecomeCudaOptions) {
  Model m;
  auto model = coli::Model::load(m.path);
  coli::cuda::CudaOptions base;
  base.pdl = false;  // as a COLI_* variable would set it
  const cli::RunFlags f = run_flags({"--vram-budget", "2G", "--no-swap", "--prefill-upload", "--pcie-read-offset", "4", "--device", "cpu"});
  cli::BackendTarget t;
  t.model = model.get(), t.vram_budget = f.vram_budgets[0], t.n_ctx = 300, t.max_chunk = 64, t.heat = {3, 2, 1};
  coli::cuda::CudaOptions co = cli::cuda_options(base, f, t);
  EXPECT_FALSE(co.pdl);
  EXPECT_EQ(co.vram_budget, 2ull << 30);
  EXPECT_EQ(co.n_ctx, 300);
  EXPECT_EQ(co.max_chunk, 64);
  EXPECT_FALSE(co.swap);
  EXPECT_TRUE(co.prefill_upload);
  EXPECT_EQ(co.pcie_read_share, 0) << "auto without a mirror: nothing registered to read";
  EXPECT_EQ(co.pcie_read_offset, 4);
  EXPECT_EQ(co.heat, (std::vector<uint64_t>{3, 2, 1}));
  coli::Plan p;  // a plan's VRAM experts come first, then the heat's order
  p.layers = 1, p.experts = 3, p.tier = {coli::Tier::kRam, coli::Tier::kDisk, coli::Tier::kVram};
  t.plan = &p;
  EXPECT_EQ(cli::cuda_options(base, f, t).heat, coli::plan_as_heat(p, t.heat));
  EXPECT_GT(cli::cuda_options(base, f, t).heat[2], cli::cuda_options(base, f, t).heat[0]);
  t.plan = nullptr;
  EXPECT_EQ(co.expert_host, nullptr) << "--device cpu: no GPU to hand experts off from";
  EXPECT_TRUE(co.host_regions.empty());
  EXPECT_TRUE(co.read_only_host_regions.empty());
  // Without a mirror, the container's span: registered read-only, and
  // auto's PCIe share with it; prefill uploads as the target chose.
  const cli::RunFlags a = run_flags({"--vram-budget", "2G"});
  t.container_span = cli::host_span(*model), t.prefill_upload = true;
  co = cli::cuda_options(base, a, t);
  ASSERT_EQ(co.read_only_host_regions.size(), 1u);
  EXPECT_EQ(co.read_only_host_regions[0], t.container_span);
  EXPECT_EQ(co.pcie_read_share, coli::kPcieReadAutoShare);
  EXPECT_TRUE(co.prefill_upload);
  t.container_span = {nullptr, 0}, t.prefill_upload = false;
  co = cli::cuda_options(base, run_flags({"--vram-budget", "2G", "--pcie-read", "0.5", "--decode-upload", "2"}), t);
  EXPECT_EQ(co.pcie_read_share, 0.5) << "a given share is kept";
  EXPECT_EQ(co.decode_upload_max, 2);
  t.vram_budget = 0;
  co = cli::cuda_options(base, f, t);
  EXPECT_EQ(co.vram_budget, 0u);
  EXPECT_EQ(co.n_ctx, 0) << "no tier: the tier's options stay the backend's";
  EXPECT_FALSE(co.prefill_upload);
  EXPECT_TRUE(co.heat.empty());
  EXPECT_EQ(co.max_chunk, 64);
}

// The device's CPU expert threads: -t wins; without it the cores less the
// tool's own threads (coli-run 1, coli-serve 3), never fewer than one.
TEST(RunOptions, ExpertThreadsLeaveTheToolsOwn) {
  EXPECT_EQ(cli::expert_host_threads(0, 1, 16), 15);
  EXPECT_EQ(cli::expert_host_threads(0, 3, 16), 13);
  EXPECT_EQ(cli::expert_host_threads(5, 3, 16), 5);
  EXPECT_EQ(cli::expert_host_threads(0, 0, 16), 15) << "at least the thread that drives the device";
  EXPECT_EQ(cli::expert_host_threads(0, 3, 2), 1);
}

// The checks, each in one place, with the tools' messages.
TEST(RunFlags, ChecksWithTheToolsMessages) {
  EXPECT_EQ(usage_error({"--device", "gpu"}), "--device must be cuda, cpu or auto, not 'gpu'");
  EXPECT_EQ(run_flags({"--device", "gpu", "--reference"}).device, "cpu") << "--reference: the CPU, --device unread";
  EXPECT_EQ(run_flags({}).device, "auto");
  EXPECT_EQ(usage_error({"--heat", ""}), "--heat needs a FILE or 'none'");
  EXPECT_EQ(usage_error({"--plan", "auto"}), "(no usage error)") << "auto is the default";
  EXPECT_EQ(usage_error({"--vram-budget", "0"}), "--vram-budget must be more than 0");
  EXPECT_EQ(usage_error({"--vram-budget", "1G,0"}, cli::Tool::kBench), "--vram-budget values must be more than 0");
  EXPECT_EQ(run_flags({"--vram-budget", "1G,2G"}, cli::Tool::kBench).vram_budgets, (std::vector<uint64_t>{1ull << 30, 2ull << 30}));
  EXPECT_EQ(usage_error({"--mirror", "a/b"}).find("--mirror"), 0u);
  // The tier's companions: checked always (a budget is auto by default).
  EXPECT_EQ(usage_error({"--decode-upload", "-1"}), "--decode-upload must be >= 0");
  EXPECT_EQ(usage_error({"--vram-budget", "1G", "--decode-upload", "-1"}), "--decode-upload must be >= 0");
  EXPECT_EQ(usage_error({"--decode-upload", "-1"}, cli::Tool::kBench), "--decode-upload must be >= 0");
  EXPECT_NE(usage_error({"--vram-budget", "1G", "--pcie-read", "x"}).find("--pcie-read"), std::string::npos);
  EXPECT_NE(usage_error({"--vram-budget", "1G", "--pcie-read-offset", "65"}).find("--pcie-read-offset"), std::string::npos);
}

// --heat: a FILE, none, or the model's default file under the cache.
TEST(HeatFlag, NamesTheFileNoneOrTheDefault) {
  coli::test::TempDir d;
  const CacheHome home(d.path());
  EXPECT_TRUE(run_flags({"--heat", "none"}).heat.none());
  EXPECT_EQ(run_flags({"--heat", "none"}).heat.path(0x1234), "");
  EXPECT_EQ(run_flags({"--heat", "h.txt"}).heat.path(0x1234), "h.txt");
  EXPECT_EQ(run_flags({}).heat.path(0x1234), d / "coli/heat-0000000000001234.txt");
  po::variables_map vm;
  vm.emplace("heat", po::variable_value(std::string("none"), false));
  EXPECT_THROW(cli::HeatFlag::from(vm, /*none_ok=*/false), coli::UsageError);
}

// A run's tier without a plan fills from the heat file's counts when it
// counted any token; without one (and without a mirror), evenly.
TEST(HeatFlag, TierStartsFromTheHeatFile) {
  Model m;
  const uint64_t fp = coli::Container(m.path).fingerprint();
  const coli::HeatRecorder from_file(m.heat, fp, m.spec);
  const std::vector<uint64_t> counts = cli::tier_start_heat(from_file, nullptr);
  ASSERT_EQ(counts.size(), std::size_t(m.spec.num_layers) * m.spec.num_experts);
  EXPECT_EQ(counts[0], 10u);
  EXPECT_EQ(counts[m.spec.num_experts - 1], uint64_t(m.spec.num_experts) * 10);
  EXPECT_TRUE(cli::tier_start_heat(coli::HeatRecorder("", fp, m.spec), nullptr).empty()) << "--heat none, no mirror";
  EXPECT_TRUE(cli::tier_start_heat(coli::HeatRecorder(m.dir / "new.txt", fp, m.spec), nullptr).empty()) << "a file not made yet";
}
