#include "bench/runner.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <span>

#include "engine/engine.h"
#include "engine/generate.h"
#include "formats/container.h"
#include "mirror/mirror_load.h"
#include "model/fingerprint.h"
#include "model/layer_tensors.h"
#include "placement/heat_recorder.h"
#include "tokenizer/tokenizer.h"
#include "util/build_info.h"
#include "util/error.h"
#include "util/io.h"
#include "util/parallel.h"

namespace coli {

using nlohmann::json;
using clock_type = std::chrono::steady_clock;

namespace {

struct Test {
  int n_prompt, n_gen, n_depth;
  int n_verify = 1;  // tokens a decode step feeds (> 1: a speculative verify step, logits of every row)
  int n_draft = 0;   // > 0: the tokens generated greedily with drafts by the MTP layer (engine/speculative.h)
  int n_parallel = 1;  // > 1: sessions stepped together (Engine::forward_rows)
  std::string name() const {
    std::string s = n_gen == 0 ? "pp" + std::to_string(n_prompt) : n_prompt == 0 ? "tg" + std::to_string(n_gen)
                                                                                 : "pp" + std::to_string(n_prompt) + "+tg" + std::to_string(n_gen);
    if (n_verify > 1) s += " x" + std::to_string(n_verify);
    if (n_draft > 0) s += " draft" + std::to_string(n_draft);
    if (n_parallel > 1) s += " p" + std::to_string(n_parallel);
    return n_depth ? s + " @ d" + std::to_string(n_depth) : s;
  }
};

// Bytes of weights a forward pass reads: the trunk of every layer, the
// routed experts it used, the lm_head rows it computed.
struct WeightBytes {
  double per_token_fixed = 0;                // trunk + shared + router of all layers, embedding row
  std::vector<std::vector<double>> experts;  // [layer][expert]
  std::vector<double> expert_mean;           // [layer]: mean bytes of one expert
  double lm_head = 0;
  double total = 0;
  double params = 0;

  explicit WeightBytes(const Model& m) {
    const auto& s = m.spec();
    auto add = [&](const Matrix& x) {
      per_token_fixed += static_cast<double>(x.bytes());
      params += double(x.rows) * double(x.cols);
    };
    for (int l = 0; l < s.num_layers; ++l) {
      experts.emplace_back(s.num_experts, 0.0);
      for (const TensorDesc& t : layer_tensors(s, l)) {
        if (t.form != TensorForm::kMatrix) continue;
        const Matrix& x = matrix_of(m, t);
        if (t.expert < 0) add(x);
        else experts.back()[t.expert] += double(x.bytes()), params += double(x.rows * x.cols);
      }
    }
    lm_head = double(m.lm_head().bytes());
    const double embed = double(m.embed().bytes());
    params += double(m.lm_head().rows) * m.lm_head().cols + double(m.embed().rows) * m.embed().cols;
    total = per_token_fixed + lm_head + embed;
    for (const auto& l : experts) {
      total += std::accumulate(l.begin(), l.end(), 0.0);
      expert_mean.push_back(l.empty() ? 0.0 : std::accumulate(l.begin(), l.end(), 0.0) / l.size());
    }
    per_token_fixed += embed / m.embed().rows;
  }
};

double mean(const std::vector<double>& v) { return v.empty() ? NAN : std::accumulate(v.begin(), v.end(), 0.0) / double(v.size()); }
double stddev(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  const double m = mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / double(v.size() - 1));
}
double percentile(std::vector<double> v, double p) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const double pos = p * double(v.size() - 1);
  const std::size_t i = static_cast<std::size_t>(pos);
  const double f = pos - double(i);
  return i + 1 < v.size() ? v[i] * (1 - f) + v[i + 1] * f : v[i];
}

struct Loaded {
  std::string path;
  std::shared_ptr<MirrorAttachment> mirror;  // before the model: outlives it
  std::unique_ptr<Model> model;
  std::unique_ptr<WeightBytes> bytes;
  std::string fingerprint, type;
  std::vector<int> text_ids;
  std::unique_ptr<HeatRecorder> heat;  // the model's routing heat (BenchOptions::heat_path)
  std::string warning;                 // LoadedModel::warning
};

