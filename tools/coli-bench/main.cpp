// coli-bench: llama-bench-style benchmarks whose records a shell pipeline
// can consume while the run goes on. Thin: flags in (the model/device/tier
// ones tools/common's), libcore runner out.
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
#include "engine/generate.h"
#include "common/run_flags.h"
#include "common/run_options.h"
#include "common/run_setup.h"
#include "cpu_backend.h"
#include "cuda_backend.h"
#include "env_options.h"
#include "formats/container.h"
#include "mirror/mirror.h"
#include "model/model_spec.h"
#include "model/weights.h"
#include "placement/plan.h"
#include "util/error.h"
#include "util/parse.h"
#include "util/progress.h"
#include "util/tool_main.h"

namespace po = boost::program_options;

namespace {

constexpr int kMaxParallel = 256;  // as coli-serve's --parallel

const char* kUsage =
    "usage: coli-bench -m MODEL[,MODEL...] [-p N,...] [-n N,...] [-pg P,G ...] [-d N,...] [-r N]\n"
    "                  [-t N,...] [-b N,...] [-ub N,...] [-o tsv|csv|jsonl|md] [--seed S] [--vary-prompt] [--prompt-file F]\n"
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

po::options_description options() {
  namespace cli = coli::cli;
  po::options_description opts("options (llama-bench's short forms work too: -m -p -n -pg -d -r -t -b -ub -o)");
  opts.add_options()
      ("help", "show this help and exit")
      ("model", po::value<std::string>(), "model(s): checkpoint directories or containers, comma-separated")
      ("n-prompt", po::value<std::string>()->default_value("512"), "prompt lengths of pp tests (0: none)")
      ("n-gen", po::value<std::string>()->default_value("128"), "generation lengths of tg tests (0: none)")
      ("n-pg", po::value<std::vector<std::string>>()->composing(), "pp+tg test P,G (repeatable)")
      ("n-depth", po::value<std::string>()->default_value("0"), "context depths to prefill (untimed) before each test")
      ("draft", po::value<std::string>()->default_value("0"), "drafts a step for tg tests with speculative decoding by the model's MTP layer "
                                                            "(test \"tgN draftK\"; 0: none)")
      ("n-verify", po::value<std::string>()->default_value("1"), "tokens each tg step feeds: k > 1 times a speculative verify step of k tokens "
                                                                 "(test \"tgN xk\", ts in steps/s)")
      ("n-parallel", po::value<std::string>()->default_value("1"), "sessions decoded together in tg tests (test \"tgN pP\", ts the aggregate "
                                                                   "tok/s of all P: coli-serve's slots; llama-batched-bench's -npl)")
      ("repetitions", po::value<int>()->default_value(5), "timed repetitions per test")
      ("threads", po::value<std::string>()->default_value("0"), "CPU threads (0: all cores)")
      ("batch-size", po::value<std::string>()->default_value("2048"), "logical batch size (recorded)")
      ("ubatch-size", po::value<std::string>()->default_value("auto"), "tokens per forward chunk (auto: as coli-run chooses: under a VRAM budget "
                                                                     "the plan's, 512 to 4096; else 512)");
  cli::add_flags(opts, cli::Tool::kBench, cli::kTierFlags);
  opts.add_options()
      ("output", po::value<std::string>()->default_value("tsv"), "record format: tsv, csv, jsonl, md")
      ("seed", po::value<std::string>()->default_value("0"), "seed of the random token ids")
      ("vary-prompt", po::bool_switch(), "random ids of their own for each repetition (seed + 1 + repetition): nothing learnt from one prompt's routing is timed on it")
      ("prompt-file", po::value<std::string>(), "take token ids from this text (model's tokenizer) instead")
      ("no-warmup", po::bool_switch(), "skip the untimed warm-up run");
  cli::add_flags(opts, cli::Tool::kBench, {cli::Flag::kDevice, cli::Flag::kReference, cli::Flag::kHeat});
  opts.add_options()("progress", po::bool_switch(), "log each test to stderr (default when stderr is a terminal)");
  return opts;
}

po::variables_map parse_flags(int argc, char** argv, const po::options_description& opts) {
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(translate(argc, argv)).options(opts).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw coli::UsageError(e.what());
  }
  return vm;
}

