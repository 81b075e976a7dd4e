// coli-run: generate from a model. Thin: parses flags, wires libcore; the
// model/device/tier flags are tools/common's (run_flags.h, run_options.h).
#include <unistd.h>

#include <boost/program_options.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <thread>

#include "common/heat_flag.h"
#include "common/run_flags.h"
#include "common/run_options.h"
#include "common/run_plan.h"
#include "common/run_setup.h"
#include "cpu_backend.h"
#include "cuda_backend.h"
#include "cuda_device.h"
#include "engine/chat_session.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "env_options.h"
#include "mirror/mirror_load.h"
#include "model/fingerprint.h"
#include "model/weights.h"
#include "placement/heat_recorder.h"
#include "placement/plan.h"
#include "placement/plan_apply.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/io.h"
#include "util/parse.h"
#include "util/tool_main.h"

namespace po = boost::program_options;

namespace {

const char* kUsage =
    "usage: coli-run --model DIR [--prompt TEXT | --prompt-file F | --prompt-ids 1,2,3 | --messages F.json | -i] [options]\n"
    "       coli-run --tokenizer PATH --tokenize [--messages F.json]   (text on stdin -> ids)\n"
    "       coli-run --tokenizer PATH --detokenize                      (ids on stdin -> text)\n"
    "\n"
    "Generates from a Hugging Face qwen3_5_moe checkpoint directory. Text is\n"
    "streamed to stdout; with --prompt-ids the output stays ids. A stats line\n"
    "goes to stderr. Without a prompt option the prompt is read from stdin.\n"
    "--messages, --system, --chat and -i render a chat with the model's template.\n";

struct Flags {
  po::variables_map vm;
  bool has(const char* k) const { return vm.count(k) && !vm[k].defaulted(); }
  template <class T>
  T get(const char* k) const { return vm[k].as<T>(); }
};

coli::GenerateOptions generate_options(const Flags& f) {
  coli::GenerateOptions g;
  g.n_predict = f.get<int>("n-predict");
  if (g.n_predict < 1) throw coli::UsageError("--n-predict must be at least 1");
  auto& s = g.sampling;
  s.temperature = f.get<float>("temp");
  s.top_k = f.get<int>("top-k");
  s.top_p = f.get<float>("top-p");
  s.min_p = f.get<float>("min-p");
  s.repeat_penalty = f.get<float>("repeat-penalty");
  s.penalty_last_n = f.get<int>("repeat-last-n");
  s.presence_penalty = f.get<float>("presence-penalty");
  s.seed = f.has("seed") ? coli::parse_seed(f.get<std::string>("seed"), "--seed") : std::random_device{}();
  coli::check_sampling_params(s);
  g.top_logprobs = f.get<int>("top-logprobs");
  g.logprobs = f.get<bool>("json");  // only --json prints them: a log-softmax per token otherwise costs decode speed
  if (g.top_logprobs < 0) throw coli::UsageError("--top-logprobs must be >= 0");
  g.ignore_eos = f.get<bool>("ignore-eos");
  g.n_ctx = f.get<int>("ctx-size");
  if (g.n_ctx < 0) throw coli::UsageError("--ctx-size must be >= 0 (0: the model's max_position_embeddings)");
  if (f.has("draft")) {
    g.draft = f.get<int>("draft");
    if (g.draft < 0 || g.draft > coli::kMaxDraft)
      throw coli::UsageError("--draft " + std::to_string(g.draft) + ": must be 0 (off) to " + std::to_string(coli::kMaxDraft) + " drafted tokens a step");
  }
  return g;
}

// The expert tier's line, when the backend has one.
void print_tier(const coli::TierStats& t) {
  if (!t.tiered) return;
  std::fprintf(stderr,
               "coli-run: expert tier %lld of %lld experts in VRAM, hit rate %.1f %% of %lld routed pairs, CPU experts %.1f ms reading %.1f MB per "
               "token, GPU experts %.1f ms, GPU waited %.1f ms in %lld handoffs, VRAM peak %.2f GiB",
               t.resident, t.experts, 100 * t.hit_rate(), t.pairs, t.host_experts_ms, t.tokens ? t.host_expert_bytes / 1e6 / t.tokens : 0.0,
               t.device_experts_ms, t.device_wait_ms, t.handoffs, t.vram_peak / double(1 << 30));
  if (t.vram_budget) std::fprintf(stderr, " of %.2f GiB", t.vram_budget / double(1 << 30));
  if (t.swaps) std::fprintf(stderr, ", %lld swaps (%.1f MB copied)", t.swaps, t.swap_bytes / 1e6);
  if (t.prefill_upload_bytes) std::fprintf(stderr, ", prompts uploaded %.1f MB of experts", t.prefill_upload_bytes / 1e6);
  if (t.pcie_read)
    std::fprintf(stderr, ", GPU read %lld pairs over PCIe in decode steps (counted as hits; %lld experts readable)", t.pcie_misses, t.pcie_read);
  std::fprintf(stderr, "\n");
}

std::string fixed1(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

void print_stats(const char* backend, const coli::GenerateStats& st, uint64_t seed, int n_ctx) {
  if (st.context_full)
    std::fprintf(stderr, "coli-run: the context is full (%d tokens, -c/--ctx-size): generation stopped after %d tokens\n", n_ctx, st.n_generated);
  char decode[160];
  if (st.n_decode_steps)  // the tokens after the first, which came from the prompt's logits
    std::snprintf(decode, sizeof decode, "decode %.1f tok/s (%d tokens)", (st.n_generated - 1) / std::max(st.decode_seconds, 1e-9), st.n_generated);
  else  // the first token came from the prompt's logits: no decode step to time
    std::snprintf(decode, sizeof decode, "no decode step (%d token%s)", st.n_generated, st.n_generated == 1 ? "" : "s");
  std::fprintf(stderr, "coli-run: backend %s, prompt %d tokens, prefill %.1f tok/s, %s, seed %llu\n", backend, st.n_prompt,
               st.n_prompt / std::max(st.prefill_seconds, 1e-9), decode, static_cast<unsigned long long>(seed));
  if (st.n_rounds)
    std::fprintf(stderr, "coli-run: drafts: %d of %d accepted (%.1f %%), %.2f tokens a step, MTP layer %.1f %% of the decode time\n", st.n_accepted,
                 st.n_drafted, st.n_drafted ? 100.0 * st.n_accepted / st.n_drafted : 0.0, double(st.n_generated - 1) / st.n_rounds,
                 100 * st.mtp_seconds / std::max(st.decode_seconds, 1e-9));
  if (!st.draft_off.empty()) std::fprintf(stderr, "coli-run: --draft: off for this reply (%s)\n", st.draft_off.c_str());
}

std::string prompt_text(const Flags& f) {
  if (f.has("prompt")) return f.get<std::string>("prompt");
  if (f.has("prompt-file")) return coli::read_text_file(f.get<std::string>("prompt-file"));
  return coli::read_stdin();
}

std::unique_ptr<coli::Tokenizer> load_tokenizer(const Flags& f, bool required) {
  std::string path;
  if (f.has("tokenizer")) path = f.get<std::string>("tokenizer");
  else if (f.has("model")) {
    const std::string m = f.get<std::string>("model");
    // A checkpoint directory with tokenizer.json, or a container (which embeds it).
    if (std::filesystem::exists(m + "/tokenizer.json") || std::filesystem::is_regular_file(m) || std::filesystem::exists(m + "/model.coli")) path = m;
  }
  if (path.empty()) {
    if (required) throw coli::UsageError("this needs a tokenizer: --tokenizer PATH, or a --model directory with tokenizer.json");
    return nullptr;
  }
  if (required || f.has("tokenizer")) return coli::Tokenizer::load(path);
  try {  // ids in, ids out: a model without a tokenizer is fine
    return coli::Tokenizer::load(path);
  } catch (const coli::Error&) {
    return nullptr;
  }
}

std::vector<coli::ChatMessage> chat_messages(const Flags& f) {
  std::vector<coli::ChatMessage> m;
  if (f.has("messages")) m = coli::parse_chat_messages(coli::read_text_file(f.get<std::string>("messages")), f.get<std::string>("messages"));
  if (f.has("system")) m.insert(m.begin(), {"system", f.get<std::string>("system"), {}});
  return m;
}

coli::ChatOptions chat_options(const Flags& f) {
  coli::ChatOptions c;
  if (f.get<bool>("think")) c.enable_thinking = true;
  if (f.get<bool>("no-think")) c.enable_thinking = false;
  return c;
}

int tokenizer_only(const Flags& f) {
  auto tok = load_tokenizer(f, true);
  if (f.get<bool>("tokenize")) {
    std::vector<int> ids;
    if (f.has("messages")) {
      coli::ChatOptions c = chat_options(f);
      ids = tok->encode(coli::render_chat(chat_messages(f), c, coli::chat_style_of(tok->chat_template())));
    } else {
      ids = tok->encode(prompt_text(f));
    }
    for (std::size_t i = 0; i < ids.size(); ++i) std::printf(i ? " %d" : "%d", ids[i]);
    std::printf("\n");
    return 0;
  }
  std::string text = f.has("prompt-ids") ? f.get<std::string>("prompt-ids") : coli::read_stdin();
  for (char& c : text)
    if (c == ' ' || c == '\n' || c == '\t' || c == '\r') c = ',';
  while (!text.empty() && text.back() == ',') text.pop_back();
  while (!text.empty() && text.front() == ',') text.erase(0, 1);
  std::vector<int> ids = text.empty() ? std::vector<int>{} : coli::parse_id_list(text, "--detokenize input");
  const std::string out = tok->decode(ids);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

po::options_description options() {
  namespace cli = coli::cli;
  po::options_description opts("options");
  opts.add_options()
      ("help,h", "show this help and exit")
      ("model,m", po::value<std::string>(), "checkpoint directory (config.json + safetensors) or coli container")
      ("tokenizer", po::value<std::string>(), "tokenizer.json or its directory (default: the model directory)")
      ("prompt,p", po::value<std::string>(), "prompt text")
      ("prompt-file,f", po::value<std::string>(), "read the prompt text from a file")
      ("prompt-ids", po::value<std::string>(), "prompt as comma-separated token ids (output stays ids)")
      ("messages", po::value<std::string>(), "chat: OpenAI-style JSON list of {role, content}")
      ("system", po::value<std::string>(), "chat: system message")
      ("chat", po::bool_switch(), "chat: send the prompt as a user turn through the chat template")
      ("interactive,i", po::bool_switch(), "chat interactively, one user turn per stdin line")
      ("think", po::bool_switch(), "chat: enable_thinking = true")
      ("no-think", po::bool_switch(), "chat: enable_thinking = false (an empty think block)")
      ("n-predict,n", po::value<int>()->default_value(256), "maximum number of tokens to generate")
      ("ctx-size,c", po::value<int>()->default_value(0), "context size in tokens: prompt + generated (0: the model's max_position_embeddings)")
      ("temp", po::value<float>()->default_value(0.8f, "0.8"), "temperature; 0 = greedy")
      ("top-k", po::value<int>()->default_value(40), "top-k sampling (0 = off)")
      ("top-p", po::value<float>()->default_value(0.95f, "0.95"), "top-p sampling (1 = off)")
      ("min-p", po::value<float>()->default_value(0.05f, "0.05"), "min-p sampling (0 = off)")
      ("repeat-penalty", po::value<float>()->default_value(1.0f, "1"), "repetition penalty (1 = off)")
      ("repeat-last-n", po::value<int>()->default_value(64), "ids the penalties look back over (-1 = all)")
      ("presence-penalty", po::value<float>()->default_value(0.0f, "0"), "presence penalty (0 = off)")
      ("seed", po::value<std::string>(), "sampler seed (default: random, printed in the stats line)")
      ("json", po::bool_switch(), "one JSON object per generated token")
      ("top-logprobs", po::value<int>()->default_value(0), "with --json: the K most likely ids and their logprobs")
      ("ignore-eos", po::bool_switch(), "do not stop at end-of-sequence ids")
      ("draft", po::value<int>(), "speculative decoding: N tokens a step drafted by the model's MTP layer and verified at once (0: off, the default; "
                                  "needs mtp.* tensors and the CPU backend)")
      ("prefill-chunk", po::value<int>(), "prompt tokens per forward chunk (default: under a VRAM budget the plan's, 512 to 4096; else 512)");
  cli::add_flags(opts, cli::Tool::kRun, cli::kTierFlags);
  cli::add_flags(opts, cli::Tool::kRun, {cli::Flag::kDevice, cli::Flag::kThreads, cli::Flag::kReference, cli::Flag::kHeat});
  opts.add_options()
      ("verbose,v", po::bool_switch(), "log to stderr why the GPU is not used, and other details")
      ("tokenize", po::bool_switch(), "print the ids of the text on stdin (or of --messages) and exit")
      ("detokenize", po::bool_switch(), "print the text of the ids on stdin and exit");
  return opts;
}

Flags parse_flags(int argc, char** argv, const po::options_description& opts) {
  Flags f;
  try {
    po::store(po::command_line_parser(argc, argv).options(opts).run(), f.vm);
    po::notify(f.vm);
  } catch (const po::error& e) {
    throw coli::UsageError(e.what());
  }
  return f;
}

// One prompt source, one thinking mode, one of --tokenize and --detokenize.
void check_prompt_flags(const Flags& f) {
  const int sources = f.has("prompt") + f.has("prompt-file") + f.has("prompt-ids") + f.has("messages") + f.get<bool>("interactive");
  if (sources > 1 && !(f.has("messages") && f.get<bool>("interactive"))) throw coli::UsageError("give one of --prompt, --prompt-file, --prompt-ids, --messages, -i");
  if (f.get<bool>("think") && f.get<bool>("no-think")) throw coli::UsageError("--think and --no-think exclude each other");
  if (f.get<bool>("tokenize") && f.get<bool>("detokenize")) throw coli::UsageError("--tokenize and --detokenize exclude each other");
}

// A generation's command line, checked before any file is read (usage errors first).
struct Job {
  Flags f;
  std::string model;
  coli::GenerateOptions go;
  coli::cli::RunFlags run;  // the model/device/tier flags (tools/common/run_flags.h)
  std::vector<int> prompt;  // --prompt-ids
  bool chat = false, verbose = false;
  int threads = 0;
};

Job checked_job(Flags f) {
  if (!f.has("model")) throw coli::UsageError("--model is required");
  if (f.has("prefill-chunk") && f.get<int>("prefill-chunk") < 1) throw coli::UsageError("--prefill-chunk must be at least 1");
  Job j;
  j.threads = coli::check_thread_count(f.get<int>("threads"), "-t/--threads");
  j.go = generate_options(f);
  j.chat = f.has("messages") || f.has("system") || f.get<bool>("chat") || f.get<bool>("interactive");
  if (j.chat && f.has("prompt-ids")) throw coli::UsageError("--prompt-ids cannot be combined with chat options");
  j.run = coli::cli::read_run_flags(f.vm, coli::cli::Tool::kRun);
  if (f.has("prompt-ids")) j.prompt = coli::parse_id_list(f.get<std::string>("prompt-ids"), "--prompt-ids");
  j.model = f.get<std::string>("model");
  j.verbose = f.get<bool>("verbose");
  j.f = std::move(f);
  return j;
}

struct Loaded {
  std::unique_ptr<coli::Tokenizer> tok;
  coli::LoadedModel lm;
  double load_ms = 0;
  const coli::Model& model() const { return *lm.model; }
};

// The tokenizer and the weights: from a coli-pin mirror when one is ready
// (--mirror), else the container. Fixes the context the model allows.
Loaded load(Job& j) {
  Loaded l;
  l.tok = load_tokenizer(j.f, !j.f.has("prompt-ids"));
  const auto t_load = Clock::now();
  l.lm = coli::load_model(j.model, j.run.mirror);
  l.load_ms = ms_since(t_load);
  if (!l.lm.warning.empty()) std::fprintf(stderr, "coli-run: %s\n", l.lm.warning.c_str());
  const coli::ModelSpec& spec = l.model().spec();
  if (l.tok) coli::check_tokenizer_matches(*l.tok, j.f.has("tokenizer") ? j.f.get<std::string>("tokenizer") : j.model, spec.vocab_size, j.model);
  const int max_pos = spec.max_position_embeddings;
  if (j.go.n_ctx == 0) j.go.n_ctx = max_pos;
  else if (max_pos > 0 && j.go.n_ctx > max_pos)
    std::fprintf(stderr, "coli-run: warning: --ctx-size %d exceeds the model's max_position_embeddings %d\n", j.go.n_ctx, max_pos);
  const coli::MirrorAttachment* m = l.lm.mirror.get();
  if (j.verbose && m)
    std::fprintf(stderr, "coli-run: mirror %s: %llu expert and %llu trunk blobs served from shared memory\n", m->name().c_str(),
                 static_cast<unsigned long long>(m->header().expert_blobs), static_cast<unsigned long long>(m->header().trunk_blobs));
  else if (j.verbose && !l.lm.note.empty())
    std::fprintf(stderr, "coli-run: no mirror used (%s)\n", l.lm.note.c_str());
  return l;
}

// Routing heat (--heat): every token counted, merged into the file at exit.
coli::HeatRecorder open_heat(const Job& j, const coli::Model& model) {
  const uint64_t fingerprint = j.run.heat.none() ? 0 : coli::model_fingerprint(j.model);
  coli::HeatRecorder heat(j.run.heat.path(fingerprint), fingerprint, model.spec());
  if (j.verbose && heat.on())
    std::fprintf(stderr, "coli-run: routing heat: %s (%llu tokens before this run)\n", heat.path().c_str(),
                 static_cast<unsigned long long>(heat.previous().tokens()));
  return heat;
}

// A plan's RAM part: its VRAM and RAM experts asked into memory ahead of
// use (the tier part follows under a budget: start_run).
std::optional<coli::Plan> read_plan_file(const Job& j, const coli::Model& model) {
  if (!j.run.plan || j.run.plan_auto()) return std::nullopt;
  const coli::ModelSpec& ms = model.spec();
  coli::Plan plan = coli::load_plan(*j.run.plan, coli::model_fingerprint(j.model), ms.num_layers, ms.num_experts);
  const uint64_t advised = coli::advise_plan_ram(model, plan);
  if (j.verbose) std::fprintf(stderr, "coli-run: plan %s: %.1f GB of experts asked into memory\n", j.run.plan->c_str(), advised / 1e9);
  return plan;
}

// The device, the budget, the tier's plan and chunk, the backend
// (tools/common/run_setup.h: coli-bench makes the same choice), and the
// line that says what was chosen when it is not the whole GPU.
coli::cli::RunSetup start_run(const Job& j, const Loaded& l, const coli::HeatRecorder& heat, const std::optional<coli::Plan>& file_plan) {
  coli::cli::RunRequest r;
  r.flags = &j.run, r.model_path = j.model, r.model = l.lm.model.get(), r.mirror = l.lm.mirror.get();
  r.vram_budget = j.run.vram_budgets.at(0);
  r.n_ctx = j.f.has("ctx-size") ? j.go.n_ctx : std::min(j.go.n_ctx, 4096);  // 0 (no stated maximum): the backend's 4096
  r.chunk = j.f.has("prefill-chunk") ? j.f.get<int>("prefill-chunk") : 0;
  r.threads = j.threads, r.fast_cpu = !j.f.get<bool>("reference");
  r.start_heat = coli::cli::tier_start_heat(heat, r.mirror);  // the experts earlier runs routed to most
  r.plan_file = file_plan ? &*file_plan : nullptr;
  r.env = coli::apply_environment();  // COLI_* variables (env_options.h); the flags win
  r.env.mtp = j.go.draft > 0;         // the MTP module on the device too (a model without one ignores it)
  r.pin_in_background = true;         // the first token does not wait for the container's pin
  coli::cli::RunSetup s = coli::cli::setup_run(r);
  if (const std::string line = coli::cli::notice(s); !line.empty()) std::fprintf(stderr, "coli-run: %s\n", line.c_str());
  else if (!s.fallback.empty() && j.verbose && coli::cuda::compiled_with_cuda())
    std::fprintf(stderr, "coli-run: no CUDA device used (%s); running on the CPU\n", s.fallback.c_str());
  if (j.verbose && s.plan && s.plan_source != "file")
    std::fprintf(stderr, "coli-run: plan (rates: %s): predicted decode %.1f tok/s, prefill %.0f tok/s at chunks of %d, hit rate %.3f\n",
                 s.rates_from.empty() ? "defaults; run coli-place probe" : s.rates_from.c_str(), s.predicted.decode_tok_s, s.predicted.prefill_tok_s,
                 s.chunk, s.predicted.hit_rate);
  if (const coli::TierStats t = s.backend->tier_stats(); j.run.tier.pcie_read > 0 && t.tiered && t.resident < t.experts && t.pcie_read == 0)
    std::fprintf(stderr, "coli-run: --pcie-read: no expert outside the tier is in pinned memory (start coli-pin for this model): off\n");
  return s;
}

// --draft N asked for what this model and backend can run.
void check_draft(const Job& j, const coli::Model& model) {
  if (!model.has_mtp())
    throw coli::UsageError("--draft " + std::to_string(j.go.draft) + ": " + j.model +
                           " has no MTP module (no mtp.* tensors, or config.json declares none); run without --draft");
}

// -v: where the start's time went (time to first token = this + the prompt).
void print_start(Clock::time_point t_start, double load_ms, Clock::time_point t_backend, const coli::cli::RunSetup& run) {
  const auto now = Clock::now();
  const coli::Backend& backend = *run.backend;
  std::string line = "coli-run: start: ready after " + fixed1(std::chrono::duration<double, std::milli>(now - t_start).count()) + " ms: load " +
                     fixed1(load_ms) + " ms, backend " + fixed1(std::chrono::duration<double, std::milli>(now - t_backend).count()) + " ms";
  if (run.pin_ms > 0) line += " (of it: pin the container " + fixed1(run.pin_ms) + " ms)";
  const auto phases = backend.start_phases();
  for (std::size_t i = 0; i < phases.size(); ++i) line += (i ? ", " : " (") + phases[i].first + " " + fixed1(phases[i].second);
  std::fprintf(stderr, "%s%s\n", line.c_str(), phases.empty() ? "" : ")");
}

// A failed write (a full disk, >/dev/full) ends the run at once, naming
// standard output (tool_main would catch it too, but only after the whole
// generation and its stats line).
void emit(const std::string& s) {
  if (std::fwrite(s.data(), 1, s.size(), stdout) != s.size() || std::fflush(stdout) != 0)
    throw coli::Error(std::string("standard output: write error (") + std::strerror(errno) + ")");
}

// What generating needs once the backend is up.
struct Generator {
  Job& j;
  Loaded& l;
  coli::Engine& engine;
  const coli::Backend& backend;
  std::function<void()> save_heat;  // at exit: the run's routing into the heat file and the mirror

  void report(const coli::GenerateStats& st) const { print_stats(backend.name().c_str(), st, j.go.sampling.seed, j.go.n_ctx); }
};

// A chat: the messages (or the prompt as a user turn) answered once, or -i:
// one user turn per stdin line until an empty one.
int chat(Generator& g) {
  coli::ChatSession cs(g.engine, *g.l.tok, g.j.go, chat_options(g.j.f));
  cs.messages() = chat_messages(g.j.f);
  auto turn = [&] {
    const coli::GenerateStats st = cs.respond(emit);
    emit("\n");
    g.report(st);
  };
  if (!g.j.f.get<bool>("interactive")) {
    if (!g.j.f.has("messages")) cs.messages().push_back({"user", prompt_text(g.j.f), {}});
    turn();
    g.save_heat();
    print_tier(g.backend.tier_stats());
    return 0;
  }
  const bool tty = ::isatty(0);
  std::string line;
  while (true) {
    if (tty) std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line) || line.empty()) break;
    cs.messages().push_back({"user", line, {}});
    turn();
    print_tier(g.backend.tier_stats());
  }
  g.save_heat();
  return 0;
}

// A prompt (text, or ids with --prompt-ids) continued: text, ids or --json records on stdout.
int generate_text(Generator& g) {
  Job& j = g.j;
  if (!j.f.has("prompt-ids")) {
    j.prompt = g.l.tok->encode(prompt_text(j.f));
    for (int id : coli::tokenizer_stop_ids(*g.l.tok)) j.go.stop_ids.push_back(id);
  }
  const bool ids_out = j.f.has("prompt-ids"), json = j.f.get<bool>("json");
  // With --json every record carries the text when there is a tokenizer, ids in or not.
  std::unique_ptr<coli::TextStreamer> streamer = g.l.tok && (!ids_out || json) ? std::make_unique<coli::TextStreamer>(*g.l.tok) : nullptr;
  bool first = true;
  coli::Session session = g.engine.new_session();
  auto st = coli::generate(g.engine, session, j.prompt, j.go, [&](const coli::TokenEvent& ev) {
    const std::string piece = streamer && !ev.is_stop ? streamer->push(ev.id) : std::string();
    if (json) {
      nlohmann::json rec = {{"id", ev.id}, {"logprob", ev.logprob}};
      if (streamer) rec["text"] = piece;
      if (j.go.top_logprobs > 0) {
        rec["top_logprobs"] = nlohmann::json::array();
        for (auto [id, lp] : ev.top) rec["top_logprobs"].push_back({{"id", id}, {"logprob", lp}});
      }
      emit(rec.dump() + "\n");
    } else if (ids_out) {
      emit((first ? "" : " ") + std::to_string(ev.id));
    } else {
      emit(piece);
    }
    first = false;
  });
  if (streamer && !json) emit(streamer->flush());
  if (!json) emit("\n");
  g.report(st);
  g.save_heat();
  print_tier(g.backend.tier_stats());
  return 0;
}

int run(int argc, char** argv) {
  const auto t_start = Clock::now();
  const po::options_description opts = options();
  Flags f = parse_flags(argc, argv, opts);
  if (f.vm.count("help")) {
    std::cout << kUsage << "\n" << opts << std::endl;
    return 0;
  }
  check_prompt_flags(f);
  if (f.get<bool>("tokenize") || f.get<bool>("detokenize")) return tokenizer_only(f);
  Job j = checked_job(std::move(f));
  // The GPU's context (0.1-0.25 s) is made while the tokenizer and the weights load.
  std::jthread context_maker;
  if (j.run.device != "cpu") context_maker = std::jthread([] { coli::cuda::prepare_device(0); });
  Loaded l = load(j);
  coli::HeatRecorder heat = open_heat(j, l.model());
  const std::optional<coli::Plan> file_plan = read_plan_file(j, l.model());
  if (context_maker.joinable()) context_maker.join();
  const auto t_backend = Clock::now();
  coli::cli::RunSetup run = start_run(j, l, heat, file_plan);
  const std::unique_ptr<coli::Backend>& backend = run.backend;
  if (j.verbose) print_start(t_start, l.load_ms, t_backend, run);
  if (j.go.draft > 0) check_draft(j, l.model());
  coli::Engine engine(l.model().spec(), *backend, run.chunk);
  engine.set_heat(heat.run());
  Generator g{j, l, engine, *backend, [&] {
                engine.collect_heat();
                if (l.lm.mirror && heat.run()) l.lm.mirror->add_heat(std::vector<uint64_t>(heat.run()->counts().begin(), heat.run()->counts().end()));
                heat.save();
              }};
  const int rc = j.chat ? chat(g) : generate_text(g);
  // The background pin's outcome: a refusal always (the run stayed pageable), else with -v.
  bool refused = false;
  if (const std::string line = coli::cli::pin_outcome(run, &refused); !line.empty() && (refused || j.verbose))
    std::fprintf(stderr, "coli-run: %s\n", line.c_str());
  return rc;
}

}  // namespace

int main(int argc, char** argv) { return coli::tool_main("coli-run", [&] { return run(argc, argv); }); }
