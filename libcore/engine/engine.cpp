#include "engine/engine.h"

#include <algorithm>
#include <chrono>

#include "util/buffer.h"
#include "util/error.h"

namespace coli {

void Backend::forward_chunk(BackendState&, const int*, int, int, int, float*) {
  throw Error("backend " + name() + " does not run whole chunks");
}

void Backend::start_chunk(BackendState&, const int* ids, int T, int pos0, int logit_rows) { pending_ = {ids, T, pos0, logit_rows}; }

void Backend::finish_chunk(BackendState& state, float* logits) {
  const PendingChunk p = pending_;
  pending_ = {};
  if (!p.ids) throw Error("backend " + name() + ": finish_chunk without start_chunk");
  forward_chunk(state, p.ids, p.T, p.pos0, p.logit_rows, logits);
}

void Backend::add_moe_output(std::size_t n, const float* routed, const float* shared, float* x) {
  for (std::size_t i = 0; i < n; ++i) x[i] += routed[i] + shared[i];
}

void Backend::output_norm(int, const float*, float*, bool) { throw Error("backend " + name() + " does not run the MTP layer"); }
void Backend::lm_head(int, const float*, float*) { throw Error("backend " + name() + " does not run the MTP layer"); }
void Backend::mtp_input(int, const float*, const float*, float*) { throw Error("backend " + name() + " does not run the MTP layer"); }
void Backend::mark_state(BackendState&) { throw Error("backend " + name() + " cannot rewind a session (speculative decoding)"); }
void Backend::rewind_state(BackendState&, int) { throw Error("backend " + name() + " cannot rewind a session (speculative decoding)"); }

void Backend::trunk_rows(int layer, BackendState* const* states, const int* positions, int S, int hidden, float* x) {
  for (int i = 0; i < S; ++i) trunk_step(layer, *states[i], positions[i], 1, x + static_cast<std::size_t>(i) * hidden);
}

struct Engine::Scratch {
  Buffer<float> hn, shared, routed;
  std::vector<int> idx;
  std::vector<float> w;
  std::vector<ExpertPair> pairs;
  Scratch(int T, int H, int K)
      : hn(static_cast<std::size_t>(T) * H), shared(hn.size()), routed(hn.size()), idx(static_cast<std::size_t>(T) * K), w(idx.size()), pairs(idx.size()) {}
};

Engine::Engine(const ModelSpec& spec, Backend& backend, int prefill_chunk)
    : spec_(spec), backend_(backend), prefill_chunk_(std::max(1, prefill_chunk)) {}

void Engine::set_heat(Heat* heat) {
  if (heat && (heat->layers() != spec_.num_layers || heat->experts() != spec_.num_experts))
    throw Error("heat of " + std::to_string(heat->layers()) + " x " + std::to_string(heat->experts()) + " for a model of " +
                std::to_string(spec_.num_layers) + " layers x " + std::to_string(spec_.num_experts) + " experts (internal)");
  collect_heat();  // the old heat gets what the device counted for it
  heat_ = heat;
  // Drains what the device counted so far; false: count on the per-layer path.
  device_heat_ = backend_.runs_whole_chunks() && backend_.read_heat(heat_buf_);
}

void Engine::collect_heat() {
  if (!heat_ || !device_heat_ || !backend_.read_heat(heat_buf_)) return;
  heat_->add_counts(heat_buf_);
}

Session Engine::new_session() const {
  Session s;
  s.state = backend_.new_state();
  return s;
}

std::vector<float> Engine::forward(Session& s, std::span<const int> tokens, const RouteObserver& observe, std::vector<float>* hidden) {
  return run(s, tokens, /*all_logits=*/false, observe, hidden);
}

std::vector<float> Engine::forward_all(Session& s, std::span<const int> tokens, std::vector<float>* hidden) {
  return run(s, tokens, /*all_logits=*/true, {}, hidden);
}

void Engine::check_ids(std::span<const int> ids) const {
  for (int id : ids)
    if (id < 0 || id >= spec_.vocab_size)
      throw Error("token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(spec_.vocab_size) + ")");
}

std::vector<float> Engine::run(Session& s, std::span<const int> tokens, bool all_logits, const RouteObserver& observe, std::vector<float>* hidden) {
  if (tokens.empty()) throw Error("forward: no tokens");
  check_ids(tokens);
  if (hidden) hidden->clear();
  std::vector<float> logits;
  for (std::size_t i = 0; i < tokens.size(); i += prefill_chunk_) {
    const int T = static_cast<int>(std::min<std::size_t>(prefill_chunk_, tokens.size() - i));
    const bool last = i + T == tokens.size();
    const Logits want = all_logits ? Logits::kAll : last ? Logits::kLast : Logits::kNone;
    auto l = forward_chunk(s, tokens.data() + i, T, want, observe, hidden);
    if (logits.empty()) logits = std::move(l);  // one chunk (every decode step): no copy
    else logits.insert(logits.end(), l.begin(), l.end());
  }
  return logits;
}

std::vector<float> Engine::mtp_forward(Session& s, std::span<const int> ids, const float* h, int pos0, bool all_logits, std::vector<float>* g) {
  if (!has_mtp()) throw Error("the model has no MTP module (mtp.* tensors)");
  if (ids.empty()) throw Error("mtp_forward: no tokens");
  check_ids(ids);
  const int T = static_cast<int>(ids.size()), H = spec_.hidden_size, L = spec_.mtp_layer();
  const auto t0 = std::chrono::steady_clock::now();
  // Its steps are charged to the mtp stage alone, not to trunk, experts, ...
  struct Restore {
    bool& flag;
    const bool was;
    ~Restore() { flag = was; }
  } restore{timing_, timing_};
  timing_ = false;
  if (T > prefill_chunk_) {  // a long prompt's rows: in chunks, as the main model took them
    std::vector<float> logits, part;
    if (g) g->clear();
    for (int i = 0; i < T; i += prefill_chunk_) {
      const int n = std::min(prefill_chunk_, T - i);
      auto l = mtp_forward(s, ids.subspan(i, n), h + static_cast<std::size_t>(i) * H, pos0 + i, all_logits, g ? &part : nullptr);
      if (all_logits || i + n == T) logits.insert(logits.end(), l.begin(), l.end());
      if (g) g->insert(g->end(), part.begin(), part.end());
    }
    if (restore.was) times_.mtp += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return logits;
  }
  const int rows = all_logits ? T : 1;
  std::vector<float> logits(static_cast<std::size_t>(rows) * spec_.vocab_size);
  if (g) g->resize(static_cast<std::size_t>(T) * H);
  if (backend_.mtp_chunk(*s.state, ids.data(), h, T, pos0, rows, logits.data(), g ? g->data() : nullptr)) {
    if (restore.was) times_.mtp += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return logits;
  }
  Buffer<float> e(static_cast<std::size_t>(T) * H), x(e.size()), out(e.size());
  backend_.embed(ids.data(), T, e.data());
  backend_.mtp_input(T, e.data(), h, x.data());
  Scratch scratch(T, H, spec_.num_experts_per_tok);
  run_layer(L, T, x.data(), [&](int l, float* xl) { backend_.trunk_step(l, *s.state, pos0, T, xl); }, {}, scratch);
  backend_.output_norm(T, x.data(), out.data(), /*mtp=*/true);
  backend_.lm_head(rows, out.data() + static_cast<std::size_t>(T - rows) * H, logits.data());
  if (g) g->assign(out.data(), out.data() + out.size());
  if (restore.was) times_.mtp += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return logits;
}

void Engine::mark(Session& s) {
  backend_.mark_state(*s.state);
  s.mark = s.n_past;
}

void Engine::rewind(Session& s, int n_past) {
  if (s.mark < 0) throw Error("rewind without mark (internal)");
  if (n_past < s.mark || n_past > s.n_past)
    throw Error("rewind to " + std::to_string(n_past) + " tokens outside [" + std::to_string(s.mark) + ", " + std::to_string(s.n_past) + "] (internal)");
  backend_.rewind_state(*s.state, n_past - s.mark);
  s.n_past = n_past;
  s.mark = -1;
}

std::vector<float> Engine::forward_rows(std::span<Session* const> sessions, std::span<const int> ids) {
  std::vector<float> logits;
  forward_rows(sessions, ids, logits);
  return logits;
}

void Engine::forward_rows(std::span<Session* const> sessions, std::span<const int> ids, std::vector<float>& logits) {
  rows_step(sessions, ids, logits, false);
}

std::span<const float> Engine::forward_rows_view(std::span<Session* const> sessions, std::span<const int> ids, std::vector<float>& logits) {
  const std::size_t n = sessions.size() * static_cast<std::size_t>(spec_.vocab_size);
  if (const float* kept = rows_step(sessions, ids, logits, true)) return {kept, n};
  return {logits.data(), n};
}

void Engine::check_rows(std::span<Session* const> sessions, std::span<const int> ids) const {
  const int S = static_cast<int>(sessions.size());
  if (S == 0 || ids.size() != sessions.size()) throw Error("forward_rows: " + std::to_string(ids.size()) + " ids for " + std::to_string(S) + " sessions");
  check_ids(ids);
  for (int i = 0; i < S; ++i) {
    for (int j = 0; j < i; ++j)
      if (sessions[i] == sessions[j]) throw Error("forward_rows: a session appears twice (internal)");
  }
}

bool Engine::forward_rows_greedy(std::span<Session* const> sessions, std::span<const int> ids, std::vector<int>& greedy) {
  check_rows(sessions, ids);
  return greedy_step(sessions, std::vector<int>(sessions.size(), 1), ids, greedy);
}

bool Engine::greedy_step(std::span<Session* const> sessions, std::span<const int> lens, std::span<const int> ids, std::vector<int>& greedy) {
  const int n = static_cast<int>(sessions.size()), T = static_cast<int>(ids.size());
  if (!backend_.runs_whole_chunks() || (heat_ && !device_heat_) || !backend_.greedy_only(true)) return false;
  struct Off {  // whatever happens, later chunks get their logits again
    Backend& b;
    ~Off() { b.greedy_only(false); }
  } off{backend_};
  const auto t0 = std::chrono::steady_clock::now();
  if (n == 1 && T == 1) {  // forward_chunk's decode step
    Session& s = *sessions[0];
    backend_.start_chunk(*s.state, ids.data(), 1, s.n_past, 1);
    backend_.finish_chunk(*s.state, nullptr);
  } else {
    std::vector<BackendState*> states;
    std::vector<int> positions;
    for (Session* s : sessions) states.push_back(s->state.get()), positions.push_back(s->n_past);
    const bool taken = T == n ? backend_.step_rows(states.data(), ids.data(), positions.data(), n, nullptr)
                              : backend_.step_segments(states.data(), ids.data(), positions.data(), lens.data(), n, nullptr);
    if (!taken) return false;
  }
  if (timing_) times_.device += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (heat_) heat_->add_tokens(T);
  for (int i = 0; i < n; ++i) sessions[i]->n_past += lens[i];
  const int* g = backend_.kept_greedy();
  if (!g) throw Error("greedy step: the backend kept no greedy ids (internal)");
  greedy.assign(g, g + n);
  return true;
}

const float* Engine::rows_step(std::span<Session* const> sessions, std::span<const int> ids, std::vector<float>& logits, bool view) {
  const int S = static_cast<int>(sessions.size()), V = spec_.vocab_size;
  check_rows(sessions, ids);
  std::vector<BackendState*> states;
  std::vector<int> positions;
  for (Session* s : sessions) states.push_back(s->state.get()), positions.push_back(s->n_past);
  const bool chunks = backend_.runs_whole_chunks() && (!heat_ || device_heat_);
  const bool whole = S == 1 || chunks;
  const float* kept = view && chunks ? backend_.kept_logits() : nullptr;
  if (!kept) logits.resize(static_cast<std::size_t>(S) * V);
  if (kept && S == 1) {  // forward_chunk's decode step, its logits left in the backend's buffer
    Session& s = *sessions[0];
    if (heat_) heat_->add_tokens(1);
    const auto t0 = std::chrono::steady_clock::now();
    backend_.start_chunk(*s.state, ids.data(), 1, s.n_past, 1);
    backend_.finish_chunk(*s.state, nullptr);
    if (timing_) times_.device += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    s.n_past += 1;
    return backend_.kept_logits();
  }
  if (whole) {
    const auto t0 = std::chrono::steady_clock::now();
    if (S > 1 && backend_.step_rows(states.data(), ids.data(), positions.data(), S, kept ? nullptr : logits.data())) {
      if (timing_) times_.device += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (heat_) heat_->add_tokens(S);
      for (Session* s : sessions) s->n_past += 1;
      return kept ? backend_.kept_logits() : nullptr;  // the step may have moved its buffer (more rows)
    }
    logits.resize(static_cast<std::size_t>(S) * V);
    for (int i = 0; i < S; ++i) {
      const std::vector<float> l = forward(*sessions[i], ids.subspan(i, 1));
      std::copy(l.begin(), l.end(), logits.begin() + static_cast<std::ptrdiff_t>(i) * V);
    }
    return nullptr;
  }
  if (heat_) heat_->add_tokens(S);
  run_layers(
      ids.data(), S, [&](int l, float* x) { backend_.trunk_rows(l, states.data(), positions.data(), S, spec_.hidden_size, x); }, {}, S, logits.data());
  for (Session* s : sessions) s->n_past += 1;
  return nullptr;
}

int Engine::check_segments(std::span<Session* const> sessions, std::span<const int> lens, std::span<const int> ids) const {
  const int n = static_cast<int>(sessions.size());
  if (n == 0 || lens.size() != sessions.size())
    throw Error("forward_segments: " + std::to_string(lens.size()) + " lengths for " + std::to_string(n) + " sessions");
  long long T = 0;
  for (int len : lens) {
    if (len < 1) throw Error("forward_segments: a segment of " + std::to_string(len) + " tokens (internal)");
    T += len;
  }
  if (T != static_cast<long long>(ids.size())) throw Error("forward_segments: " + std::to_string(ids.size()) + " ids for segments of " + std::to_string(T));
  if (T > prefill_chunk_ && T > n) throw Error("forward_segments: " + std::to_string(T) + " ids exceed the chunk of " + std::to_string(prefill_chunk_) + " (internal)");
  check_ids(ids);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < i; ++j)
      if (sessions[i] == sessions[j]) throw Error("forward_segments: a session appears twice (internal)");
  return static_cast<int>(T);
}

