// coli-run: generate from a model. Thin: parses flags, wires libcore.
#include <unistd.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <thread>

#include "cpu_backend.h"
#include "cpu_expert_host.h"
#include "cuda_backend.h"
#include "cuda_device.h"
#include "engine/chat_session.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "env_options.h"
#include "mirror/mirror_load.h"
#include "model/fingerprint.h"
#include "placement/machine_rates.h"
#include "placement/plan.h"
#include "placement/plan_apply.h"
#include "placement/plan_inputs.h"
#include "placement/planner.h"
#include "model/weights.h"
#include "placement/heat_recorder.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/tool_main.h"
#include "util/io.h"
#include "util/parse.h"

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
  s.seed = f.has("seed") ? f.get<uint64_t>("seed") : std::random_device{}();
  coli::check_sampling_params(s);
  g.top_logprobs = f.get<int>("top-logprobs");
  g.logprobs = f.get<bool>("json");  // only --json prints them: a log-softmax per token otherwise costs decode speed
  if (g.top_logprobs < 0) throw coli::UsageError("--top-logprobs must be >= 0");
  g.ignore_eos = f.get<bool>("ignore-eos");
  g.n_ctx = f.get<int>("ctx-size");
  if (g.n_ctx < 0) throw coli::UsageError("--ctx-size must be >= 0 (0: the model's max_position_embeddings)");
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
  char decode[96];
  if (st.n_decode_steps)
    std::snprintf(decode, sizeof decode, "decode %.1f tok/s (%d tokens)", st.n_decode_steps / std::max(st.decode_seconds, 1e-9), st.n_generated);
  else  // the first token came from the prompt's logits: no decode step to time
    std::snprintf(decode, sizeof decode, "no decode step (%d token%s)", st.n_generated, st.n_generated == 1 ? "" : "s");
  std::fprintf(stderr, "coli-run: backend %s, prompt %d tokens, prefill %.1f tok/s, %s, seed %llu\n", backend, st.n_prompt,
               st.n_prompt / std::max(st.prefill_seconds, 1e-9), decode, static_cast<unsigned long long>(seed));
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