// The tests of every configuration, in the order the records come: per
// depth, the pp tests, the tg tests, the pp+tg tests.
std::vector<Test> tests_of(const BenchOptions& opt) {
  std::vector<Test> tests;
  for (int d : opt.n_depth) {
    for (int p : opt.n_prompt)
      if (p > 0) tests.push_back({p, 0, d});
    for (int n : opt.n_gen) {
      for (int v : opt.n_verify)
        if (n > 0) tests.push_back({0, n, d, v});
      for (int k : opt.draft)
        if (n > 0 && k > 0) tests.push_back({0, n, d, 1, k});
      for (int p : opt.n_parallel)
        if (n > 0 && p > 1) tests.push_back({0, n, d, 1, 0, p});
    }
    for (auto [p, n] : opt.prompt_gen) tests.push_back({p, n, d});
  }
  return tests;
}

// Loads model_path into a fresh Loaded: weights (from its mirror when there
// is one), the bytes a pass reads, the heat file, the prompt file's ids.
void load(Loaded& cur, const std::string& model_path, const BenchOptions& opt, std::FILE* log) {
  LoadedModel lm = load_model(model_path, opt.mirror);
  cur.mirror = lm.mirror, cur.model = std::move(lm.model), cur.warning = lm.warning;
  if (log && cur.mirror) std::fprintf(log, "coli-bench: %s: weights from mirror %s\n", model_path.c_str(), cur.mirror->name().c_str());
  cur.path = model_path;
  cur.bytes = std::make_unique<WeightBytes>(*cur.model);
  const uint64_t fp = model_fingerprint(model_path);
  cur.fingerprint = hex64(fp);
  cur.heat = std::make_unique<HeatRecorder>(opt.heat_path ? opt.heat_path(fp) : std::string(), fp, cur.model->spec());
  const ModelSpec& spec = cur.model->spec();
  const auto& e0 = cur.model->layer(spec.first_sparse_layer()).moe.experts[0].gate;
  cur.type = std::string(family_name(spec.family)) + " " + std::to_string(spec.num_layers) + "L " + format_name(e0.format);
  if (!opt.prompt_file.empty()) {
    const std::string text = read_text_file(opt.prompt_file);  // the file's own problem first
    auto tok = Tokenizer::load(model_path);
    check_tokenizer_matches(*tok, model_path, cur.model->spec().vocab_size, model_path);
    cur.text_ids = tok->encode(text);
    if (cur.text_ids.empty()) throw Error(opt.prompt_file + ": no tokens");
  }
}

// One test's token ids: depth, prompt and generation, drawn in that order
// from a generator seeded alike for every test (or the prompt file's ids).
struct TestIds {
  std::vector<int> depth, prompt, gen;
  TestIds(const Test& t, const Loaded& cur, uint64_t seed) {
    const int V = cur.model->spec().vocab_size;
    std::mt19937_64 rng(seed);
    auto ids = [&](int n) {
      std::vector<int> v(n);
      for (int i = 0; i < n; ++i) v[i] = cur.text_ids.empty() ? static_cast<int>(rng() % V) : cur.text_ids[i % cur.text_ids.size()];
      return v;
    };
    depth = ids(t.n_depth), prompt = ids(t.n_prompt), gen = ids(t.n_gen * t.n_verify * t.n_parallel);
  }
};

// What the timed repetitions of one test add up.
struct Samples {
  std::vector<double> ns, ts, ttft, latencies;
  double expert_bytes = 0, tokens = 0;  // routed experts' bytes read, over these tokens
  StageTimes stages{};
  // The expert tier's counters over the timed parts only (not depth, not warm-up).
  long long tier_pairs = 0, tier_misses = 0, tier_pcie = 0, tier_split = 0;
  double tier_host_ms = 0, tier_wait_ms = 0, tier_gpu_ms = 0, tier_host_bytes = 0, tier_swap_bytes = 0, tier_upload_wait_ms = 0;
  double placed[3] = {};  // prompt chunks' experts in uploading layers: resident, uploaded, host
  double tier_pcie_bytes = 0, secs = 0;  // decode steps' expert bytes over PCIe (TierStats::pcie_expert_bytes); the timed seconds
  double drafted = 0, accepted = 0, rounds = 0, mtp_secs = 0;  // draft tests (GenerateStats)

