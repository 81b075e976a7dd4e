#include "serve/engine_generator.h"

#include <algorithm>
#include <chrono>

#include "engine/chat_session.h"
#include "sampling/sampler.h"

namespace coli::serve {

using Clock = std::chrono::steady_clock;

// A request between run() and its end. Lives on run()'s stack: the
// scheduler touches it only until it sets done (under mu, notifying).
struct EngineGenerator::Job {
  const GenerationRequest& r;
  const std::vector<int>& prompt;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> pieces;  // text for the caller, in order
  bool done = false;
  std::exception_ptr error;
  std::atomic<bool> cancel{false};  // set by the caller (its client is gone)
  GenerationResult res;
  Job(const GenerationRequest& req, const std::vector<int>& ids) : r(req), prompt(ids) {}
};

// A slot: its session and the ids in it, and the request it serves.
struct EngineGenerator::Slot {
  Session session;
  std::vector<int> fed;  // the ids in session
  Job* job = nullptr;
  // The request's progress.
  std::size_t prompt_at = 0;  // ids of job->prompt in the session
  int pending = -1;           // a sampled id the next decode step feeds
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<TextStreamer> streamer;
  std::unique_ptr<StopStrings> stops;
  std::vector<int> history;  // prompt and generated ids (the sampler's penalties)
  int n_predict = 0, n_generated = 0, n_fed = 0;
  Clock::time_point t0, t_first;
  bool reading() const { return job && prompt_at < job->prompt.size(); }
  bool generating() const { return job && pending >= 0; }
};

EngineGenerator::EngineGenerator(Engine& engine, const Tokenizer& tok, int n_ctx, int parallel, int prompt_chunk, bool mixed)
    : engine_(engine),
      tok_(tok),
      style_(chat_style_of(tok.chat_template())),
      n_ctx_(n_ctx),
      prompt_chunk_(prompt_chunk),
      mixed_(mixed),
      sample_pool_(sample_helpers(parallel)) {
  if (n_ctx_ < 2) throw Error("coli-serve: the context must hold at least 2 tokens");
  if (parallel < 1) throw Error("coli-serve: --parallel must be at least 1");
  if (prompt_chunk_ < 1) throw Error("coli-serve: the prompt chunk must be at least 1 token");
  stop_ids_ = engine.spec().eos_token_ids;
  const std::vector<int> more = tokenizer_stop_ids(tok);
  stop_ids_.insert(stop_ids_.end(), more.begin(), more.end());
  // Every slot's session now: a device backend allocates its state here,
  // so a slot that does not fit fails at the start, not at a request.
  for (int i = 0; i < parallel; ++i) {
    slots_.push_back(std::make_unique<Slot>());
    slots_.back()->session = engine_.new_session();
  }
  thread_ = std::thread([this] { loop(); });
}

// Helpers for sampling a step's rows: one a slot past the first, no more
// than the cores past the scheduler's own (16 rows of a 248K vocabulary:
// 2.5 ms a step one by one on the GPU machine's host, docs/perf/serve.md).
int EngineGenerator::sample_helpers(int parallel) {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(std::min(parallel - 1, cores - 1), 0, 15);
}

EngineGenerator::~EngineGenerator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::vector<int> EngineGenerator::prompt_ids(const GenerationRequest& r) const {
  std::vector<int> ids;
  if (r.chat) {
    ChatOptions o;
    o.enable_thinking = r.enable_thinking;
    ids = tok_.encode(render_chat(r.messages, o, style_));
  } else {
    ids = tok_.encode(r.prompt);
  }
  if (ids.empty()) throw ApiError(400, "invalid_request_error", "the prompt is empty", r.chat ? "messages" : "prompt");
  if (static_cast<long>(ids.size()) + 1 > n_ctx_)
    throw ApiError(400, "invalid_request_error",
                   "the prompt has " + std::to_string(ids.size()) + " tokens; with one generated token that exceeds the context size of " +
                       std::to_string(n_ctx_) + " tokens",
                   r.chat ? "messages" : "prompt");
  return ids;
}

GenerationResult EngineGenerator::run(const GenerationRequest& r, const std::vector<int>& prompt,
                                      const std::function<bool(const std::string&)>& on_text) {
  if (prompt.empty() || static_cast<long>(prompt.size()) + 1 > n_ctx_) throw Error("coli-serve: a prompt outside the context (internal)");
  check_sampling_params(r.sampling);  // here, not on the scheduler's thread
  Job job(r, prompt);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) throw ApiError(503, "server_error", "the server is shutting down");
    queue_.push_back(&job);
    ++in_flight_;
  }
  cv_.notify_all();
  struct Leave {
    EngineGenerator& g;
    ~Leave() {
      std::lock_guard<std::mutex> lock(g.mu_);
      --g.in_flight_;
    }
  } leave{*this};
  std::unique_lock<std::mutex> lock(job.mu);
  for (;;) {
    job.cv.wait(lock, [&] { return job.done || !job.pieces.empty(); });
    std::deque<std::string> out;
    out.swap(job.pieces);
    const bool done = job.done;
    lock.unlock();
    for (const std::string& piece : out)
      if (!job.cancel && !on_text(piece)) job.cancel = true;
    lock.lock();
    if (done && job.pieces.empty()) break;
  }
  if (job.error) std::rethrow_exception(job.error);
  GenerationResult res = job.res;
  if (job.cancel) res.cancelled = true, res.finish_reason.clear();
  return res;
}

