// coli-bench: llama-bench-style benchmarks whose records a shell pipeline
// can consume while the run goes on. Thin: flags in, libcore runner out.
#include <algorithm>
#include <boost/program_options.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <optional>

#include "bench/record_writer.h"
#include "bench/runner.h"
#include "cpu_backend.h"
#include "cpu_expert_host.h"
#include "cuda_backend.h"
#include "cuda_device.h"
#include "env_options.h"
#include "formats/container.h"
#include "mirror/mirror.h"
#include "mirror/mirror_load.h"
#include "model/model_spec.h"
#include "model/weights.h"
#include "placement/heat.h"
#include "placement/plan.h"
#include "util/error.h"
#include "util/parse.h"
#include "util/progress.h"
#include "util/tool_main.h"

namespace po = boost::program_options;

namespace {

const char* kUsage =
    "usage: coli-bench -m MODEL[,MODEL...] [-p N,...] [-n N,...] [-pg P,G ...] [-d N,...] [-r N]\n"
    "                  [-t N,...] [-b N,...] [-ub N,...] [-o tsv|csv|jsonl|md] [--seed S] [--prompt-file F]\n"
    "\n"
    "Runs prompt processing (pp), generation (tg), pp+tg and depth tests over the\n"
    "cartesian product of the comma-separated lists; one record per result is\n"
    "written and flushed as soon as it is measured (TSV with a header by default).\n"
    "A failing configuration becomes a record with an 'error' field; the exit\n"
    "status is then 1. Field names follow llama-bench where they mean the same.\n";

// llama-bench's single-dash flags -> our long names.
std::vector<std::string> translate(int argc, char** argv) {
  static const std::map<std::string, std::string> alias = {
      {"-m", "--model"}, {"-p", "--n-prompt"}, {"-n", "--n-gen"}, {"-pg", "--n-pg"}, {"-d", "--n-depth"}, {"-r", "--repetitions"},
      {"-t", "--threads"}, {"-b", "--batch-size"}, {"-ub", "--ubatch-size"}, {"-o", "--output"}, {"-h", "--help"}};
  std::vector<std::string> out;
  for (int i = 1; i < argc; ++i) {
    auto it = alias.find(argv[i]);
    out.push_back(it == alias.end() ? argv[i] : it->second);
  }
  return out;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> v;
  std::size_t i = 0;
  while (true) {
    const std::size_t j = s.find(',', i);
    v.push_back(s.substr(i, j == std::string::npos ? std::string::npos : j - i));
    if (j == std::string::npos) break;
    i = j + 1;
  }
  return v;
}

int run(int argc, char** argv) {
  po::options_description opts("options (llama-bench's short forms work too: -m -p -n -pg -d -r -t -b -ub -o)");
  opts.add_options()
      ("help", "show this help and exit")
      ("model", po::value<std::string>(), "model(s): checkpoint directories or containers, comma-separated")
      ("n-prompt", po::value<std::string>()->default_value("512"), "prompt lengths of pp tests (0: none)")
      ("n-gen", po::value<std::string>()->default_value("128"), "generation lengths of tg tests (0: none)")
      ("n-pg", po::value<std::vector<std::string>>()->composing(), "pp+tg test P,G (repeatable)")
      ("n-depth", po::value<std::string>()->default_value("0"), "context depths to prefill (untimed) before each test")
      ("repetitions", po::value<int>()->default_value(5), "timed repetitions per test")
      ("threads", po::value<std::string>()->default_value("0"), "CPU threads (0: all cores)")
      ("batch-size", po::value<std::string>()->default_value("2048"), "logical batch size (recorded)")
      ("ubatch-size", po::value<std::string>()->default_value("512"), "tokens per forward chunk")
      ("vram-budget", po::value<std::string>(), "GPU memory budgets (8G,12G,...): experts that do not fit run on the CPU at the same time")
      ("mirror", po::value<std::string>()->default_value("auto"), "weights from a coli-pin shared-memory mirror: auto (each model's, when ready), off, or a segment NAME")
      ("plan", po::value<std::string>(), "under a budget: the expert tier starts with this coli-place plan's VRAM experts (one -m)")
      ("decode-upload", po::value<int>()->default_value(0), "under a budget with a mirror: up to N of a decode layer's misses uploaded and run on the GPU (0: off)")
      ("pcie-read", po::value<std::string>()->default_value("auto"), "under a budget with a mirror: in decode steps the GPU reads round(SHARE x (misses + offset)) of a layer's misses over PCIe in place while the CPU computes the others (auto: 0.35 with a coli-pin mirror, else off; off or 0: off)")
      ("pcie-read-offset", po::value<double>()->default_value(2.0), "the CPU's fixed cost of a layer in experts, for --pcie-read's split")
      ("prefill-upload", po::bool_switch(), "under a budget: prompts upload the experts the tier lacks, a layer ahead, instead of computing them on the CPU")
      ("no-swap", po::bool_switch(), "under a budget: keep the experts the tier starts with (no background swaps; reproducible records)")
      ("output", po::value<std::string>()->default_value("tsv"), "record format: tsv, csv, jsonl, md")
      ("seed", po::value<uint64_t>()->default_value(0), "seed of the random token ids")
      ("prompt-file", po::value<std::string>(), "take token ids from this text (model's tokenizer) instead")
      ("no-warmup", po::bool_switch(), "skip the untimed warm-up run")
      ("device", po::value<std::string>()->default_value("auto"), "cuda, cpu or auto (the GPU when one is usable and the model fits)")
      ("reference", po::bool_switch(), "use the single-threaded scalar reference backend")
      ("heat", po::value<std::string>(), "routing heat file, merged into at exit ('none': off; default: "
                                          "$XDG_CACHE_HOME/coli/heat-FINGERPRINT.txt per model)")
      ("progress", po::bool_switch(), "log each test to stderr (default when stderr is a terminal)");
  po::variables_map vm;
  const auto args = translate(argc, argv);
  try {
    po::store(po::command_line_parser(args).options(opts).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw coli::UsageError(e.what());
  }
  if (vm.count("help")) {
    std::cout << kUsage << "\n" << opts << "\nfields: ";
    for (const auto& f : coli::bench_fields()) std::cout << f << " ";
    std::cout << std::endl;
    return 0;
  }
  if (!vm.count("model")) throw coli::UsageError("-m MODEL is required");
  coli::BenchOptions o;
  o.models = split(vm["model"].as<std::string>());
  for (const auto& m : o.models)
    if (m.empty()) throw coli::UsageError("-m: empty model name");
  o.n_prompt = coli::parse_int_list(vm["n-prompt"].as<std::string>(), "-p");
  o.n_gen = coli::parse_int_list(vm["n-gen"].as<std::string>(), "-n");
  if (vm.count("n-pg"))
    for (const auto& s : vm["n-pg"].as<std::vector<std::string>>()) {
      auto v = coli::parse_int_list(s, "-pg");
      if (v.size() != 2 || v[0] < 1 || v[1] < 1) throw coli::UsageError("-pg takes P,G with both > 0");
      o.prompt_gen.emplace_back(v[0], v[1]);
    }
  o.n_depth = coli::parse_int_list(vm["n-depth"].as<std::string>(), "-d");
  o.threads = coli::parse_int_list(vm["threads"].as<std::string>(), "-t");
  for (int t : o.threads) coli::check_thread_count(t, "-t");
  o.n_batch = coli::parse_int_list(vm["batch-size"].as<std::string>(), "-b");
  o.n_ubatch = coli::parse_int_list(vm["ubatch-size"].as<std::string>(), "-ub");
  if (vm.count("vram-budget")) {
    o.vram_budget.clear();
    for (const auto& item : split(vm["vram-budget"].as<std::string>())) {
      o.vram_budget.push_back(coli::parse_size(item, "--vram-budget"));
      if (!o.vram_budget.back()) throw coli::UsageError("--vram-budget values must be more than 0");
    }
  }
  for (int u : o.n_ubatch)
    if (u < 1) throw coli::UsageError("-ub values must be >= 1");
  const bool any_pp = std::any_of(o.n_prompt.begin(), o.n_prompt.end(), [](int p) { return p > 0; });
  const bool any_tg = std::any_of(o.n_gen.begin(), o.n_gen.end(), [](int n) { return n > 0; });
  if (!any_pp && !any_tg && o.prompt_gen.empty()) throw coli::UsageError("nothing to run: every -p and -n is 0 and there is no -pg");
  o.repetitions = vm["repetitions"].as<int>();
  if (o.repetitions < 1) throw coli::UsageError("-r must be >= 1");
  o.seed = vm["seed"].as<uint64_t>();
  o.warmup = !vm["no-warmup"].as<bool>();
  if (vm.count("prompt-file")) o.prompt_file = vm["prompt-file"].as<std::string>();
  // Routing heat (--heat): every token counted, merged into each model's file.
  const std::string heat_flag = vm.count("heat") ? vm["heat"].as<std::string>() : "";
  if (vm.count("heat") && heat_flag.empty()) throw coli::UsageError("--heat needs a FILE or 'none'");
  if (heat_flag != "none" && !heat_flag.empty() && o.models.size() > 1) throw coli::UsageError("--heat FILE holds one model's heat: give one -m, or no --heat");
  if (heat_flag != "none")
    o.heat_path = [heat_flag](uint64_t fp) { return coli::heat_path_for(heat_flag, fp, std::getenv("XDG_CACHE_HOME"), std::getenv("HOME")); };
  coli::RecordFormat fmt;
  if (!coli::parse_record_format(vm["output"].as<std::string>(), &fmt)) throw coli::UsageError("-o: one of tsv, csv, jsonl, md");
  coli::RecordWriter writer(fmt, stdout);
  const bool log = vm["progress"].as<bool>() || coli::stderr_is_tty();
  const bool fast = !vm["reference"].as<bool>();
  const std::string device = fast ? vm["device"].as<std::string>() : "cpu";
  if (device != "cpu" && device != "cuda" && device != "auto") throw coli::UsageError("--device must be cuda, cpu or auto, not '" + device + "'");
  coli::cuda::CudaOptions co = coli::apply_environment();  // COLI_* variables (env_options.h); flags set below win
  co.max_chunk = *std::max_element(o.n_ubatch.begin(), o.n_ubatch.end());
  co.swap = !vm["no-swap"].as<bool>();
  co.decode_upload_max = vm["decode-upload"].as<int>();
  if (co.decode_upload_max < 0) throw coli::UsageError("--decode-upload must be >= 0");
  const double pcie_read = coli::parse_pcie_read(vm["pcie-read"].as<std::string>(), "--pcie-read");  // -1: auto, per model below
  co.pcie_read_offset = coli::check_pcie_read_offset(vm["pcie-read-offset"].as<double>(), "--pcie-read-offset");
  co.prefill_upload = vm["prefill-upload"].as<bool>();
  // A plan (coli-place) names the tier's first experts; it must be the model's.
  std::optional<coli::Plan> plan;
  if (vm.count("plan")) {
    if (o.models.size() != 1) throw coli::UsageError("--plan places one model's experts: give one -m");
    if (!vm.count("vram-budget")) throw coli::UsageError("--plan places experts in a VRAM tier: give --vram-budget");
    const std::string file = coli::container_file_of(o.models[0]);
    const coli::Container pc(file.empty() ? o.models[0] : file);
    const coli::ModelSpec ps = coli::parse_model_spec(pc.config_json(), o.models[0]);
    plan = coli::load_plan(vm["plan"].as<std::string>(), pc.fingerprint(), ps.num_layers, ps.num_experts);
  }
  o.mirror = vm["mirror"].as<std::string>();
  coli::check_mirror_flag(o.mirror);
  // Under a budget the KV cache is made for the longest test at once.
  for (int d : o.n_depth) {
    for (int p : o.n_prompt) co.n_ctx = std::max(co.n_ctx, d + p + 1);
    for (int n : o.n_gen) co.n_ctx = std::max(co.n_ctx, d + n + 1);
    for (auto [p, n] : o.prompt_gen) co.n_ctx = std::max(co.n_ctx, d + p + n + 1);
  }
  const int failures = coli::run_bench(
      o,
      [&](const coli::Model& m, const coli::MirrorAttachment* mirror, int threads, uint64_t vram_budget) -> std::unique_ptr<coli::Backend> {
        std::string why;
        coli::cuda::CudaOptions c = co;
        c.vram_budget = vram_budget;
        if (plan) c.heat = coli::plan_as_heat(*plan);
        // auto: with a mirror, unless --decode-upload takes the misses.
        c.pcie_read_share = coli::pcie_read_share(pcie_read, mirror != nullptr, c.decode_upload_max > 0);
        if (mirror) {
          c.host_regions.push_back({mirror->base(), mirror->size()});  // registered when an option needs it
          // coli-pin start --gpu: the keeper's device copy, read in place
          // (whole runs only for now: a tier filled from it has not passed its GPU test).
          const uint8_t* data = nullptr;
          if (!vram_budget && mirror->twin(&data, &c.twin.bytes, &c.twin.device, c.twin.handle)) c.twin.host = data;
        }
        // The CPU's expert threads: -t when given, else all cores but one (CpuExpertHost).
        if (vram_budget && device != "cpu" && coli::cuda::device_count() > 0) c.expert_host = std::make_shared<coli::cpu::CpuExpertHost>(m, threads);
        if (auto b = coli::cuda::make_device_backend(device, m, c, &why)) return b;
        return std::make_unique<coli::cpu::CpuBackend>(m, coli::cpu::CpuOptions{threads, fast});
      },
      writer, log ? stderr : nullptr);
  if (failures) std::fprintf(stderr, "coli-bench: %d record(s) failed\n", failures);
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) { return coli::tool_main("coli-bench", [&] { return run(argc, argv); }); }