  // A timed repetition of n_tok tokens in `seconds`: its time, rate, stages and expert bytes.
  void add_repetition(double seconds, double n_tok, const StageTimes& st, double bytes) {
    ns.push_back(seconds * 1e9);
    secs += seconds;
    ts.push_back(n_tok / seconds);
    add_stages(st);
    expert_bytes += bytes;
    tokens += n_tok;
  }
  void add_stages(const StageTimes& st) {
    stages.embed += st.embed, stages.trunk += st.trunk, stages.router += st.router, stages.shared += st.shared;
    stages.experts += st.experts, stages.combine += st.combine, stages.lm_head += st.lm_head;
  }
  void add_tier(const TierStats& tier0, const TierStats& tier1) {
    tier_pairs += tier1.pairs - tier0.pairs, tier_misses += tier1.misses - tier0.misses;
    tier_pcie += tier1.pcie_misses - tier0.pcie_misses, tier_split += tier1.split_misses - tier0.split_misses;
    tier_host_ms += tier1.host_experts_ms - tier0.host_experts_ms, tier_wait_ms += tier1.device_wait_ms - tier0.device_wait_ms;
    tier_host_bytes += double(tier1.host_expert_bytes - tier0.host_expert_bytes);
    tier_pcie_bytes += double(tier1.pcie_expert_bytes - tier0.pcie_expert_bytes);
    tier_swap_bytes += double(tier1.swap_bytes - tier0.swap_bytes) + double(tier1.prefill_upload_bytes - tier0.prefill_upload_bytes);
    tier_gpu_ms += tier1.device_experts_ms - tier0.device_experts_ms;
    tier_upload_wait_ms += tier1.prefill_wait_ms - tier0.prefill_wait_ms;
    placed[0] += double(tier1.prefill_placed_resident - tier0.prefill_placed_resident);
    placed[1] += double(tier1.prefill_placed_uploaded - tier0.prefill_placed_uploaded);
    placed[2] += double(tier1.prefill_placed_host - tier0.prefill_placed_host) - double(tier1.prefill_hot_pcie - tier0.prefill_hot_pcie);
  }
};

// The routed experts' bytes one repetition's forward calls read (timed
// ones only): each expert a call routes to, once per call.
struct ExpertReads {
  const Loaded& cur;
  int n_ubatch;
  bool timed;
  // A backend that runs whole chunks on its device does not hand the
  // routing back: count min(E, T*K) experts of average size per layer
  // (exact for a decode token, whose top-k are distinct; for a prompt
  // chunk nearly every expert is hit anyway).
  bool observable;
  double bytes = 0;
  std::vector<std::vector<char>> used;  // [layer][expert]: used by this call