// The tests: the lists of -p -n -pg -d -t -b -ub, -r and the token source.
void read_tests(const po::variables_map& vm, coli::BenchOptions& o) {
  o.n_prompt = coli::parse_int_list(vm["n-prompt"].as<std::string>(), "-p");
  o.n_gen = coli::parse_int_list(vm["n-gen"].as<std::string>(), "-n");
  if (vm.count("n-pg"))
    for (const auto& s : vm["n-pg"].as<std::vector<std::string>>()) {
      auto v = coli::parse_int_list(s, "-pg");
      if (v.size() != 2 || v[0] < 1 || v[1] < 1) throw coli::UsageError("-pg takes P,G with both > 0");
      o.prompt_gen.emplace_back(v[0], v[1]);
    }
  o.n_depth = coli::parse_int_list(vm["n-depth"].as<std::string>(), "-d");
  o.n_verify = coli::parse_int_list(vm["n-verify"].as<std::string>(), "--n-verify");
  o.draft = coli::parse_int_list(vm["draft"].as<std::string>(), "--draft");
  for (int k : o.draft)
    if (k < 0 || k > coli::kMaxDraft) throw coli::UsageError("--draft values must be 0 to " + std::to_string(coli::kMaxDraft));
  for (int v : o.n_verify)
    if (v < 1 || v > 1 + coli::kMaxDraft) throw coli::UsageError("--n-verify values must be 1 to " + std::to_string(1 + coli::kMaxDraft));
  o.n_parallel = coli::parse_int_list(vm["n-parallel"].as<std::string>(), "--n-parallel");
  for (int p : o.n_parallel)
    if (p < 1 || p > kMaxParallel) throw coli::UsageError("--n-parallel values must be 1 to " + std::to_string(kMaxParallel));
  o.threads = coli::parse_int_list(vm["threads"].as<std::string>(), "-t");
  for (int t : o.threads) coli::check_thread_count(t, "-t");
  o.n_batch = coli::parse_int_list(vm["batch-size"].as<std::string>(), "-b");
  o.n_ubatch.clear();
  for (const std::string& u : split(vm["ubatch-size"].as<std::string>())) {
    if (u == "auto") {
      o.n_ubatch.push_back(0);
      continue;
    }
    const std::vector<int> v = coli::parse_int_list(u, "-ub");
    if (v.size() != 1 || v[0] < 1) throw coli::UsageError("-ub values must be >= 1 or auto");
    o.n_ubatch.push_back(v[0]);
  }
  const bool any_pp = std::any_of(o.n_prompt.begin(), o.n_prompt.end(), [](int p) { return p > 0; });
  const bool any_tg = std::any_of(o.n_gen.begin(), o.n_gen.end(), [](int n) { return n > 0; });
  if (!any_pp && !any_tg && o.prompt_gen.empty()) throw coli::UsageError("nothing to run: every -p and -n is 0 and there is no -pg");
  o.repetitions = vm["repetitions"].as<int>();
  if (o.repetitions < 1) throw coli::UsageError("-r must be >= 1");
  o.seed = coli::parse_seed(vm["seed"].as<std::string>(), "--seed");
  o.vary_prompt = vm["vary-prompt"].as<bool>();
  o.warmup = !vm["no-warmup"].as<bool>();
  if (vm.count("prompt-file")) o.prompt_file = vm["prompt-file"].as<std::string>();
  if (o.vary_prompt && !o.prompt_file.empty()) throw coli::UsageError("--vary-prompt draws random ids: it does not go with --prompt-file");
}

// Routing heat (--heat): every token counted, merged into each model's file.
void set_heat(const coli::cli::HeatFlag& heat, coli::BenchOptions& o) {
  if (heat.given() && !heat.none() && o.models.size() > 1) throw coli::UsageError("--heat FILE holds one model's heat: give one -m, or no --heat");
  if (!heat.none()) o.heat_path = [heat](uint64_t fp) { return heat.path(fp); };
}

