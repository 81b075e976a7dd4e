// coli-place: routing heat, the machine's rates, and the residency plan
// (which experts live in VRAM, in the coli-pin mirror, on disk). Thin: the
// planner and its cost model are libcore/placement (planner.h), the plan
// file plan.h, the rates file machine_rates.h, the host probe libcpu, the
// planner's inputs from the flags tools/common/run_plan.h (coli-run --plan
// auto takes them from there too).
#include <boost/program_options.hpp>
#include <utf8proc.h>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "common/heat_flag.h"
#include "common/run_flags.h"
#include "common/run_options.h"
#include "common/run_plan.h"
#include "copy_probe.h"
#include "cpu_backend.h"
#include "cuda_backend.h"
#include "cuda_device.h"
#include "engine/engine.h"
#include "formats/container.h"
#include "host_probe.h"
#include "model/model_spec.h"
#include "model/weights.h"
#include "parse_options.h"
#include "placement/heat.h"
#include "placement/heat_recorder.h"
#include "placement/machine_rates.h"
#include "placement/plan.h"
#include "placement/plan_inputs.h"
#include "placement/planner.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/io.h"
#include "util/parse.h"
#include "util/progress.h"
#include "util/tool_main.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace {

const char* kUsage =
    "usage: coli-place [plan] -m MODEL --vram SIZE [--ram SIZE] [--heat FILE|none] [--rates FILE] [-o PLAN] [--explain]\n"
    "       coli-place explain -m MODEL --plan PLAN [--heat FILE|none] [--rates FILE]\n"
    "       coli-place heat [-m MODEL] [FILE...] [--merge OUT]\n"
    "       coli-place calibrate -m MODEL --prompts FILE [--heat FILE]\n"
    "       coli-place probe [-m MODEL] [-o FILE]\n"
    "\n"
    "Decides which routed experts of a coli container live in VRAM (the expert\n"
    "tier of coli-run --vram-budget), which in RAM (the coli-pin mirror) and\n"
    "which stay on disk, from the routing heat and the machine's measured rates,\n"
    "and predicts the speed of the result. The plan file is man coli-plan(5).\n";

// MemAvailable of /proc/meminfo in bytes (0 when unknown).
uint64_t available_ram() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  unsigned long long kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
  std::fclose(f);
  return uint64_t(kb) * 1024;
}

// The rates cache of this machine: $XDG_CACHE_HOME/coli/rates-HOST[-FORMAT].txt.
std::string default_rates_path(const std::string& format = "") {
  return coli::default_rates_path(std::getenv("XDG_CACHE_HOME"), std::getenv("HOME"), coli::cli::host_name(), format);
}

void print_needs(const coli::DeviceNeeds& d, uint64_t budget, uint64_t for_experts) {
  const uint64_t staging = budget > d.total() + for_experts ? budget - d.total() - for_experts : 0;
  std::printf("VRAM: budget %.0f MiB = trunk %.0f + KV cache %.0f + recurrent state %.0f + activations %.0f + scratch %.0f + experts %.0f MiB",
              budget / 1048576.0, d.trunk / 1048576.0, d.kv / 1048576.0, d.state / 1048576.0, d.activations / 1048576.0, d.fixed / 1048576.0,
              for_experts / 1048576.0);
  std::printf(staging >= (1u << 20) ? " + prefill staging and rounding %.0f MiB\n" : "\n", staging / 1048576.0);
  if (budget < d.total()) std::printf("VRAM: the budget is %.0f MiB short of the trunk and the run's buffers: coli-run would refuse it\n", (d.total() - budget) / 1048576.0);
}