  void observe(int layer, int T, const int* idx) {
    if (!timed) return;
    if (used.size() <= static_cast<std::size_t>(layer)) used.resize(layer + 1);
    used[layer].assign(cur.bytes->experts[layer].size(), 0);
    for (int i = 0; i < T * cur.model->spec().num_experts_per_tok; ++i)
      if (!used[layer][idx[i]]) {
        used[layer][idx[i]] = 1;
        bytes += cur.bytes->experts[layer][idx[i]];
      }
  }
  std::vector<float> hidden;  // a verify step's hidden rows
  void estimate(int T) {
    if (!timed) return;
    const double picks = double(T) * cur.model->spec().num_experts_per_tok;
    for (std::size_t l = 0; l < cur.bytes->experts.size(); ++l) bytes += std::min<double>(cur.bytes->experts[l].size(), picks) * cur.bytes->expert_mean[l];
  }
  // all_logits: every row's logits (a verify step's), else the last's.
  void forward(Engine& engine, Session& s, std::span<const int> tokens, bool all_logits = false) {
    if (all_logits) {  // the tier's counters and the estimate cover its experts
      // With an MTP module, as generate_speculative verifies: in a marked
      // window (a device's window graph, misses to the host), the hidden
      // rows kept, every token kept at the rewind.
      if (engine.has_mtp()) engine.mark(s);
      engine.forward_all(s, tokens, engine.has_mtp() ? &hidden : nullptr);
      if (engine.has_mtp()) engine.rewind(s, s.n_past);
      estimate(static_cast<int>(tokens.size()));
      return;
    }
    if (observable) {
      engine.forward(s, tokens, [this](int layer, int T, const int* idx, const float*) { observe(layer, T, idx); });
      return;
    }
    engine.forward(s, tokens);
    for (std::size_t i = 0; i < tokens.size(); i += n_ubatch) estimate(static_cast<int>(std::min<std::size_t>(n_ubatch, tokens.size() - i)));
  }
};

// A draft test's repetition: the depth (or the first id) as the prompt,
// then n_gen tokens generated greedily with t.n_draft drafts a step; the
// decode part timed (the prompt's and the first token's time is not).
void run_draft_repetition(Engine& engine, Backend& backend, const Test& t, const TestIds& ids, bool timed, bool tiered, Samples& sm) {
  Session s = engine.new_session();
  GenerateOptions o;
  o.n_predict = t.n_gen + 1, o.draft = t.n_draft, o.ignore_eos = true, o.logprobs = false;
  o.sampling.temperature = 0;
  const std::vector<int> prompt = t.n_depth ? ids.depth : std::vector<int>(ids.gen.begin(), ids.gen.begin() + 1);
  const TierStats tier0 = tiered && timed ? backend.tier_stats() : TierStats{};
  const GenerateStats st = generate(engine, s, prompt, o, [](const TokenEvent&) {});
  if (!timed) return;
  if (tiered) sm.add_tier(tier0, backend.tier_stats());
  const int n = st.n_generated - 1;
  sm.ns.push_back(st.decode_seconds * 1e9);
  sm.secs += st.decode_seconds;
  sm.ts.push_back(n / std::max(st.decode_seconds, 1e-9));
  sm.tokens += n;
  sm.drafted += st.n_drafted, sm.accepted += st.n_accepted, sm.rounds += st.n_rounds, sm.mtp_secs += st.mtp_seconds;
}

// A parallel test's repetition: P sessions (each the depth's tokens first,
// untimed), then n_gen steps of all P as one forward_rows call each; the
// ids of step i are gen[i P .. i P + P). Expert bytes are estimated (a rows
// step does not hand its routing back).
void run_parallel_repetition(Engine& engine, Backend& backend, const Loaded& cur, const Test& t, const TestIds& ids, bool timed, bool tiered,
                             Samples& sm) {
  const int P = t.n_parallel;
  std::vector<Session> sessions;
  std::vector<Session*> rows;
  for (int r = 0; r < P; ++r) sessions.push_back(engine.new_session());
  for (Session& s : sessions) {
    if (t.n_depth) engine.forward(s, ids.depth);
    rows.push_back(&s);
  }
  engine.stage_times() = StageTimes{};
  engine.set_timing(timed);
  ExpertReads reads{cur, 1, timed, false, 0, {}, {}};
  const TierStats tier0 = tiered && timed ? backend.tier_stats() : TierStats{};
  const auto t0 = clock_type::now();
  std::vector<float> logits;  // the rows where coli-serve reads them: the backend's own host buffer, or one buffer for every step
  for (int i = 0; i < t.n_gen; ++i) {
    const auto s0 = clock_type::now();
    engine.forward_rows_view(rows, std::span<const int>(&ids.gen[std::size_t(i) * P], P), logits);
    reads.estimate(P);
    const double dt = std::chrono::duration<double>(clock_type::now() - s0).count();
    if (timed) {
      sm.latencies.push_back(dt);
      if (i == 0) sm.ttft.push_back(dt);
    }
  }
  const double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
  engine.set_timing(false);
  if (!timed) return;
  if (tiered) sm.add_tier(tier0, backend.tier_stats());
  sm.add_repetition(secs, double(t.n_gen) * P, engine.stage_times(), reads.bytes);
}