int run(int argc, char** argv) {
  const auto t_start = std::chrono::steady_clock::now();
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
      ("seed", po::value<uint64_t>(), "sampler seed (default: random, printed in the stats line)")
      ("json", po::bool_switch(), "one JSON object per generated token")
      ("top-logprobs", po::value<int>()->default_value(0), "with --json: the K most likely ids and their logprobs")
      ("ignore-eos", po::bool_switch(), "do not stop at end-of-sequence ids")
      ("prefill-chunk", po::value<int>()->default_value(512), "prompt tokens per forward chunk")
      ("vram-budget", po::value<std::string>(), "GPU memory coli may use (8G, 12000M, ...): the experts that do not fit run on the CPU at the same time")
      ("mirror", po::value<std::string>()->default_value("auto"), "weights from a coli-pin shared-memory mirror: auto (the model's, when ready), off, or a segment NAME")
      ("plan", po::value<std::string>(), "FILE|auto: a coli-place plan (man coli-plan): its VRAM and RAM experts are read into memory ahead of use; "
                                          "with --vram-budget the tier starts with its VRAM experts and its prefill chunk is the default "
                                          "(auto: planned at start from the budget, the heat and this machine's rates)")
      ("decode-upload", po::value<int>()->default_value(0), "with --vram-budget and a mirror: up to N of a decode layer's misses are uploaded and run on the GPU while the CPU runs the rest (0: off)")
      ("pcie-read", po::value<std::string>()->default_value("auto"), "with --vram-budget and a mirror: in decode steps the GPU reads round(SHARE x (misses + offset)) of a layer's misses over PCIe in place while the CPU computes the others (auto: 0.35 with a coli-pin mirror, else off; off or 0: off)")
      ("pcie-read-offset", po::value<double>()->default_value(2.0), "the CPU's fixed cost of a layer in experts, for --pcie-read's split")
      ("prefill-upload", po::bool_switch(), "with --vram-budget: prompts upload the experts the tier lacks, a layer ahead, instead of computing them on the CPU")
      ("no-swap", po::bool_switch(), "with --vram-budget: keep the experts the tier starts with (no background swaps; reproducible speed)")
      ("device", po::value<std::string>()->default_value("auto"), "cuda, cpu or auto (the GPU when one is usable and the model fits)")
      ("threads,t", po::value<int>()->default_value(0), "CPU threads (0: all cores)")
      ("reference", po::bool_switch(), "use the single-threaded scalar reference backend")
      ("heat", po::value<std::string>(), "routing heat file, read at start and merged into at exit ('none': off; default: "
                                          "$XDG_CACHE_HOME/coli/heat-FINGERPRINT.txt)")
      ("verbose,v", po::bool_switch(), "log to stderr why the GPU is not used, and other details")
      ("tokenize", po::bool_switch(), "print the ids of the text on stdin (or of --messages) and exit")
      ("detokenize", po::bool_switch(), "print the text of the ids on stdin and exit");
  Flags f;
  try {
    po::store(po::command_line_parser(argc, argv).options(opts).run(), f.vm);
    po::notify(f.vm);
  } catch (const po::error& e) {
    throw coli::UsageError(e.what());
  }
  if (f.vm.count("help")) {
    std::cout << kUsage << "\n" << opts << std::endl;
    return 0;
  }
  const int sources = f.has("prompt") + f.has("prompt-file") + f.has("prompt-ids") + f.has("messages") + f.get<bool>("interactive");
  if (sources > 1 && !(f.has("messages") && f.get<bool>("interactive"))) throw coli::UsageError("give one of --prompt, --prompt-file, --prompt-ids, --messages, -i");
  if (f.get<bool>("think") && f.get<bool>("no-think")) throw coli::UsageError("--think and --no-think exclude each other");
  if (f.get<bool>("tokenize") || f.get<bool>("detokenize")) {
    if (f.get<bool>("tokenize") && f.get<bool>("detokenize")) throw coli::UsageError("--tokenize and --detokenize exclude each other");
    return tokenizer_only(f);
  }
  if (!f.has("model")) throw coli::UsageError("--model is required");
  if (f.get<int>("prefill-chunk") < 1) throw coli::UsageError("--prefill-chunk must be at least 1");
  coli::check_thread_count(f.get<int>("threads"), "-t/--threads");
  coli::GenerateOptions go = generate_options(f);
  const bool chat = f.has("messages") || f.has("system") || f.get<bool>("chat") || f.get<bool>("interactive");
  if (chat && f.has("prompt-ids")) throw coli::UsageError("--prompt-ids cannot be combined with chat options");

  coli::check_mirror_flag(f.get<std::string>("mirror"));
  if (f.has("plan") && f.get<std::string>("plan") == "auto" && !f.has("vram-budget")) throw coli::UsageError("--plan auto plans for a --vram-budget: give one");
  std::vector<int> prompt;  // parsed before any file is read: usage errors first
  if (f.has("prompt-ids")) prompt = coli::parse_id_list(f.get<std::string>("prompt-ids"), "--prompt-ids");
  // The GPU's context (0.1-0.25 s) is made while the tokenizer and the weights load.
  const bool may_use_gpu = !f.get<bool>("reference") && f.get<std::string>("device") != "cpu";
  std::jthread context_maker;
  if (may_use_gpu) context_maker = std::jthread([] { coli::cuda::prepare_device(0); });
  auto tok = load_tokenizer(f, !f.has("prompt-ids"));
  // The weights: from a coli-pin mirror when one is ready (--mirror), else the container.
  const std::string mirror_flag = f.get<std::string>("mirror");
  const auto t_load = std::chrono::steady_clock::now();
  coli::LoadedModel loaded = coli::load_model(f.get<std::string>("model"), mirror_flag);
  const double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_load).count();
  std::unique_ptr<coli::Model>& model = loaded.model;
  if (tok) coli::check_tokenizer_matches(*tok, f.has("tokenizer") ? f.get<std::string>("tokenizer") : f.get<std::string>("model"), model->spec().vocab_size,
                                         f.get<std::string>("model"));
  const int max_pos = model->spec().max_position_embeddings;
  if (go.n_ctx == 0) go.n_ctx = max_pos;
  else if (max_pos > 0 && go.n_ctx > max_pos)
    std::fprintf(stderr, "coli-run: warning: --ctx-size %d exceeds the model's max_position_embeddings %d\n", go.n_ctx, max_pos);
  const bool verbose = f.get<bool>("verbose");
  if (verbose && loaded.mirror)
    std::fprintf(stderr, "coli-run: mirror %s: %llu expert and %llu trunk blobs served from shared memory\n", loaded.mirror->name().c_str(),
                 static_cast<unsigned long long>(loaded.mirror->header().expert_blobs), static_cast<unsigned long long>(loaded.mirror->header().trunk_blobs));
  else if (verbose && !loaded.note.empty())
    std::fprintf(stderr, "coli-run: no mirror used (%s)\n", loaded.note.c_str());

  // Routing heat (--heat): every token counted, merged into the file at exit.
  const std::string heat_flag = f.has("heat") ? f.get<std::string>("heat") : "";
  if (f.has("heat") && heat_flag.empty()) throw coli::UsageError("--heat needs a FILE or 'none'");
  const uint64_t fingerprint = heat_flag == "none" ? 0 : coli::model_fingerprint(f.get<std::string>("model"));
  coli::HeatRecorder heat(coli::heat_path_for(heat_flag, fingerprint, std::getenv("XDG_CACHE_HOME"), std::getenv("HOME")), fingerprint, model->spec());
  if (verbose && heat.on())
    std::fprintf(stderr, "coli-run: routing heat: %s (%llu tokens before this run)\n", heat.path().c_str(),
                 static_cast<unsigned long long>(heat.previous().tokens()));
  // A plan's RAM part: its VRAM and RAM experts asked into memory ahead of
  // use (the tier part follows under --vram-budget below).
  std::optional<coli::Plan> file_plan;  // --plan FILE, read once
  if (f.has("plan") && f.get<std::string>("plan") != "auto") {
    const coli::ModelSpec& ms = model->spec();
    file_plan = coli::load_plan(f.get<std::string>("plan"), coli::model_fingerprint(f.get<std::string>("model")), ms.num_layers, ms.num_experts);
    const uint64_t advised = coli::advise_plan_ram(*model, *file_plan);
    if (verbose) std::fprintf(stderr, "coli-run: plan %s: %.1f GB of experts asked into memory\n", f.get<std::string>("plan").c_str(), advised / 1e9);
  }
  std::string why;
  const std::string device = f.get<bool>("reference") ? "cpu" : f.get<std::string>("device");
  coli::cuda::CudaOptions co = coli::apply_environment();  // COLI_* variables (env_options.h); flags set below win
  int plan_chunk = f.get<int>("prefill-chunk");  // a plan's prefill chunk replaces the default
  bool pcie_read_asked = false;                  // --pcie-read SHARE given (auto says nothing when it cannot)
  co.max_chunk = plan_chunk;
  if (f.has("vram-budget")) {
    // The expert tier: what the budget leaves after the trunk, the KV cache
    // and the activations holds the hottest experts; the CPU computes the
    // others while the GPU computes the rest.
    co.vram_budget = coli::parse_size(f.get<std::string>("vram-budget"), "--vram-budget");
    if (co.vram_budget == 0) throw coli::UsageError("--vram-budget must be more than 0");
    co.n_ctx = f.has("ctx-size") ? go.n_ctx : std::min(go.n_ctx, 4096);  // 0 (no stated maximum): the backend's 4096
    co.swap = !f.get<bool>("no-swap");
    co.decode_upload_max = f.get<int>("decode-upload");
    if (co.decode_upload_max < 0) throw coli::UsageError("--decode-upload must be >= 0");
    const double pcie_read = coli::parse_pcie_read(f.get<std::string>("pcie-read"), "--pcie-read");
    pcie_read_asked = pcie_read > 0;
    // auto: with a mirror (registered at the start: 0.08 s per GB), unless --decode-upload takes the misses.
    co.pcie_read_share = coli::pcie_read_share(pcie_read, loaded.mirror != nullptr, co.decode_upload_max > 0);
    co.pcie_read_offset = coli::check_pcie_read_offset(f.get<double>("pcie-read-offset"), "--pcie-read-offset");
    co.prefill_upload = f.get<bool>("prefill-upload");
    if (device != "cpu" && coli::cuda::device_count() > 0) co.expert_host = std::make_shared<coli::cpu::CpuExpertHost>(*model, f.get<int>("threads"));
    // The tier starts with the experts earlier runs routed to most.
    if (heat.on() && heat.previous().tokens() > 0) co.heat.assign(heat.previous().counts().begin(), heat.previous().counts().end());
    else if (loaded.mirror) co.heat = loaded.mirror->heat();  // what the runs on this mirror routed to
    // A plan (coli-place) names the tier's experts: they come first.
    if (f.has("plan")) {
      const coli::ModelSpec& ms = model->spec();
      const std::string plan_flag = f.get<std::string>("plan");
      coli::Plan plan;
      if (plan_flag == "auto") {  // planned here: this budget, the heat above, this machine's cached rates
        std::string file = coli::container_file_of(f.get<std::string>("model"));
        if (file.empty()) throw coli::UsageError("--plan auto needs a coli container (a checkpoint directory has no expert blobs to place)");
        const coli::Container pc(file);
        coli::PlannerInputs in = coli::planner_inputs(pc, ms, co.vram_budget, 0, co.n_ctx, plan_chunk, co.prefill_upload);
        in.ram_bytes = uint64_t(ms.num_layers) * ms.num_experts * in.expert_bytes;  // coli-run reads the others from RAM or disk alike
        in.heat = co.heat;
        in.chunks = {plan_chunk};  // the VRAM above holds this chunk's activations
        char host[256] = {};
        if (::gethostname(host, sizeof host - 1) != 0) host[0] = 0;
        std::string rates_from;
        in.rates = coli::cached_rates_for(std::getenv("XDG_CACHE_HOME"), std::getenv("HOME"), host, coli::expert_format_name(pc), &rates_from);
        coli::Prediction pr;
        plan = coli::plan_placement(in, &pr);
        if (verbose)
          std::fprintf(stderr, "coli-run: plan auto (rates: %s): predicted decode %.1f tok/s, hit rate %.3f\n",
                       rates_from.empty() ? "defaults; run coli-place probe" : rates_from.c_str(), pr.decode_tok_s, pr.hit_rate);
      } else {
        plan = *file_plan;
      }
      co.heat = coli::plan_as_heat(plan, co.heat);  // the plan's VRAM experts first, hottest first
      if (verbose)
        std::fprintf(stderr, "coli-run: plan %s: %lld experts for VRAM\n", f.get<std::string>("plan").c_str(), (long long)plan.count(coli::Tier::kVram));
      if (plan.prefill_chunk > 0 && !f.has("prefill-chunk")) plan_chunk = co.max_chunk = plan.prefill_chunk;
    }
  }
  // The mirror's pages: registered with the device when an option copies experts from them during the run.
  if (loaded.mirror) {
    co.host_regions.push_back({loaded.mirror->base(), loaded.mirror->size()});
    // coli-pin start --gpu: the keeper's device copy, read in place. Whole
    // runs only for now: a tier filled from it has not passed its GPU test.
    const uint8_t* data = nullptr;
    if (!f.has("vram-budget") && loaded.mirror->twin(&data, &co.twin.bytes, &co.twin.device, co.twin.handle)) co.twin.host = data;
  }
  if (context_maker.joinable()) context_maker.join();
  const auto t_backend = std::chrono::steady_clock::now();
  std::unique_ptr<coli::Backend> backend_ptr = coli::cuda::make_device_backend(device, *model, co, &why);
  if (!backend_ptr) {
    if (device == "auto" && coli::cuda::compiled_with_cuda() && verbose)
      std::fprintf(stderr, "coli-run: no CUDA device used (%s); running on the CPU\n", why.c_str());
    backend_ptr = std::make_unique<coli::cpu::CpuBackend>(*model, coli::cpu::CpuOptions{f.get<int>("threads"), !f.get<bool>("reference")});
  }
  coli::Backend& backend = *backend_ptr;
  if (const coli::TierStats t = backend.tier_stats(); pcie_read_asked && t.tiered && t.resident < t.experts && t.pcie_read == 0)
    std::fprintf(stderr, "coli-run: --pcie-read: no expert outside the tier is in a registered mirror (start coli-pin for this model): off\n");
  if (verbose) {  // where the start's time went (time to first token = this + the prompt)
    const auto now = std::chrono::steady_clock::now();
    std::string line = "coli-run: start: ready after " + fixed1(std::chrono::duration<double, std::milli>(now - t_start).count()) + " ms: load " +
                       fixed1(load_ms) + " ms, backend " +
                       fixed1(std::chrono::duration<double, std::milli>(now - t_backend).count()) + " ms";
    const auto phases = backend.start_phases();
    for (std::size_t i = 0; i < phases.size(); ++i) line += (i ? ", " : " (") + phases[i].first + " " + fixed1(phases[i].second);
    std::fprintf(stderr, "%s%s\n", line.c_str(), phases.empty() ? "" : ")");
  }
  coli::Engine engine(model->spec(), backend, plan_chunk);
  engine.set_heat(heat.run());
  auto save_heat = [&] {
    engine.collect_heat();
    if (loaded.mirror && heat.run()) loaded.mirror->add_heat(std::vector<uint64_t>(heat.run()->counts().begin(), heat.run()->counts().end()));
    heat.save();
  };
  const bool json = f.get<bool>("json");
  auto emit = [](const std::string& s) {
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
  };

  if (chat) {
    coli::ChatSession cs(engine, *tok, go, chat_options(f));
    cs.messages() = chat_messages(f);
    if (!f.get<bool>("interactive")) {
      if (!f.has("messages")) cs.messages().push_back({"user", prompt_text(f), {}});
      auto st = cs.respond(emit);
      emit("\n");
      print_stats(backend.name().c_str(), st, go.sampling.seed, go.n_ctx);
      save_heat();
      print_tier(backend.tier_stats());
      return 0;
    }
    const bool tty = ::isatty(0);
    std::string line;
    while (true) {
      if (tty) std::fprintf(stderr, "> ");
      if (!std::getline(std::cin, line) || line.empty()) break;
      cs.messages().push_back({"user", line, {}});
      auto st = cs.respond(emit);
      emit("\n");
      print_stats(backend.name().c_str(), st, go.sampling.seed, go.n_ctx);
  print_tier(backend.tier_stats());
    }
    save_heat();
    return 0;
  }

  if (!f.has("prompt-ids")) {
    prompt = tok->encode(prompt_text(f));
    for (int id : coli::tokenizer_stop_ids(*tok)) go.stop_ids.push_back(id);
  }
  const bool ids_out = f.has("prompt-ids");
  // With --json every record carries the text when there is a tokenizer, ids in or not.
  std::unique_ptr<coli::TextStreamer> streamer = tok && (!ids_out || json) ? std::make_unique<coli::TextStreamer>(*tok) : nullptr;
  bool first = true;
  coli::Session session = engine.new_session();
  auto st = coli::generate(engine, session, prompt, go, [&](const coli::TokenEvent& ev) {
    const std::string piece = streamer && !ev.is_stop ? streamer->push(ev.id) : std::string();
    if (json) {
      nlohmann::json j = {{"id", ev.id}, {"logprob", ev.logprob}};
      if (streamer) j["text"] = piece;
      if (go.top_logprobs > 0) {
        j["top_logprobs"] = nlohmann::json::array();
        for (auto [id, lp] : ev.top) j["top_logprobs"].push_back({{"id", id}, {"logprob", lp}});
      }
      emit(j.dump() + "\n");
    } else if (ids_out) {
      emit((first ? "" : " ") + std::to_string(ev.id));
    } else {
      emit(piece);
    }
    first = false;
  });
  if (streamer && !json) emit(streamer->flush());
  if (!json) emit("\n");
  print_stats(backend.name().c_str(), st, go.sampling.seed, go.n_ctx);
  save_heat();
  print_tier(backend.tier_stats());
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return coli::tool_main("coli-run", [&] { return run(argc, argv); }); }