void EngineGenerator::with_engine(const std::function<void()>& fn) {
  std::lock_guard<std::mutex> lock(engine_mu_);
  fn();
}

long long EngineGenerator::decode_steps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return steps_;
}

long long EngineGenerator::decode_rows() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rows_;
}

long long EngineGenerator::step_prompt_ids() const {
  std::lock_guard<std::mutex> lock(mu_);
  return step_prompt_ids_;
}

EngineGenerator::PhaseSeconds EngineGenerator::phase_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return phases_;
}

namespace {
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

int EngineGenerator::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_;
}

void EngineGenerator::loop() {
  for (;;) {
    auto busy = [&] { return std::any_of(slots_.begin(), slots_.end(), [](const auto& s) { return s->job != nullptr; }); };
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto free_slot = [&] { return std::any_of(slots_.begin(), slots_.end(), [](const auto& s) { return s->job == nullptr; }); };
      cv_.wait(lock, [&] { return busy() || (!queue_.empty() && free_slot()) || (stop_ && queue_.empty()); });
      if (stop_ && queue_.empty() && !busy()) return;
      while (!queue_.empty() && free_slot()) {
        Job* j = queue_.front();
        queue_.pop_front();
        lock.unlock();
        const Clock::time_point t = Clock::now();
        admit(j);
        lock.lock();
        phases_.admit += seconds_since(t);
      }
    }
    try {
      // Mixed: prompt chunks ride along with the decode rows (decode_step);
      // with no slot generating, one prompt whole. Else one prompt chunk of
      // one slot reading its prompt (round robin), then one decode step of
      // every generating slot.
      const auto generating = std::count_if(slots_.begin(), slots_.end(), [](const auto& s) { return s->generating(); });
      const bool along = mixed_ && generating > 0 && generating < std::min(prompt_chunk_, engine_.prefill_chunk());
      for (std::size_t k = 0; k < slots_.size() && !along; ++k) {
        Slot& s = *slots_[(next_prefill_ + k) % slots_.size()];
        if (!s.reading()) continue;
        next_prefill_ = (next_prefill_ + k + 1) % slots_.size();
        prefill_chunk(s);
        break;
      }
      decode_step();
    } catch (...) {
      fail_all(std::current_exception());
    }
  }
}