// One repetition of test t (the warm-up when not timed), into sm; tiered:
// the backend has an expert tier, whose counters sm takes too.
void run_repetition(Engine& engine, Backend& backend, const Loaded& cur, const Test& t, const TestIds& ids, int n_ubatch, bool timed, bool tiered,
                    Samples& sm) {
  if (t.n_draft > 0) return run_draft_repetition(engine, backend, t, ids, timed, tiered, sm);
  if (t.n_parallel > 1) return run_parallel_repetition(engine, backend, cur, t, ids, timed, tiered, sm);
  Session s = engine.new_session();
  if (t.n_depth) engine.forward(s, ids.depth);
  engine.stage_times() = StageTimes{};
  engine.set_timing(timed);
  ExpertReads reads{cur, n_ubatch, timed, !backend.runs_whole_chunks(), 0, {}, {}};
  const TierStats tier0 = tiered && timed ? backend.tier_stats() : TierStats{};
  const auto t0 = clock_type::now();
  if (t.n_prompt) {
    reads.forward(engine, s, ids.prompt);
    if (timed) sm.ttft.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  for (int i = 0; i < t.n_gen; ++i) {
    const auto s0 = clock_type::now();
    reads.forward(engine, s, std::span<const int>(&ids.gen[std::size_t(i) * t.n_verify], t.n_verify), t.n_verify > 1);
    const double dt = std::chrono::duration<double>(clock_type::now() - s0).count();
    if (timed) {
      sm.latencies.push_back(dt);
      if (!t.n_prompt && i == 0) sm.ttft.push_back(dt);
    }
  }
  const double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
  engine.set_timing(false);
  if (!timed) return;
  if (tiered) sm.add_tier(tier0, backend.tier_stats());
  sm.add_repetition(secs, t.n_prompt + t.n_gen, engine.stage_times(), reads.bytes);
}

// The record's times: per repetition, to the first token, per decode step.
void write_times(json& rec, const Samples& sm) {
  rec["avg_ns"] = static_cast<uint64_t>(mean(sm.ns));
  rec["stddev_ns"] = static_cast<uint64_t>(stddev(sm.ns));
  rec["avg_ts"] = mean(sm.ts);
  rec["stddev_ts"] = stddev(sm.ts);
  json sn = json::array(), sts = json::array();
  for (double x : sm.ns) sn.push_back(static_cast<uint64_t>(x));
  for (double x : sm.ts) sts.push_back(x);
  rec["samples_ns"] = sn;
  rec["samples_ts"] = sts;
  rec["ttft_ms"] = mean(sm.ttft) * 1e3;
  if (!sm.latencies.empty()) {
    rec["latency_p50_ms"] = percentile(sm.latencies, 0.50) * 1e3;
    rec["latency_p90_ms"] = percentile(sm.latencies, 0.90) * 1e3;
    rec["latency_p99_ms"] = percentile(sm.latencies, 0.99) * 1e3;
  }
}

// The bytes read per token and the stages' times per repetition.
void write_bytes_and_stages(json& rec, const Samples& sm, const Test& t, const WeightBytes& wb, int n_ubatch, double reps) {
  rec["peak_ram_mb"] = peak_rss_mb();
  // Weights read per token: trunk and lm_head once per forward row
  // (decode: every token; prefill: once per chunk), experts as used.
  const double calls = t.n_gen + (t.n_prompt ? std::ceil(double(t.n_prompt) / n_ubatch) : 0);
  rec["bytes_read_per_token"] = (sm.expert_bytes + reps * calls * (wb.per_token_fixed + wb.lm_head)) / sm.tokens;
  rec["bytes_uploaded_per_token"] = 0;
  rec["t_trunk_ms"] = (sm.stages.trunk + sm.stages.embed) / reps * 1e3;
  rec["t_router_ms"] = sm.stages.router / reps * 1e3;
  rec["t_cpu_experts_ms"] = sm.stages.experts / reps * 1e3;
  rec["t_gpu_experts_ms"] = 0;
  rec["t_shared_ms"] = sm.stages.shared / reps * 1e3;
  rec["t_combine_ms"] = sm.stages.combine / reps * 1e3;
  rec["t_lm_head_ms"] = sm.stages.lm_head / reps * 1e3;
  rec["t_upload_ms"] = 0;
  rec["t_wait_ms"] = 0;
}

// The expert tier's fields (a backend with a tier).
void write_tier(json& rec, const Samples& sm, const TierStats& ts, double reps) {
  rec["peak_vram_mb"] = static_cast<double>(ts.vram_peak) / (1 << 20);
  rec["tier_resident"] = ts.experts ? double(ts.resident) / double(ts.experts) : 1.0;
  rec["tier_hit_rate"] = sm.tier_pairs ? 1.0 - double(sm.tier_misses) / double(sm.tier_pairs) : 1.0;
  rec["tier_pcie_read"] = ts.pcie_read_share;
  rec["tier_pcie_pairs"] = sm.tier_pairs ? double(sm.tier_pcie) / double(sm.tier_pairs) : 0.0;
  rec["tier_split_pairs"] = sm.tier_pairs ? double(sm.tier_split) / double(sm.tier_pairs) : 0.0;  // experts split by rows with the host (of the misses)
  rec["host_bytes_per_token"] = sm.tier_host_bytes / sm.tokens;
  rec["bytes_uploaded_per_token"] = sm.tier_swap_bytes / sm.tokens;  // the tier's swaps and prompt uploads
  rec["t_cpu_experts_ms"] = sm.tier_host_ms / reps;
  rec["t_wait_ms"] = sm.tier_wait_ms / reps;
  rec["t_gpu_experts_ms"] = sm.tier_gpu_ms / reps;  // the layers with a handoff
  rec["t_upload_ms"] = sm.tier_upload_wait_ms / reps;  // prompt chunks' expert kernels waiting for staged copies
  // Where the time went against the machine: the GPU's wait for the CPU as
  // a share of the test's time, the CPU's expert reads in GB/s while it
  // computed them, and every expert byte that crossed PCIe per token.
  rec["gpu_wait_share"] = sm.secs > 0 ? sm.tier_wait_ms / 1e3 / sm.secs : 0.0;
  rec["cpu_expert_gbs"] = sm.tier_host_ms > 0 ? sm.tier_host_bytes / (sm.tier_host_ms / 1e3) / 1e9 : 0.0;
  rec["pcie_bytes_per_token"] = (sm.tier_pcie_bytes + sm.tier_swap_bytes) / sm.tokens;
  rec["prompt_experts_resident"] = sm.placed[0] / reps;
  rec["prompt_experts_uploaded"] = sm.placed[1] / reps;
  rec["prompt_experts_cpu"] = sm.placed[2] / reps;
}

// Test t measured into rec: the warm-up, then the timed repetitions.
void measure(json& rec, const Test& t, Engine& engine, Backend& backend, const Loaded& cur, int n_ubatch, const BenchOptions& opt) {
  const int max_pos = cur.model->spec().max_position_embeddings;
  if (max_pos > 0 && int64_t(t.n_depth) + t.n_prompt + int64_t(t.n_gen) * t.n_verify > max_pos)
    throw Error("depth " + std::to_string(t.n_depth) + " + prompt " + std::to_string(t.n_prompt) + " + generation " + std::to_string(t.n_gen) +
                " tokens exceed the model's context of " + std::to_string(max_pos) + " (max_position_embeddings)");
  const TestIds ids(t, cur, opt.seed);
  const bool tiered = backend.tier_stats().tiered;
  Samples sm;
  for (int rep = opt.warmup ? -1 : 0; rep < opt.repetitions; ++rep) {
    if (opt.vary_prompt && cur.text_ids.empty() && rep >= 0) {
      run_repetition(engine, backend, cur, t, TestIds(t, cur, opt.seed + 1 + static_cast<uint64_t>(rep)), n_ubatch, true, tiered, sm);
      continue;
    }
    run_repetition(engine, backend, cur, t, ids, n_ubatch, rep >= 0, tiered, sm);
  }
  const double reps = std::max(1, opt.repetitions);
  write_times(rec, sm);
  write_bytes_and_stages(rec, sm, t, *cur.bytes, n_ubatch, reps);
  if (tiered) write_tier(rec, sm, backend.tier_stats(), reps);
  if (t.n_draft > 0) {
    rec["draft_accept_rate"] = sm.drafted ? sm.accepted / sm.drafted : 0.0;
    rec["draft_tokens_per_step"] = sm.rounds ? sm.tokens / sm.rounds : 0.0;
    rec["t_mtp_ms"] = sm.mtp_secs / reps * 1e3;
  }
}

std::string utc_now() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char ts[32];
  std::strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return ts;
}

