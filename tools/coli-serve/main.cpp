// coli-serve: the OpenAI-compatible HTTP server over one model. Thin: parses
// flags, loads and sets up the run as coli-run does (tools/common: device,
// budget, mirror, plan), then serves with libcore's serve/ (http_server.h)
// until SIGTERM or SIGINT.
#include <signal.h>

#include <boost/program_options.hpp>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <thread>

#include "common/run_flags.h"
#include "common/run_setup.h"
#include "cuda_backend.h"
#include "engine/engine.h"
#include "env_options.h"
#include "mirror/mirror_load.h"
#include "model/weights.h"
#include "serve/engine_generator.h"
#include "serve/http_server.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/parse.h"
#include "util/tool_main.h"

namespace po = boost::program_options;

namespace {

const char* kUsage =
    "usage: coli-serve --model PATH [--host ADDR] [--port N] [--api-key KEY] [options]\n"
    "\n"
    "Serves the model over an OpenAI-compatible HTTP API: GET /health, GET /v1/models,\n"
    "POST /v1/chat/completions and /v1/completions (stream: server-sent events),\n"
    "POST /tokenize, /detokenize, GET /metrics. Logs go to stderr. Up to --parallel\n"
    "requests generate at once (their decode steps batched); --queue more may wait,\n"
    "more than that get 503.\n";

po::options_description options() {
  namespace cli = coli::cli;
  po::options_description opts("options");
  opts.add_options()
      ("help,h", "show this help and exit")
      ("model,m", po::value<std::string>(), "checkpoint directory (config.json + safetensors) or coli container")
      ("tokenizer", po::value<std::string>(), "tokenizer.json or its directory (default: the model)")
      ("alias", po::value<std::string>(), "the model's name in the API (default: the model path's last part)")
      ("host", po::value<std::string>()->default_value("127.0.0.1"), "address to listen on (0.0.0.0: every interface)")
      ("port", po::value<int>()->default_value(8080), "port to listen on")
      ("api-key", po::value<std::string>(), "require 'Authorization: Bearer KEY' (every endpoint but /health)")
      ("ctx-size,c", po::value<int>()->default_value(4096), "context size in tokens: prompt + reply")
      ("n-predict,n", po::value<int>()->default_value(0), "max_tokens when a request gives none (0: until the context is full)")
      ("parallel", po::value<int>()->default_value(1), "generation slots: requests served at once, their decode steps run as one batch")
      ("queue", po::value<int>()->default_value(16), "requests that may wait for a slot; more get 503")
      ("max-body", po::value<int>()->default_value(4 << 20), "largest request body in bytes; larger get 413")
      ("prefill-chunk", po::value<int>(), "prompt tokens per forward chunk (default: the run setup's)")
      ("step-prompt", po::value<int>()->default_value(256),
       "prompt tokens a decode step of the other slots takes along (0: prompt chunks run as passes of their own)");
  cli::add_flags(opts, cli::Tool::kRun, cli::kTierFlags);
  cli::add_flags(opts, cli::Tool::kRun, {cli::Flag::kDevice, cli::Flag::kThreads, cli::Flag::kReference});
  return opts;
}

int run(int argc, char** argv) {
  const po::options_description opts = options();
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(opts).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw coli::UsageError(e.what());
  }
  if (vm.count("help")) {
    std::cout << kUsage << "\n" << opts << std::endl;
    return 0;
  }
  if (!vm.count("model")) throw coli::UsageError("--model is required");
  const std::string model_path = vm["model"].as<std::string>();
  const int n_ctx = vm["ctx-size"].as<int>(), port = vm["port"].as<int>(), queue = vm["queue"].as<int>(), max_body = vm["max-body"].as<int>();
  const int n_predict = vm["n-predict"].as<int>(), parallel = vm["parallel"].as<int>();
  if (parallel < 1 || parallel > 256) throw coli::UsageError("--parallel must be in [1, 256]");
  if (n_ctx < 2) throw coli::UsageError("--ctx-size must be at least 2");
  if (port < 0 || port > 65535) throw coli::UsageError("--port must be in [0, 65535]");
  if (queue < 0) throw coli::UsageError("--queue must be >= 0");
  if (max_body < 1) throw coli::UsageError("--max-body must be at least 1");
  if (n_predict < 0) throw coli::UsageError("--n-predict must be >= 0");
  if (vm.count("prefill-chunk") && vm["prefill-chunk"].as<int>() < 1) throw coli::UsageError("--prefill-chunk must be at least 1");
  const int step_prompt = vm["step-prompt"].as<int>();
  if (step_prompt < 0) throw coli::UsageError("--step-prompt must be >= 0");
  const int threads = coli::check_thread_count(vm["threads"].as<int>(), "-t/--threads");
  const coli::cli::RunFlags flags = coli::cli::read_run_flags(vm, coli::cli::Tool::kRun);