// Takes the free slot whose ids are the longest prefix of the prompt (a
// fresh session where none is).
void EngineGenerator::admit(Job* job) {
  const std::vector<int>& p = job->prompt;
  Slot* best = nullptr;
  std::size_t best_len = 0;
  for (const auto& s : slots_) {
    if (s->job) continue;
    const bool prefix = !s->fed.empty() && p.size() > s->fed.size() && std::equal(s->fed.begin(), s->fed.end(), p.begin());
    const std::size_t len = prefix ? s->fed.size() : 0;
    if (!best || len > best_len || (len == best_len && s->fed.empty() && !best->fed.empty())) best = s.get(), best_len = len;
  }
  Slot& s = *best;
  s.job = job;
  try {
    if (best_len == 0 && !s.fed.empty()) {
      std::lock_guard<std::mutex> lock(engine_mu_);
      s.session = engine_.new_session(), s.fed.clear();
    }
    s.prompt_at = s.fed.size();
    s.pending = -1;
    s.sampler = std::make_unique<Sampler>(job->r.sampling);
    s.streamer = std::make_unique<TextStreamer>(tok_);
    s.stops = std::make_unique<StopStrings>(job->r.stop);
    s.history = p;
    const int room = n_ctx_ - static_cast<int>(p.size());
    s.n_predict = job->r.max_tokens > 0 ? std::min(job->r.max_tokens, room) : room;
    s.n_generated = 0, s.n_fed = static_cast<int>(p.size() - s.prompt_at);
    s.t0 = Clock::now();
    job->res.cached_tokens = static_cast<int>(s.prompt_at);
  } catch (...) {
    s.job = nullptr;
    std::lock_guard<std::mutex> lock(job->mu);
    job->error = std::current_exception();
    job->done = true;
    job->cv.notify_all();
  }
}

void EngineGenerator::prefill_chunk(Slot& s) {
  if (s.job->cancel) return finish(s, "");
  const std::vector<int>& p = s.job->prompt;
  // Capped only while other slots wait for decode steps; alone, the whole
  // prompt at once (a device backend's prompt chunks are its own, larger:
  // under a VRAM budget each one uploads the layers' experts again).
  const bool others = std::any_of(slots_.begin(), slots_.end(), [&](const auto& o) { return o.get() != &s && o->generating(); });
  const std::size_t rest = p.size() - s.prompt_at, n = others ? std::min<std::size_t>(prompt_chunk_, rest) : rest;
  std::vector<float> logits;
  const Clock::time_point t = Clock::now();
  {
    std::lock_guard<std::mutex> lock(engine_mu_);
    logits = engine_.forward(s.session, std::span<const int>(p.data() + s.prompt_at, n));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    phases_.prompt += seconds_since(t);
  }
  s.fed.insert(s.fed.end(), p.begin() + static_cast<std::ptrdiff_t>(s.prompt_at), p.begin() + static_cast<std::ptrdiff_t>(s.prompt_at + n));
  s.prompt_at += n;
  if (s.prompt_at < p.size()) return;
  s.t_first = Clock::now();
  take(s, sample_row(s, logits, 0));
}