// One configuration of the cartesian product.
struct Config {
  std::string model_path;
  int threads_req, n_batch, n_ubatch;
  uint64_t vram_budget;
};

// The whole run: the model loaded now (kept while the configurations use
// it), the failures so far.
class BenchRun {
 public:
  BenchRun(const BenchOptions& opt, const BackendFactory& make_backend, RecordWriter& out, std::FILE* log)
      : opt_(opt), make_backend_(make_backend), out_(out), log_(log), tests_(tests_of(opt)), commit_(build_commit()), cpu_(cpu_info()) {}

  void run(const Config& c);
  // The heat of the model in cur_ merged into its file: before cur_ changes, and at the end.
  void save_heat();
  int failures() const { return failures_; }

 private:
  json base_record(const Config& c) const;
  void start(const Config& c, json& base, std::unique_ptr<Backend>& backend, std::unique_ptr<Engine>& engine, int* n_ubatch);
  void write_records(const Config& c, int n_ubatch, const json& base, const std::string& error, Engine* engine, Backend* backend);

  const BenchOptions& opt_;
  const BackendFactory& make_backend_;
  RecordWriter& out_;
  std::FILE* log_;
  const std::vector<Test> tests_;
  const std::string commit_, cpu_;
  int failures_ = 0;
  Loaded cur_;
  std::set<std::pair<std::string, std::string>> said_;  // (model, error) lines on stderr so far
  // A failure's cause, on stderr once however many configurations and tests
  // it stops (each record carries it too): the exit status alone says only
  // that records failed, not why.
  void say(const std::string& model, const std::string& error) {
    if (said_.insert({model, error}).second) std::fprintf(stderr, "coli-bench: %s: %s\n", model.c_str(), error.c_str());
  }
};