std::span<const float> Engine::forward_segments_view(std::span<Session* const> sessions, std::span<const int> lens, std::span<const int> ids,
                                                     std::vector<float>& logits) {
  const int T = check_segments(sessions, lens, ids), n = static_cast<int>(sessions.size()), V = spec_.vocab_size, H = spec_.hidden_size;
  if (T == n) return forward_rows_view(sessions, ids, logits);  // one token each: a rows step
  std::vector<BackendState*> states;
  std::vector<int> positions;
  for (Session* s : sessions) states.push_back(s->state.get()), positions.push_back(s->n_past);
  auto advance = [&] {  // after the step: the sessions' positions, the heat's tokens
    if (heat_) heat_->add_tokens(T);
    for (int i = 0; i < n; ++i) sessions[i]->n_past += lens[i];
  };
  const bool chunks = backend_.runs_whole_chunks() && (!heat_ || device_heat_);
  const float* kept = chunks ? backend_.kept_logits() : nullptr;
  if (!kept) logits.resize(static_cast<std::size_t>(n) * V);
  if (chunks) {
    const auto t0 = std::chrono::steady_clock::now();
    if (backend_.step_segments(states.data(), ids.data(), positions.data(), lens.data(), n, kept ? nullptr : logits.data())) {
      if (timing_) times_.device += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      advance();
      if (kept) return {backend_.kept_logits(), static_cast<std::size_t>(n) * V};  // the step may have moved its buffer
      return {logits.data(), static_cast<std::size_t>(n) * V};
    }
    logits.resize(static_cast<std::size_t>(n) * V);
  }
  // The per-layer path: the leading one-token segments' trunk steps as
  // rows (trunk_rows), each longer one's as its session's chunk; the MoE
  // blocks over every token at once.
  int rows = 0;
  while (rows < n && lens[rows] == 1) ++rows;
  std::vector<int> off(n + 1, 0);
  for (int i = 0; i < n; ++i) off[i + 1] = off[i] + lens[i];
  Buffer<float> x(static_cast<std::size_t>(T) * H);
  timed(&StageTimes::embed, [&] { backend_.embed(ids.data(), T, x.data()); });
  Scratch scratch(T, H, spec_.num_experts_per_tok);
  const TrunkStep trunk = [&](int l, float* xl) {
    if (rows) backend_.trunk_rows(l, states.data(), positions.data(), rows, H, xl);
    for (int i = rows; i < n; ++i) backend_.trunk_step(l, *states[i], positions[i], lens[i], xl + static_cast<std::size_t>(off[i]) * H);
  };
  for (int l = 0; l < spec_.num_layers; ++l) run_layer(l, T, x.data(), trunk, {}, scratch);
  Buffer<float> last(static_cast<std::size_t>(n) * H);
  for (int i = 0; i < n; ++i)
    std::copy_n(x.data() + static_cast<std::size_t>(off[i + 1] - 1) * H, H, last.data() + static_cast<std::size_t>(i) * H);
  timed(&StageTimes::lm_head, [&] { backend_.logits(n, last.data(), logits.data()); });
  advance();
  return {logits.data(), static_cast<std::size_t>(n) * V};
}