void EngineGenerator::decode_step() {
  std::vector<Slot*> rows;
  for (const auto& s : slots_) {
    if (!s->generating()) continue;
    if (s->job->cancel) {
      finish(*s, "");
      continue;
    }
    rows.push_back(s.get());
  }
  if (rows.empty()) return;
  // Prompt chunks along (mixed): up to prompt_chunk ids in all, as many
  // slots reading their prompts as they cover, round robin.
  struct Piece {
    Slot* slot;
    std::size_t n;
  };
  std::vector<Piece> pieces;
  if (mixed_) {  // (the loop took a chunk apart where no room is left)
    std::size_t room = static_cast<std::size_t>(std::max(0, std::min(prompt_chunk_, engine_.prefill_chunk() - static_cast<int>(rows.size()))));
    const std::size_t first = next_prefill_;
    for (std::size_t k = 0; k < slots_.size() && room > 0; ++k) {
      Slot& s = *slots_[(first + k) % slots_.size()];
      if (!s.reading()) continue;
      if (s.job->cancel) {
        finish(s, "");
        continue;
      }
      const std::size_t n = std::min(room, s.job->prompt.size() - s.prompt_at);
      pieces.push_back({&s, n});
      room -= n;
      next_prefill_ = (first + k + 1) % slots_.size();
    }
  }
  const std::size_t R = rows.size(), n = R + pieces.size();
  std::vector<Session*> sessions;
  std::vector<int> ids, lens;
  for (Slot* s : rows) sessions.push_back(&s->session), ids.push_back(s->pending), lens.push_back(1);
  for (const Piece& p : pieces) {
    const std::vector<int>& prompt = p.slot->job->prompt;
    sessions.push_back(&p.slot->session), lens.push_back(static_cast<int>(p.n));
    ids.insert(ids.end(), prompt.begin() + static_cast<std::ptrdiff_t>(p.slot->prompt_at), prompt.begin() + static_cast<std::ptrdiff_t>(p.slot->prompt_at + p.n));
  }
  // Which rows get a token: every decode row, and a prompt chunk that ends its prompt.
  std::vector<Slot*> out(n, nullptr);
  for (std::size_t i = 0; i < R; ++i) out[i] = rows[i];
  for (std::size_t k = 0; k < pieces.size(); ++k)
    if (pieces[k].slot->prompt_at + pieces[k].n == pieces[k].slot->job->prompt.size()) out[R + k] = pieces[k].slot;
  // The rows where the backend left them (a GPU's pinned buffer), read
  // before the engine is called again: the lock stays held while they are.
  const Clock::time_point t = Clock::now();
  std::unique_lock<std::mutex> engine_lock(engine_mu_);
  // Rows that are all greedy take their ids from where the logits are (a
  // GPU: no logits to the host, no scans); else each row's sampler scans
  // its logits.
  const bool greedy = std::all_of(out.begin(), out.end(), [](const Slot* s) { return !s || s->sampler->greedy(); });
  std::vector<int> sampled(n, -1);
  std::vector<std::exception_ptr> failed(n);
  Clock::time_point t_sample;
  if (greedy && engine_.forward_segments_greedy(sessions, lens, ids, sampled)) {  // decode rows alone: a rows step
    t_sample = Clock::now();
    for (std::size_t i = 0; i < n; ++i) {
      if (!out[i]) continue;
      try {
        sampled[i] = check_greedy_id(sampled[i], out[i]->n_generated == 0 ? std::string("the prompt's forward pass")
                                                                          : "decode step " + std::to_string(out[i]->n_generated));
      } catch (...) {
        failed[i] = std::current_exception();
      }
    }
  } else {
    const std::span<const float> logits = engine_.forward_segments_view(sessions, lens, ids, rows_logits_);
    t_sample = Clock::now();
    // The rows' scans of their logits at once (each its own slot's sampler
    // and history); then, in order, what they hand out. A row that fails
    // fails the step where its turn comes, as one by one.
    sample_pool_.run(n, [&](std::size_t i) {
      if (!out[i]) return;
      try {
        sampled[i] = sample_row(*out[i], logits, i);
      } catch (...) {
        failed[i] = std::current_exception();
      }
    });
  }
  engine_lock.unlock();
  // Counted before the rows' requests may end: a caller that sees its
  // reply finished sees the step that made it in the counters.
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++steps_, rows_ += static_cast<long long>(R), step_prompt_ids_ += static_cast<long long>(ids.size() - R);
    phases_.decode_forward += std::chrono::duration<double>(t_sample - t).count();
    phases_.decode_sample += seconds_since(t_sample);
  }
  for (std::size_t i = 0; i < R; ++i) {
    Slot& s = *rows[i];
    s.fed.push_back(s.pending);
    s.pending = -1;
    if (failed[i]) std::rethrow_exception(failed[i]);
    take(s, sampled[i]);
  }
  for (std::size_t k = 0; k < pieces.size(); ++k) {
    Slot& s = *pieces[k].slot;
    const std::vector<int>& p = s.job->prompt;
    s.fed.insert(s.fed.end(), p.begin() + static_cast<std::ptrdiff_t>(s.prompt_at), p.begin() + static_cast<std::ptrdiff_t>(s.prompt_at + pieces[k].n));
    s.prompt_at += pieces[k].n;
    if (!out[R + k]) continue;
    s.t_first = Clock::now();
    if (failed[R + k]) std::rethrow_exception(failed[R + k]);
    take(s, sampled[R + k]);
  }
}