void BenchRun::save_heat() {
  if (!cur_.heat) return;
  try {
    if (cur_.mirror && cur_.heat->run()) cur_.mirror->add_heat(std::vector<uint64_t>(cur_.heat->run()->counts().begin(), cur_.heat->run()->counts().end()));
    cur_.heat->save();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coli-bench: %s\n", e.what());
    ++failures_;
  }
  cur_.heat.reset();
}

json BenchRun::base_record(const Config& c) const {
  const int threads = c.threads_req > 0 ? c.threads_req : default_threads();
  json base = {{"build_commit", commit_}, {"cpu_info", cpu_}, {"gpu_info", ""}, {"backends", "CPU"}, {"model_filename", c.model_path},
               {"n_batch", c.n_batch}, {"n_ubatch", c.n_ubatch}, {"n_threads", threads}, {"repetitions", opt_.repetitions}};
  return base;
}

// The model (loaded when it changes), the backend and the engine of c.
void BenchRun::start(const Config& c, json& base, std::unique_ptr<Backend>& backend, std::unique_ptr<Engine>& engine, int* n_ubatch) {
  if (cur_.path != c.model_path || !cur_.model) {
    save_heat();
    cur_ = Loaded{};
    load(cur_, c.model_path, opt_, log_);
    if (!cur_.warning.empty()) say(c.model_path, cur_.warning);
  }
  if (c.n_ubatch < 0) throw Error("n_ubatch must be >= 1 (0: chosen)");
  const int sequences = std::max(1, *std::max_element(opt_.n_parallel.begin(), opt_.n_parallel.end()));
  BenchBackend made =
      make_backend_({cur_.model.get(), cur_.mirror.get(), c.model_path, c.threads_req, c.vram_budget, c.n_ubatch, cur_.heat.get(), sequences});
  if (made.n_ubatch < 1) throw Error("the backend factory chose no chunk size");
  backend = std::move(made.backend);
  *n_ubatch = made.n_ubatch;
  base["n_ubatch"] = made.n_ubatch;
  if (made.fields.is_object()) base.update(made.fields);
  engine = std::make_unique<Engine>(cur_.model->spec(), *backend, made.n_ubatch);
  engine->set_heat(cur_.heat->run());
  base["n_threads"] = backend->num_threads();  // what it computes with, not what was asked
  base["backends"] = backend->name();
}