void print_prediction(const coli::PlannerInputs& in, const coli::Plan& p, const coli::Prediction& r) {
  std::printf("experts: %lld in VRAM, %lld in RAM, %lld on disk (of %d x %d, %.2f MB each)\n", (long long)p.count(coli::Tier::kVram),
              (long long)p.count(coli::Tier::kRam), (long long)p.count(coli::Tier::kDisk), in.layers, in.experts, in.expert_bytes / 1e6);
  std::printf("hit rate: %.3f of the routed pairs on the GPU\n", r.hit_rate);
  if (in.pcie_read_share > 0)
    std::printf("PCIe reads: %.3f of the routed pairs read by the GPU from RAM (--pcie-read %.2f, offset %.1f)\n", r.pcie_read_pairs, in.pcie_read_share,
                in.pcie_read_offset);
  std::printf("per token: %.1f MB read from VRAM, %.1f MB from RAM, %.1f MB from disk\n", r.vram_bytes_per_token / 1e6, r.ram_bytes_per_token / 1e6,
              r.disk_bytes_per_token / 1e6);
  std::printf("decode: %.1f tok/s predicted; bound by %s (%d layers GPU-bound, %d CPU-bound)\n", r.decode_tok_s, r.decode_bound.c_str(),
              r.gpu_bound_layers, r.cpu_bound_layers);
  std::printf("prefill (--prefill-upload): %.0f tok/s predicted at chunks of %d tokens; bound by %s\n", r.prefill_tok_s, r.prefill_chunk,
              r.prefill_bound.c_str());
  const coli::MachineRates& m = in.rates;
  std::printf("rates: host experts %.1f GB/s, disk %.1f GB/s, PCIe %.1f GB/s (GPU reading RAM in place %.1f GB/s), GPU layer %.1f us + %.1f us per expert, handoff %.1f us\n",
              m.host_expert_gbs, m.disk_gbs, m.pcie_gbs, m.pcie_read_gbs, m.gpu_layer_s * 1e6, m.gpu_expert_s * 1e6, m.handoff_s * 1e6);
}

struct Loaded {
  std::unique_ptr<coli::Container> c;
  coli::ModelSpec spec;
};

// --model as a container file: a directory stands for its model.coli (a
// path that is neither stays as given: the container's own error names it).
std::string container_path(const std::string& model) {
  const std::string file = coli::container_file_of(model);
  return file.empty() ? model : file;
}

Loaded load(const std::string& model) {
  Loaded l;
  const std::string file = container_path(model);
  l.c = std::make_unique<coli::Container>(file);
  l.spec = coli::parse_model_spec(l.c->config_json(), file);
  if (l.spec.num_experts < 1) throw coli::Error(file + ": the model has no routed experts to place");
  return l;
}

// plan's and explain's: the model, and the planner's inputs besides the budgets.
void common_options(po::options_description& o) {
  namespace cli = coli::cli;
  o.add_options()("help,h", "show this help")("model,m", po::value<std::string>(), "coli container (or a directory holding model.coli)");
  cli::add_flags(o, cli::Tool::kPlace, {cli::Flag::kHeat});
  o.add_options()("rates", po::value<std::string>(), "rates file (coli-place probe; default: this machine's cached probe)")
      ("ctx", po::value<int>()->default_value(4096), "context tokens the KV cache is planned for")
      ("ubatch", po::value<int>()->default_value(512), "prefill chunk the activations are planned for")
      ("chunks", po::value<std::string>()->default_value("512,1024,2048,4096"), "prefill chunk sizes the plan picks from, those up to --ubatch (whose activations the VRAM is planned for)");
  cli::add_flags(o, cli::Tool::kPlace, {cli::Flag::kPrefillUpload, cli::Flag::kPcieRead, cli::Flag::kPcieReadOffset});
}

// -o writes into an existing directory (plan and probe alike), checked
// before any work or note: a missing one is an error naming it, not made.
void check_output_dir(const std::string& out) {
  const fs::path dir = fs::path(out).parent_path();
  std::error_code ec;
  if (!dir.empty() && !fs::is_directory(dir, ec)) throw coli::Error(out + ": " + dir.string() + " is not a directory (-o writes into an existing one)");
}

// --chunks: the prefill chunk sizes the plan picks from.
std::vector<int> chunk_sizes(const po::variables_map& vm) {
  std::vector<int> v = coli::parse_int_list(vm["chunks"].as<std::string>(), "--chunks");
  for (int c : v)
    if (c < 1 || c > (1 << 20)) throw coli::UsageError("--chunks: " + std::to_string(c) + " is not a chunk size (1 .. 1048576 tokens)");
  return v;
}

