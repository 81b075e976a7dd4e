#include "common/run_flags.h"

#include <array>

#include "mirror/mirror_load.h"
#include "util/error.h"
#include "util/parse.h"

namespace po = boost::program_options;

namespace coli::cli {

namespace {

// A flag's help line in each tool's wording, by Tool (kRun, kBench, kPlace,
// kCalibrate, kPin); null: coli-run's.
using Wordings = std::array<const char*, 5>;

Wordings wordings(Flag f) {
  switch (f) {
    case Flag::kVramBudget:
      return {"GPU memory coli may use (8G, 12000M, ...; default auto: the device's free memory less --vram-margin when the whole model does not "
              "fit): the experts that do not fit run on the CPU at the same time",
              "GPU memory budgets (8G,12G,auto,...; default auto, as coli-run): experts that do not fit run on the CPU at the same time"};
    case Flag::kVramMargin:
      return {"with an auto --vram-budget: GPU memory left free for what the budget does not count (default 256M)"};
    case Flag::kMirror:
      return {"weights from a coli-pin shared-memory mirror: auto (the model's, when ready), off, or a segment NAME",
              "weights from a coli-pin shared-memory mirror: auto (each model's, when ready), off, or a segment NAME"};
    case Flag::kPlan:
      return {"FILE|auto: a coli-place plan (man coli-plan): its VRAM and RAM experts are read into memory ahead of use; "
              "under a budget the tier starts with its VRAM experts and its prefill chunk is the default "
              "(auto, the default: planned at the start from the budget, the routing heat and this machine's rates)",
              "FILE|auto: under a budget the expert tier starts with this coli-place plan's VRAM experts (one -m; auto, the default: planned at the "
              "start, as coli-run does)"};
    case Flag::kDecodeUpload:
      return {"under a budget, with pinned weights: up to N of a decode layer's misses are uploaded and run on the GPU while the CPU runs the rest (0: off)",
              "under a budget with a mirror: up to N of a decode layer's misses uploaded and run on the GPU (0: off)"};
    case Flag::kPcieRead:
      return {"under a budget, with pinned weights: in decode steps the GPU reads round(SHARE x (misses + offset)) of a layer's misses over PCIe in "
              "place while the CPU computes the others (auto: 0.35 with a coli-pin mirror or the container registered, else off; off or 0: off)",
              "under a budget, with pinned weights: in decode steps the GPU reads round(SHARE x (misses + offset)) of a layer's misses over PCIe in "
              "place while the CPU computes the others (auto: 0.35 with a coli-pin mirror or the container registered, else off; off or 0: off)",
              "the runs' --pcie-read: the GPU reads that share of a decode layer's RAM misses over PCIe (auto: 0.35, as coli-run with a coli-pin mirror; off)"};
    case Flag::kPcieReadOffset:
      return {"the CPU's fixed cost of a layer in experts, for --pcie-read's split", nullptr, "the runs' --pcie-read-offset"};
    case Flag::kPrefillUpload:
      return {"under a budget: prompts upload the experts the tier lacks, a layer ahead, instead of computing them on the CPU (the default "
              "when the weights are pinned; this flag asks for it from pageable memory too)",
              "under a budget: prompts upload the experts the tier lacks, a layer ahead (the default when the weights are pinned; this flag: always)",
              "the runs will use --prefill-upload: its staging areas come out of the experts' VRAM"};
    case Flag::kPrefillCpu:
      return {"under a budget, when prompts upload: how many of a layer's missing experts the CPU computes instead of uploading them, at the same "
              "time (auto, the default: as many as balance the CPU's time against the uploads', from this machine's rates and the CPU's measured "
              "time; off or 0: none; N: N per layer)"};
    case Flag::kNoSwap:
      return {"under a budget: keep the experts the tier starts with (no background swaps; reproducible speed)",
              "under a budget: keep the experts the tier starts with (no background swaps; reproducible records)"};
    case Flag::kDevice: return {"cuda, cpu or auto (the GPU when one is usable and the model fits)"};
    case Flag::kThreads: return {"CPU threads (0: all cores)"};
    case Flag::kReference: return {"use the single-threaded scalar reference backend"};
    case Flag::kHeat:
      return {"routing heat file, read at start and merged into at exit ('none': off; default: $XDG_CACHE_HOME/coli/heat-FINGERPRINT.txt)",
              "routing heat file, merged into at exit ('none': off; default: $XDG_CACHE_HOME/coli/heat-FINGERPRINT.txt per model)",
              "routing heat file ('none': even routing; default: the model's heat file and a ready mirror's counters)",
              "heat file to merge into (default: the model's, as coli-run keeps it)",
              "routing heat that orders the experts under --budget ('none': container order; default: "
              "$XDG_CACHE_HOME/coli/heat-FINGERPRINT.txt when it exists)"};
  }
  return {};
}

const char* help_of(Flag f, Tool t) {
  const Wordings w = wordings(f);
  return w[std::size_t(t)] ? w[std::size_t(t)] : w[0];
}

void add_flag(po::options_description& o, Tool t, Flag f) {
  auto add = o.add_options();
  const char* help = help_of(f, t);
  switch (f) {
    case Flag::kVramBudget: add("vram-budget", po::value<std::string>(), help); break;
    case Flag::kVramMargin: add("vram-margin", po::value<std::string>(), help); break;
    case Flag::kMirror: add("mirror", po::value<std::string>()->default_value("auto"), help); break;
    case Flag::kPlan: add("plan", po::value<std::string>(), help); break;
    case Flag::kDecodeUpload: add("decode-upload", po::value<int>()->default_value(0), help); break;
    case Flag::kPcieRead: add("pcie-read", po::value<std::string>()->default_value("auto"), help); break;
    case Flag::kPcieReadOffset: add("pcie-read-offset", po::value<double>()->default_value(2.0), help); break;
    case Flag::kPrefillUpload: add("prefill-upload", po::bool_switch(), help); break;
    case Flag::kPrefillCpu: add("prefill-cpu", po::value<std::string>()->default_value("auto"), help); break;
    case Flag::kNoSwap: add("no-swap", po::bool_switch(), help); break;
    case Flag::kDevice: add("device", po::value<std::string>()->default_value("auto"), help); break;
    case Flag::kThreads: add("threads,t", po::value<int>()->default_value(0), help); break;
    case Flag::kReference: add("reference", po::bool_switch(), help); break;
    case Flag::kHeat: add("heat", po::value<std::string>(), help); break;
  }
}

// coli-run's one budget, coli-bench's comma-separated list; auto: kBudgetAuto.
std::vector<uint64_t> vram_budgets(const po::variables_map& vm, Tool t) {
  if (!vm.count("vram-budget")) return {kBudgetAuto};
  const std::string s = vm["vram-budget"].as<std::string>();
  auto one = [](const std::string& v, const char* zero) {
    if (v == "auto") return kBudgetAuto;
    const uint64_t b = parse_size(v, "--vram-budget");
    if (b == 0) throw UsageError(zero);
    return b;
  };
  if (t != Tool::kBench) return {one(s, "--vram-budget must be more than 0")};
  std::vector<uint64_t> v;
  for (std::size_t i = 0;;) {
    const std::size_t j = s.find(',', i);
    v.push_back(one(s.substr(i, j == std::string::npos ? std::string::npos : j - i), "--vram-budget values must be more than 0"));
    if (j == std::string::npos) return v;
    i = j + 1;
  }
}

}  // namespace

void add_flags(po::options_description& opts, Tool tool, std::initializer_list<Flag> flags) {
  for (Flag f : flags) add_flag(opts, tool, f);
}

std::string device_of(const po::variables_map& vm) {
  if (vm.count("reference") && vm["reference"].as<bool>()) return "cpu";
  const std::string d = vm["device"].as<std::string>();
  if (d != "cpu" && d != "cuda" && d != "auto") throw UsageError("--device must be cuda, cpu or auto, not '" + d + "'");
  return d;
}

TierFlags read_tier_flags(const po::variables_map& vm) {
  TierFlags t;
  t.swap = !vm["no-swap"].as<bool>();
  t.decode_upload = vm["decode-upload"].as<int>();
  if (t.decode_upload < 0) throw UsageError("--decode-upload must be >= 0");
  t.pcie_read = parse_pcie_read(vm["pcie-read"].as<std::string>(), "--pcie-read");
  t.pcie_read_offset = check_pcie_read_offset(vm["pcie-read-offset"].as<double>(), "--pcie-read-offset");
  t.prefill_upload = vm["prefill-upload"].as<bool>();
  t.prefill_cpu = parse_prefill_cpu(vm["prefill-cpu"].as<std::string>(), "--prefill-cpu");
  return t;
}

RunFlags read_run_flags(const po::variables_map& vm, Tool tool) {
  RunFlags f;
  f.vram_budgets = vram_budgets(vm, tool);
  if (vm.count("vram-margin")) f.vram_margin = parse_size(vm["vram-margin"].as<std::string>(), "--vram-margin");
  f.tier = read_tier_flags(vm);
  f.device = device_of(vm);
  f.heat = HeatFlag::from(vm);
  f.mirror = vm["mirror"].as<std::string>();
  check_mirror_flag(f.mirror);
  if (vm.count("plan")) f.plan = vm["plan"].as<std::string>();
  return f;
}

}  // namespace coli::cli