bool Engine::forward_segments_greedy(std::span<Session* const> sessions, std::span<const int> lens, std::span<const int> ids, std::vector<int>& greedy) {
  check_segments(sessions, lens, ids);
  return greedy_step(sessions, lens, ids, greedy);
}

std::vector<float> Engine::forward_chunk(Session& s, const int* ids, int T, Logits want, const RouteObserver& observe, std::vector<float>* hidden) {
  if (heat_) heat_->add_tokens(T);
  const int rows = want == Logits::kAll ? T : want == Logits::kLast ? 1 : 0;
  const bool whole = backend_.runs_whole_chunks() && !observe && (!heat_ || device_heat_);
  const std::size_t had = hidden ? hidden->size() : 0;
  if (whole && hidden) hidden->resize(had + static_cast<std::size_t>(T) * spec_.hidden_size);
  if (whole && (!hidden || backend_.chunk_hidden(hidden->data() + had))) {
    const auto t0 = std::chrono::steady_clock::now();
    backend_.start_chunk(*s.state, ids, T, s.n_past, rows);  // the logits are allocated while the device runs
    std::vector<float> logits(static_cast<std::size_t>(rows) * spec_.vocab_size);
    backend_.finish_chunk(*s.state, logits.data());
    if (timing_) times_.device += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    s.n_past += T;
    return logits;
  }
  if (hidden) hidden->resize(had);  // the per-layer steps append them
  std::vector<float> logits(static_cast<std::size_t>(rows) * spec_.vocab_size);
  run_layers(ids, T, [&](int l, float* x) { backend_.trunk_step(l, *s.state, s.n_past, T, x); }, observe, rows, logits.data(), hidden);
  s.n_past += T;
  return logits;
}