// The planner's inputs as coli-run --plan auto takes them too
// (tools/common/run_plan.h), from these flags and budgets.
coli::PlannerInputs inputs(const po::variables_map& vm, const Loaded& l, uint64_t vram, uint64_t ram) {
  if (vm["ctx"].as<int>() < 1) throw coli::UsageError("--ctx must be at least 1");
  if (vm["ubatch"].as<int>() < 1) throw coli::UsageError("--ubatch must be at least 1");
  coli::cli::PlanRequest r;
  r.vram_budget = vram, r.ram_budget = ram;
  r.ctx = vm["ctx"].as<int>(), r.chunk = vm["ubatch"].as<int>(), r.chunks = chunk_sizes(vm);
  r.prefill_upload = vm["prefill-upload"].as<bool>();
  r.pcie_read = coli::parse_pcie_read(vm["pcie-read"].as<std::string>(), "--pcie-read");
  r.pcie_read_offset = coli::check_pcie_read_offset(vm["pcie-read-offset"].as<double>(), "--pcie-read-offset");
  r.heat = coli::cli::HeatFlag::from(vm);
  if (vm.count("rates")) r.rates_file = vm["rates"].as<std::string>();
  std::string rates_from;
  coli::PlannerInputs in = coli::cli::plan_inputs(*l.c, l.spec, r, &rates_from);
  // The planner's defaults are said: predictions then are rough.
  if (rates_from.empty()) std::fprintf(stderr, "coli-place: no measured rates (run coli-place probe, or --rates FILE): predicting with defaults\n");
  return in;
}

int cmd_plan(int argc, char** argv) {
  po::options_description opts("plan options");
  common_options(opts);
  opts.add_options()("vram", po::value<std::string>(), "GPU memory budget, as coli-run --vram-budget (e.g. 8G)")
      ("ram", po::value<std::string>(), "RAM for experts (held by coli-pin start --plan, or a warm page cache; default: MemAvailable less 4 GiB); the rest are read from disk")
      ("output,o", po::value<std::string>(), "write the plan here (default: standard output)")
      ("explain", po::bool_switch(), "print the predictions on stdout instead of the plan (write the plan with -o)");
  auto vm = coli::parse_options(argc, argv, opts, {});
  if (vm.count("help")) {
    std::cout << kUsage << "\n" << opts << std::endl;
    return 0;
  }
  if (!vm.count("model")) throw coli::UsageError("--model is required");
  if (!vm.count("vram")) throw coli::UsageError("--vram is required (the GPU memory budget)");
  const uint64_t vram = coli::parse_size(vm["vram"].as<std::string>(), "--vram");
  const uint64_t avail = available_ram(), margin = uint64_t(4) << 30;
  const uint64_t ram = vm.count("ram") ? coli::parse_size(vm["ram"].as<std::string>(), "--ram") : avail > margin ? avail - margin : 0;
  if (vm.count("output")) check_output_dir(vm["output"].as<std::string>());
  const Loaded l = load(vm["model"].as<std::string>());
  const coli::PlannerInputs in = inputs(vm, l, vram, ram);
  coli::Prediction r;
  const coli::Plan p = coli::plan_placement(in, &r);
  if (vm.count("output")) coli::save_plan(vm["output"].as<std::string>(), p);
  else if (!vm["explain"].as<bool>()) std::fwrite(coli::format_plan(p).data(), 1, coli::format_plan(p).size(), stdout);
  if (vm["explain"].as<bool>()) {
    print_needs(coli::device_needs(*l.c, l.spec, vm["ctx"].as<int>(), vm["ubatch"].as<int>()), vram, in.vram_bytes);
    print_prediction(in, p, r);
  }
  return 0;
}