  // SIGTERM / SIGINT are taken by a thread of their own (sigwait), so every
  // other thread has them blocked from here on.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  const std::string tok_path = vm.count("tokenizer") ? vm["tokenizer"].as<std::string>() : model_path;
  auto tok = coli::Tokenizer::load(tok_path);
  coli::LoadedModel lm = coli::load_model(model_path, flags.mirror);
  if (!lm.warning.empty()) std::fprintf(stderr, "coli-serve: %s\n", lm.warning.c_str());
  const coli::ModelSpec& spec = lm.model->spec();
  coli::check_tokenizer_matches(*tok, tok_path, spec.vocab_size, model_path);

  coli::cli::RunRequest r;
  r.flags = &flags, r.model_path = model_path, r.model = lm.model.get(), r.mirror = lm.mirror.get();
  r.vram_budget = flags.vram_budgets.at(0);
  r.n_ctx = n_ctx, r.sequences = parallel;
  r.chunk = vm.count("prefill-chunk") ? vm["prefill-chunk"].as<int>() : 0;
  r.threads = threads, r.fast_cpu = !vm["reference"].as<bool>();
  r.expert_spare = 3;  // the scheduler and the connections' threads run during a decode step
  r.env = coli::apply_environment();
  coli::cli::RunSetup s = coli::cli::setup_run(r);
  if (const std::string line = coli::cli::notice(s); !line.empty()) std::fprintf(stderr, "coli-serve: %s\n", line.c_str());
  coli::Engine engine(spec, *s.backend, s.chunk);
  coli::serve::EngineGenerator gen(engine, *tok, n_ctx, parallel, step_prompt > 0 ? step_prompt : 256, step_prompt > 0);

  coli::serve::ServerOptions so;
  so.host = vm["host"].as<std::string>(), so.port = port, so.queue = queue, so.max_body = static_cast<std::size_t>(max_body);
  if (vm.count("api-key")) so.api_key = vm["api-key"].as<std::string>();
  so.limits.model_name = vm.count("alias") ? vm["alias"].as<std::string>() : std::filesystem::path(model_path).filename().string();
  if (so.limits.model_name.empty()) so.limits.model_name = std::filesystem::path(model_path).parent_path().filename().string();
  so.limits.max_tokens_default = n_predict;
  const coli::Backend& backend = *s.backend;
  coli::serve::HttpServer server(so, gen, [&backend] {
    const coli::TierStats t = backend.tier_stats();
    if (!t.tiered) return std::string();
    std::string m = "# TYPE coli_tier_hit_rate gauge\ncoli_tier_hit_rate " + std::to_string(t.hit_rate()) + "\n";
    const double tokens = t.tokens ? double(t.tokens) : 1.0;
    m += "# TYPE coli_host_expert_bytes_per_token gauge\ncoli_host_expert_bytes_per_token " + std::to_string(t.host_expert_bytes / tokens) + "\n";
    m += "# TYPE coli_pcie_expert_bytes_per_token gauge\ncoli_pcie_expert_bytes_per_token " + std::to_string(t.pcie_expert_bytes / tokens) + "\n";
    return m;
  });
  std::thread signals([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    std::fprintf(stderr, "coli-serve: %s: finishing the responses in flight\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    server.stop();
  });
  std::fprintf(stderr, "coli-serve: listening on http://%s:%d (model '%s', backend %s, context %d, %d slot%s)\n", so.host.c_str(), server.port(),
               so.limits.model_name.c_str(), backend.name().c_str(), n_ctx, parallel, parallel == 1 ? "" : "s");
  server.run();
  pthread_kill(signals.native_handle(), SIGTERM);  // a stop() from elsewhere: the signal thread ends too
  signals.join();
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return coli::tool_main("coli-serve", [&] { return run(argc, argv); }); }