template <class F>
void Engine::timed(double StageTimes::*stage, F&& fn) {
  if (!timing_) return fn();
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  times_.*stage += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void Engine::run_layers(const int* ids, int T, const TrunkStep& trunk, const RouteObserver& observe, int logit_rows, float* logits,
                        std::vector<float>* hidden) {
  const int H = spec_.hidden_size;
  Buffer<float> x(static_cast<std::size_t>(T) * H);
  timed(&StageTimes::embed, [&] { backend_.embed(ids, T, x.data()); });
  Scratch scratch(T, H, spec_.num_experts_per_tok);
  for (int l = 0; l < spec_.num_layers; ++l) run_layer(l, T, x.data(), trunk, observe, scratch);
  if (!hidden) {
    if (logit_rows == 0) return;
    timed(&StageTimes::lm_head, [&] { backend_.logits(logit_rows, x.data() + static_cast<std::size_t>(T - logit_rows) * H, logits); });
    return;
  }
  // The hidden rows the MTP layer reads, and the logits from them (the
  // same arithmetic as logits()).
  const std::size_t at = hidden->size();
  hidden->resize(at + x.size());
  float* h = hidden->data() + at;
  timed(&StageTimes::lm_head, [&] {
    backend_.output_norm(T, x.data(), h, /*mtp=*/false);
    if (logit_rows) backend_.lm_head(logit_rows, h + static_cast<std::size_t>(T - logit_rows) * H, logits);
  });
}

void Engine::run_layer(int l, int T, float* x, const TrunkStep& trunk, const RouteObserver& observe, Scratch& scratch) {
  const int H = spec_.hidden_size, K = spec_.num_experts_per_tok;
  const std::size_t n = static_cast<std::size_t>(T) * H;
  Buffer<float>&hn = scratch.hn, &shared = scratch.shared, &routed = scratch.routed;
  std::vector<int>& idx = scratch.idx;
  std::vector<float>& w = scratch.w;
  std::vector<ExpertPair>& pairs = scratch.pairs;
  // A dense layer (qwen3_moe, qwen3_next where configured) has no routing:
  // its MLP is the backend's shared_expert step, the routed part is 0. The
  // MTP layer (l == num_layers) is not in the heat.
  const bool sparse = spec_.is_sparse(l), counted = l < spec_.num_layers;
  timed(&StageTimes::trunk, [&] { trunk(l, x); });
  timed(&StageTimes::router, [&] {
    backend_.ffn_norm(l, T, x, hn.data());
    if (sparse) backend_.route(l, T, hn.data(), idx.data(), w.data());
  });
  if (sparse && observe && counted) observe(l, T, idx.data(), w.data());
  if (sparse && heat_ && counted) heat_->add(l, idx.data(), idx.size());
  timed(&StageTimes::shared, [&] { backend_.shared_expert(l, T, hn.data(), shared.data()); });
  timed(&StageTimes::experts, [&] {
    if (!sparse) {
      std::fill(routed.data(), routed.data() + routed.size(), 0.0f);
      return;
    }
    for (int t = 0; t < T; ++t)
      for (int k = 0; k < K; ++k) pairs[t * K + k] = ExpertPair{t, idx[t * K + k], w[t * K + k]};
    backend_.routed_experts(l, pairs.data(), static_cast<int>(pairs.size()), hn.data(), routed.data());
  });
  // Combine: the MoE output is routed + shared, added to the residual.
  timed(&StageTimes::combine, [&] { backend_.add_moe_output(n, routed.data(), shared.data(), x); });
}

}  // namespace coli