int cmd_explain(int argc, char** argv) {
  po::options_description opts("explain options");
  common_options(opts);
  opts.add_options()("plan", po::value<std::string>(), "the plan file to explain");
  auto vm = coli::parse_options(argc, argv, opts, {});
  if (vm.count("help")) {
    std::cout << kUsage << "\n" << opts << std::endl;
    return 0;
  }
  if (!vm.count("model") || !vm.count("plan")) throw coli::UsageError("--model and --plan are required");
  const Loaded l = load(vm["model"].as<std::string>());
  const coli::Plan p = coli::load_plan(vm["plan"].as<std::string>(), l.c->fingerprint(), l.spec.num_layers, l.spec.num_experts);
  const coli::PlannerInputs in = inputs(vm, l, p.vram_budget, p.ram_budget);
  print_prediction(in, p, coli::predict(in, p));
  return 0;
}

int cmd_heat(int argc, char** argv) {
  po::options_description opts("heat options");
  opts.add_options()("help,h", "show this help")("model,m", po::value<std::string>(), "the model: its heat file and a ready mirror's counters")
      ("files", po::value<std::vector<std::string>>()->multitoken(), "heat files")
      ("merge", po::value<std::string>(), "also write the merged heat to this file (no decay between the files)");
  po::positional_options_description pos;
  pos.add("files", -1);
  auto vm = coli::parse_options(argc, argv, opts, pos);
  if (vm.count("help")) {
    std::cout << kUsage << "\n" << opts << "\nPrints TSV: layer, expert, count, share (count / tokens: the chance a token routes there).\n";
    return 0;
  }
  std::vector<std::string> files = vm.count("files") ? vm["files"].as<std::vector<std::string>>() : std::vector<std::string>{};
  coli::Heat merged;
  uint64_t fingerprint = 0;
  bool any = false;
  auto add = [&](const coli::Heat& h, uint64_t fp, const std::string& what) {
    if (!any) merged = coli::Heat(h.layers(), h.experts()), fingerprint = fp, any = true;
    if (h.layers() != merged.layers() || h.experts() != merged.experts() || fp != fingerprint)
      throw coli::Error(what + ": the heat of another model (fingerprint or shape) than the first");
    merged.merge(h, 0);
  };
  if (vm.count("model")) {
    const Loaded l = load(vm["model"].as<std::string>());
    add(coli::cli::planning_heat(coli::cli::HeatFlag{}, *l.c, l.spec), l.c->fingerprint(), vm["model"].as<std::string>());
  }
  for (const std::string& f : files) {
    const coli::HeatFile hf = coli::read_heat_file(f);
    add(hf.heat, hf.fingerprint, f);
  }
  if (!any) throw coli::UsageError("nothing to read: give heat FILEs or -m MODEL");
  std::printf("layer\texpert\tcount\tshare\n");
  for (int l = 0; l < merged.layers(); ++l)
    for (int e = 0; e < merged.experts(); ++e)
      std::printf("%d\t%d\t%llu\t%.6f\n", l, e, (unsigned long long)merged.count(l, e), merged.tokens() ? double(merged.count(l, e)) / merged.tokens() : 0.0);
  if (vm.count("merge")) coli::save_heat(vm["merge"].as<std::string>(), merged, fingerprint);
  return 0;
}

// The prompts of a file, one per non-empty line.
std::vector<std::string> read_prompts(const std::string& path) {
  std::vector<std::string> prompts;
  const std::string text = coli::read_text_file(path);
  // Prompts are text: random bytes would merge junk routing into the heat.
  for (std::size_t at = 0; at < text.size();) {
    utf8proc_int32_t cp = 0;
    const utf8proc_ssize_t n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data()) + at, utf8proc_ssize_t(text.size() - at), &cp);
    if (n <= 0 || cp == 0) throw coli::Error(path + ": not UTF-8 text (byte " + std::to_string(at) + "): give prompts, one per line");
    at += std::size_t(n);
  }
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t nl = std::min(text.find('\n', at), text.size());
    if (nl > at) prompts.push_back(text.substr(at, nl - at));
    at = nl + 1;
  }
  if (prompts.empty()) throw coli::Error(path + ": no prompt (one per line)");
  return prompts;
}