// The slot's next id from row `row` of logits (throws where they are not
// finite). Touches only the slot's sampler: rows of a step run at once.
int EngineGenerator::sample_row(Slot& s, std::span<const float> logits, std::size_t row) {
  const std::size_t V = static_cast<std::size_t>(engine_.spec().vocab_size);
  const std::span<const float> l(logits.data() + row * V, V);
  check_logits_finite(l, s.n_generated == 0 ? std::string("the prompt's forward pass") : "decode step " + std::to_string(s.n_generated));
  return s.sampler->sample(l, s.history);
}

// Takes the slot's sampled id and hands its text out; ends the request
// where it ends.
void EngineGenerator::take(Slot& s, int id) {
  ++s.n_generated;
  s.history.push_back(id);
  if (std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end()) return finish(s, "stop");
  const StopStrings::Out o = s.stops->push(s.streamer->push(id));
  if (!o.text.empty() && !s.job->cancel) {
    std::lock_guard<std::mutex> lock(s.job->mu);
    s.job->pieces.push_back(o.text);
    s.job->cv.notify_all();
  }
  if (o.stopped) {
    s.stops.reset();  // nothing after a stop string
    return finish(s, "stop");
  }
  if (s.job->cancel) return finish(s, "");
  if (s.n_generated >= s.n_predict || s.session.n_past + 1 >= n_ctx_) return finish(s, "length");
  s.pending = id;
}

// Ends the slot's request ("": cancelled); the slot keeps its session and
// ids for the next request that extends them.
void EngineGenerator::finish(Slot& s, const std::string& reason) {
  Job& j = *s.job;
  const Clock::time_point now = Clock::now();
  std::string tail;
  if (s.stops && !reason.empty()) tail = s.stops->push(s.streamer->flush()).text + s.stops->flush();
  j.res.usage.prompt_tokens = static_cast<int>(j.prompt.size());
  j.res.usage.prompt_fed = s.n_fed;
  j.res.usage.completion_tokens = s.n_generated;
  const Clock::time_point first = s.n_generated > 0 ? s.t_first : now;
  j.res.usage.prompt_ms = std::chrono::duration<double, std::milli>(first - s.t0).count();
  j.res.usage.predicted_ms = std::chrono::duration<double, std::milli>(now - first).count();
  j.res.finish_reason = reason;
  j.res.cancelled = reason.empty();
  s.job = nullptr, s.pending = -1, s.sampler.reset(), s.streamer.reset(), s.stops.reset();
  s.prompt_at = 0;
  std::lock_guard<std::mutex> lock(j.mu);
  if (!tail.empty() && !j.cancel) j.pieces.push_back(tail);
  j.done = true;
  j.cv.notify_all();
}

// The engine threw: every request in a slot gets the error and its slot
// starts afresh (a failed step leaves the states undefined).
void EngineGenerator::fail_all(std::exception_ptr e) {
  for (const auto& s : slots_) {
    s->fed.clear();
    try {
      std::lock_guard<std::mutex> lock(engine_mu_);
      s->session = engine_.new_session();
    } catch (...) {
    }
    if (!s->job) continue;
    Job& j = *s->job;
    s->job = nullptr, s->pending = -1, s->prompt_at = 0;
    std::lock_guard<std::mutex> lock(j.mu);
    j.error = e;
    j.done = true;
    j.cv.notify_all();
  }
}

}  // namespace coli::serve