// A plan (coli-place) names the tier's first experts; it must be the model's.
std::optional<coli::Plan> read_plan(const coli::cli::RunFlags& flags, const coli::BenchOptions& o) {
  if (!flags.plan) return std::nullopt;
  if (flags.plan_auto()) return std::nullopt;  // planned per configuration (run_setup.h), as coli-run does
  if (o.models.size() != 1) throw coli::UsageError("--plan places one model's experts: give one -m");
  const std::string file = coli::container_file_of(o.models[0]);
  const coli::Container pc(file.empty() ? o.models[0] : file);
  const coli::ModelSpec ps = coli::parse_model_spec(pc.config_json(), o.models[0]);
  return coli::load_plan(*flags.plan, pc.fingerprint(), ps.num_layers, ps.num_experts);
}

// Under a budget the KV cache is made for the longest test at once.
int longest_test(const coli::BenchOptions& o) {
  int n_ctx = 0;
  for (int d : o.n_depth) {
    for (int p : o.n_prompt) n_ctx = std::max(n_ctx, d + p + 1);
    for (int n : o.n_gen) n_ctx = std::max(n_ctx, d + n + 1);
    for (auto [p, n] : o.prompt_gen) n_ctx = std::max(n_ctx, d + p + n + 1);
  }
  return n_ctx;
}

int run(int argc, char** argv) {
  const po::options_description opts = options();
  const po::variables_map vm = parse_flags(argc, argv, opts);
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
  read_tests(vm, o);
  const coli::cli::RunFlags flags = coli::cli::read_run_flags(vm, coli::cli::Tool::kBench);
  o.vram_budget = flags.vram_budgets;
  set_heat(flags.heat, o);
  coli::RecordFormat fmt;
  if (!coli::parse_record_format(vm["output"].as<std::string>(), &fmt)) throw coli::UsageError("-o: one of tsv, csv, jsonl, md");
  coli::RecordWriter writer(fmt, stdout);
  const bool log = vm["progress"].as<bool>() || coli::stderr_is_tty();
  coli::cuda::CudaOptions env = coli::apply_environment();  // COLI_* variables (env_options.h); the flags win
  // Draft and verify tests: the MTP module on the device for every test of
  // the run (the same backend, so the same expert slots, for draft 0 and
  // K); a verify step then runs as generate_speculative's does.
  env.mtp = std::any_of(o.draft.begin(), o.draft.end(), [](int k) { return k > 0; }) ||
            std::any_of(o.n_verify.begin(), o.n_verify.end(), [](int k) { return k > 1; });
  const std::optional<coli::Plan> plan = read_plan(flags, o);
  o.mirror = flags.mirror;
  const int n_ctx = longest_test(o);
  const bool fast = !vm["reference"].as<bool>();
  // Each configuration's backend as coli-run would make it for the same
  // model, budget and chunk (tools/common/run_setup.h).
  const int failures = coli::run_bench(
      o,
      [&](const coli::BackendRequest& q) {
        coli::cli::RunRequest r;
        r.flags = &flags, r.model_path = q.model_path, r.model = q.model, r.mirror = q.mirror;
        r.vram_budget = q.vram_budget, r.n_ctx = n_ctx, r.chunk = q.n_ubatch, r.threads = q.threads, r.fast_cpu = fast;
        r.sequences = q.sequences;
        if (q.heat) r.start_heat = coli::cli::tier_start_heat(*q.heat, q.mirror);
        r.plan_file = plan ? &*plan : nullptr;
        r.env = env;
        coli::cli::RunSetup s = coli::cli::setup_run(r);
        if (const std::string line = coli::cli::notice(s); !line.empty()) std::fprintf(stderr, "coli-bench: %s\n", line.c_str());
        coli::BenchBackend b;
        b.fields = coli::cli::record_fields(s);
        b.n_ubatch = s.chunk;
        b.backend = std::move(s.backend);
        return b;
      },
      writer, log ? stderr : nullptr);
  if (failures) std::fprintf(stderr, "coli-bench: %d record(s) failed\n", failures);
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) { return coli::tool_main("coli-bench", [&] { return run(argc, argv); }); }