// Each prompt (its first max_tokens tokens) forwarded once, the engine
// counting the routing; returns the tokens run.
uint64_t run_prompts(coli::Engine& engine, const coli::Tokenizer& tok, const std::vector<std::string>& prompts, int max_tokens, int vocab) {
  coli::Progress bar("calibrate", prompts.size(), coli::stderr_is_tty());
  uint64_t tokens = 0;
  for (const std::string& p : prompts) {
    std::vector<int> ids = tok.encode(p);
    if (ids.size() > std::size_t(max_tokens)) ids.resize(max_tokens);
    for (int id : ids)
      if (id < 0 || id >= vocab)
        throw coli::Error("the tokenizer gives id " + std::to_string(id) + ", outside the model's vocabulary of " + std::to_string(vocab) +
                          ": not this model's tokenizer");
    if (!ids.empty()) {
      coli::Session s = engine.new_session();
      engine.forward(s, ids);
      tokens += ids.size();
    }
    bar.add(1);
  }
  bar.finish();
  return tokens;
}

// Runs a prompt file through the model (one prompt per line) and merges the routing it measured into the model's
// heat file: the heat a plan is made from, without waiting for real use.
int cmd_calibrate(int argc, char** argv) {
  namespace cli = coli::cli;
  po::options_description opts("calibrate options");
  opts.add_options()("help,h", "show this help")("model,m", po::value<std::string>(), "coli container (or a directory holding model.coli)")
      ("prompts", po::value<std::string>(), "text file of prompts, one per line")
      ("tokenizer", po::value<std::string>(), "tokenizer.json or its directory (default: the one the container embeds)");
  cli::add_flags(opts, cli::Tool::kCalibrate, {cli::Flag::kHeat, cli::Flag::kDevice, cli::Flag::kThreads});
  opts.add_options()("max-tokens", po::value<int>()->default_value(4096), "tokens of each prompt at most (longer ones are cut)");
  auto vm = coli::parse_options(argc, argv, opts, {});
  if (vm.count("help")) {
    std::cout << kUsage << "\n" << opts << std::endl;
    return 0;
  }
  if (!vm.count("model") || !vm.count("prompts")) throw coli::UsageError("--model and --prompts are required");
  if (vm["threads"].as<int>() < 0) throw coli::UsageError("-t/--threads must be 0 (all cores) or more");
  const int max_tokens = vm["max-tokens"].as<int>();
  if (max_tokens < 1) throw coli::UsageError("--max-tokens must be at least 1");
  const std::string device = cli::device_of(vm);
  const cli::HeatFlag heat_flag = cli::HeatFlag::from(vm, /*none_ok=*/false);
  const std::string file = container_path(vm["model"].as<std::string>());
  const std::vector<std::string> prompts = read_prompts(vm["prompts"].as<std::string>());
  auto model = coli::Model::load(file);
  auto tok = coli::Tokenizer::load(vm.count("tokenizer") ? vm["tokenizer"].as<std::string>() : file);
  const coli::ModelSpec& spec = model->spec();
  const uint64_t fp = coli::Container(file).fingerprint();
  const std::string heat_path = heat_flag.path(fp);
  if (heat_path.empty()) throw coli::UsageError("no heat file: give --heat FILE (neither XDG_CACHE_HOME nor HOME is set)");
  coli::HeatRecorder heat(heat_path, fp, spec);
  std::string why;
  const auto backend = cli::make_backend(device, *model, coli::cuda::CudaOptions{}, coli::cpu::CpuOptions{vm["threads"].as<int>(), true}, &why);
  coli::Engine engine(spec, *backend, 512);
  engine.set_heat(heat.run());
  const uint64_t tokens = run_prompts(engine, *tok, prompts, max_tokens, spec.vocab_size);
  engine.collect_heat();
  heat.save();
  std::fprintf(stderr, "coli-place: %zu prompts, %llu tokens on %s: routing merged into %s\n", prompts.size(), (unsigned long long)tokens,
               backend->name().c_str(), heat_path.c_str());
  return 0;
}