// A record per test: measured, or carrying the error that stopped it.
void BenchRun::write_records(const Config& c, int n_ubatch, const json& base, const std::string& error, Engine* engine, Backend* backend) {
  const int threads = c.threads_req > 0 ? c.threads_req : default_threads();
  for (const Test& t : tests_) {
    json rec = base;
    rec["test"] = t.name();
    rec["n_prompt"] = t.n_prompt;
    rec["n_gen"] = t.n_gen;
    rec["n_verify"] = t.n_verify;
    rec["n_draft"] = t.n_draft;
    rec["n_parallel"] = t.n_parallel;
    rec["n_depth"] = t.n_depth;
    rec["test_time"] = utc_now();
    if (!error.empty()) {
      rec["error"] = error;
      out_.write(rec);
      ++failures_;
      continue;
    }
    if (log_) std::fprintf(log_, "coli-bench: %s %s t=%d ub=%d\n", c.model_path.c_str(), t.name().c_str(), threads, n_ubatch);
    try {
      measure(rec, t, *engine, *backend, cur_, n_ubatch, opt_);
    } catch (const std::exception& e) {
      rec["error"] = e.what();
      say(c.model_path, e.what());
      ++failures_;
    }
    out_.write(rec);
  }
}

void BenchRun::run(const Config& c) {
  json base = base_record(c);
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Engine> engine;
  std::string error;
  int n_ubatch = c.n_ubatch;
  try {
    start(c, base, backend, engine, &n_ubatch);
  } catch (const std::exception& e) {
    error = e.what();
    say(c.model_path, error);
    save_heat();
    cur_ = Loaded{};
  }
  if (cur_.model) {
    base["model_type"] = cur_.type;
    base["model_size"] = static_cast<uint64_t>(cur_.bytes->total);
    base["model_n_params"] = static_cast<uint64_t>(cur_.bytes->params);
    base["model_fingerprint"] = cur_.fingerprint;
  }
  write_records(c, n_ubatch, base, error, engine.get(), backend.get());
  if (engine && cur_.heat) {
    try {
      engine->collect_heat();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "coli-bench: routing heat: %s\n", e.what());
      ++failures_;
    }
  }
}

}  // namespace

int run_bench(const BenchOptions& opt, const BackendFactory& make_backend, RecordWriter& out, std::FILE* log) {
  BenchRun bench(opt, make_backend, out, log);
  for (const auto& model_path : opt.models)
    for (int threads_req : opt.threads)
      for (int n_batch : opt.n_batch)
        for (int n_ubatch : opt.n_ubatch)
          for (uint64_t vram_budget : opt.vram_budget) bench.run({model_path, threads_req, n_batch, n_ubatch, vram_budget});
  bench.save_heat();
  return bench.failures();
}

}  // namespace coli