int cmd_probe(int argc, char** argv) {
  po::options_description opts("probe options");
  opts.add_options()("help,h", "show this help")("model,m", po::value<std::string>(), "measure the CPU's expert kernels on this model")
      ("output,o", po::value<std::string>(), "write the rates here (default: this machine's cache, which plan and explain read)")
      ("threads,t", po::value<int>()->default_value(0), "CPU threads (0: every core but one, as coli-run)")
      ("seconds", po::value<double>()->default_value(1.0), "time per measurement");
  auto vm = coli::parse_options(argc, argv, opts, {});
  if (vm.count("help")) {
    std::cout << kUsage << "\n" << opts << std::endl;
    return 0;
  }
  const int threads = vm["threads"].as<int>();
  if (threads < 0) throw coli::UsageError("-t/--threads must be 0 (every core but one) or more");
  const double secs = vm["seconds"].as<double>();
  if (!(secs > 0) || secs > 600) throw coli::UsageError("--seconds must be in (0, 600]");
  // What the file there says already (the GPU's times a user edited) stays;
  // the measured rates replace theirs.
  // A model's probe is cached per its experts' format (the CPU's rate depends on it).
  std::string format, model_file;
  if (vm.count("model")) {
    model_file = container_path(vm["model"].as<std::string>());
    format = coli::expert_format_name(coli::Container(model_file));
  }
  const std::string out = vm.count("output") ? vm["output"].as<std::string>() : default_rates_path(format);
  // Checked before the measurement; only the default cache directory is made.
  if (vm.count("output")) check_output_dir(out);
  coli::MachineRates r = coli::cached_rates(out);
  std::string note = "measured:";
  const double read = coli::cpu::measure_read_gbs(std::size_t(1) << 30, threads, secs);
  std::fprintf(stderr, "coli-place: host memory read %.1f GB/s\n", read);
  note += " host read " + std::to_string(read).substr(0, 6) + " GB/s";
  r.host_expert_gbs = 0.7 * read;  // without a model: the kernels' share of a plain read measured on the GPU machine (60 of 86 GB/s)
  if (vm.count("model")) {
    auto model = coli::Model::load(model_file);
    r.host_expert_gbs = coli::cpu::measure_expert_gbs(*model, threads, secs);
    std::fprintf(stderr, "coli-place: CPU expert kernels %.1f GB/s (%s, %s)\n", r.host_expert_gbs, model_file.c_str(), format.c_str());
    note += ", CPU experts (" + format + ") on " + fs::path(model_file).filename().string();
  }
  if (coli::cuda::device_count() > 0) {
    r.pcie_gbs = coli::cuda::measure_h2d(coli::cuda::HostMemory::kPinned, nullptr, std::size_t(256) << 20, 5).gb_per_s;
    std::fprintf(stderr, "coli-place: pinned host -> GPU %.1f GB/s\n", r.pcie_gbs);
    note += ", pinned H2D";
  }
  note += "; GPU times: not probed (the planner's defaults are the H200 machine's; edit them for another GPU)";
  if (out.empty()) {
    const std::string text = coli::format_rates(r, note);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  std::error_code ec;
  fs::create_directories(fs::path(out).parent_path(), ec);
  coli::save_rates(out, r, note);
  std::fprintf(stderr, "coli-place: rates written to %s\n", out.c_str());
  return 0;
}

int run(int argc, char** argv) {
  if (argc >= 2) {
    const std::string cmd = argv[1];
    if (cmd == "-h" || cmd == "--help") {
      std::cout << kUsage << "\nRun 'coli-place SUBCOMMAND --help' for the options of each.\n";
      return 0;
    }
    if (cmd == "plan") return cmd_plan(argc - 1, argv + 1);
    if (cmd == "explain") return cmd_explain(argc - 1, argv + 1);
    if (cmd == "heat") return cmd_heat(argc - 1, argv + 1);
    if (cmd == "probe") return cmd_probe(argc - 1, argv + 1);
    if (cmd == "calibrate") return cmd_calibrate(argc - 1, argv + 1);
    if (cmd[0] != '-') throw coli::UsageError("unknown subcommand '" + cmd + "' (plan, explain, heat, calibrate or probe)");
  }
  return cmd_plan(argc, argv);  // coli-place -m MODEL --vram ...: plan
}

}  // namespace

int main(int argc, char** argv) { return coli::tool_main("coli-place", [&] { return run(argc, argv); }); }
