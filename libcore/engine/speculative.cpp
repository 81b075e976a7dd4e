#include "engine/speculative.h"

#include <algorithm>
#include <chrono>

#include "placement/device_sizes.h"
#include "util/error.h"

namespace coli {

static_assert(kRewindTokens >= 1 + kMaxDraft, "a device backend's rewind journal holds a verify chunk");

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The session's MTP rows are complete: every position from mtp_past on has
// its hidden row waiting, and the ids between them.
bool mtp_in_step(const Session& s, int H) {
  const long rows = long(s.n_past) - s.mtp_past;
  return rows >= 0 && s.mtp_hidden.size() == std::size_t(rows) * H && s.mtp_ids.size() == std::size_t(std::max(0L, rows - 1));
}

// Tokens ids were fed at positions p0 .. with hidden rows h: their MTP rows
// now wait (the id at position q is the token after row q - 1's).
void note_fed(Session& s, std::span<const int> ids, int p0, const float* h, int H) {
  s.mtp_hidden.insert(s.mtp_hidden.end(), h, h + ids.size() * std::size_t(H));
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (p0 + long(i) >= long(s.mtp_past) + 1) s.mtp_ids.push_back(ids[i]);
}

// Speculative sampling's residual: max(0, p - q) normalised; p itself when
// it is all 0 (p == q).
std::vector<std::pair<int, float>> residual(const std::vector<std::pair<int, float>>& p, const std::vector<std::pair<int, float>>& q) {
  std::vector<std::pair<int, float>> r;
  double sum = 0;
  for (const auto& [id, pp] : p) {
    float qq = 0;
    for (const auto& [qid, qp] : q)
      if (qid == id) qq = qp;
    if (pp > qq) r.emplace_back(id, pp - qq), sum += pp - qq;
  }
  if (sum <= 0) return p;
  for (auto& e : r) e.second = static_cast<float>(e.second / sum);
  return r;
}

float prob_of(const std::vector<std::pair<int, float>>& d, int id) {
  for (const auto& [i, p] : d)
    if (i == id) return p;
  return 0;
}

}  // namespace

GenerateStats generate_speculative(Engine& engine, Session& session, std::span<const int> prompt, const GenerateOptions& opt,
                                   const std::function<void(const TokenEvent&)>& on_token) {
  if (!engine.has_mtp()) throw Error("--draft " + std::to_string(opt.draft) + ": the model has no MTP module (mtp.* tensors)");
  check_generate_args(session, prompt, opt);
  const int H = engine.spec().hidden_size;
  const std::size_t V = engine.spec().vocab_size;
  GenerateStats st;
  st.n_prompt = static_cast<int>(prompt.size());
  Sampler sampler(opt.sampling);
  const bool greedy = opt.sampling.temperature <= 0;
  std::vector<int> stops = engine.spec().eos_token_ids;
  stops.insert(stops.end(), opt.stop_ids.begin(), opt.stop_ids.end());
  std::vector<int> history(prompt.begin(), prompt.end());
  const bool drafting = mtp_in_step(session, H);
  if (!drafting) st.draft_off = "the conversation before this prompt was fed without the MTP layer";

  auto t0 = Clock::now();
  std::vector<float> hidden;
  const int p0 = session.n_past;
  std::vector<float> logits = engine.forward(session, prompt, {}, drafting ? &hidden : nullptr);
  st.prefill_seconds = since(t0);
  st.fed = history;
  if (drafting) note_fed(session, prompt, p0, hidden.data(), H);

  // Emits the token chosen from a logits row; false when generation ends
  // there (a stop id, n_predict, the caller, the context).
  bool done = false;
  auto emit = [&](std::span<const float> row, int id, const std::string& step) {
    const TokenEvent ev = token_event(row, id, opt, stops, step);
    on_token(ev);
    ++st.n_generated;
    history.push_back(id);
    if (ev.is_stop || st.n_generated == opt.n_predict) return done = true, false;
    if (opt.keep_going && !opt.keep_going()) return st.stopped_by_caller = true, done = true, false;
    return true;
  };

  if (opt.n_predict <= 0) return st;
  check_logits_finite(logits, "the prompt's forward pass");
  int next = sampler.sample(logits, history);
  if (!emit(logits, next, "the prompt's forward pass")) return st;

  std::vector<int> drafts, tokens;
  std::vector<std::vector<std::pair<int, float>>> q;  // each draft's distribution (sampling)
  std::vector<float> g;
  while (!done) {
    // session.n_past tokens are in the state and `next` waits to be fed.
    if (opt.n_ctx > 0 && session.n_past + 1 >= opt.n_ctx) {
      st.context_full = true;
      break;
    }
    int n_draft = drafting ? std::min(opt.draft, opt.n_predict - st.n_generated - 1) : 0;
    if (opt.n_ctx > 0) n_draft = std::min(n_draft, opt.n_ctx - 2 - session.n_past);
    n_draft = std::max(0, n_draft);
    const auto t1 = Clock::now();

    // Draft: the waiting MTP rows with `next` as the last row's token give
    // the first draft; each later one reads the MTP's own output row.
    drafts.clear(), q.clear();
    if (n_draft > 0) {
      const auto tm = Clock::now();
      std::vector<int> ids = session.mtp_ids;
      ids.push_back(next);
      std::vector<float> ml = engine.mtp_forward(session, ids, session.mtp_hidden.data(), session.mtp_past, false, &g);
      session.mtp_past = session.n_past, session.mtp_hidden.clear(), session.mtp_ids.clear();
      std::vector<int> hist = history;
      for (int i = 0; i < n_draft; ++i) {
        if (i > 0) {
          const std::vector<float> last(g.end() - H, g.end());
          ml = engine.mtp_forward(session, std::span<const int>(&drafts.back(), 1), last.data(), session.n_past + i - 1, false, &g);
        }
        check_logits_finite(ml, "the MTP layer's draft");
        int d;
        if (greedy) d = sampler.sample(ml, hist);
        else q.push_back(sampler.distribution(ml, hist)), d = sampler.draw(q.back());
        if (opt.draft_hook) {
          const int h = opt.draft_hook(st.n_generated + i, d);  // the generated token it proposes
          if (h != d && !greedy) q.back() = {{h, 1.0f}};  // a fixed proposal: q is a point mass
          d = h;
        }
        drafts.push_back(d), hist.push_back(d);
      }
      st.mtp_seconds += since(tm);
    }

    // Verify `next` and the drafts as one chunk; keep what the main model
    // confirms.
    tokens.assign(1, next);
    tokens.insert(tokens.end(), drafts.begin(), drafts.end());
    const int base = session.n_past;
    if (n_draft > 0) engine.mark(session);
    logits = engine.forward_all(session, tokens, drafting ? &hidden : nullptr);
    ++st.n_decode_steps, ++st.n_rounds;
    st.n_drafted += n_draft;
    int last = 0;  // index of the last token emitted this round
    for (int i = 0; i <= n_draft; ++i) {
      const std::span<const float> row(logits.data() + i * V, V);
      const std::string step = "decode step " + std::to_string(st.n_decode_steps) + (n_draft ? " (row " + std::to_string(i) + ")" : "");
      check_logits_finite(row, step);
      int id;
      bool accepted = false;
      if (i == n_draft) id = sampler.sample(row, history);
      else if (greedy) id = sampler.sample(row, history), accepted = id == drafts[i];
      else {
        const auto p = sampler.distribution(row, history);
        const float pd = prob_of(p, drafts[i]), qd = prob_of(q[i], drafts[i]);
        accepted = qd > 0 && sampler.uniform() < double(pd) / qd;
        id = accepted ? drafts[i] : sampler.draw(residual(p, q[i]));
      }
      last = i;
      st.n_accepted += accepted;
      if (!emit(row, id, step) || !accepted) {
        next = id;
        break;
      }
    }
    // Fed: next and the drafts accepted before the last emitted token.
    const int kept = last + 1;
    if (n_draft > 0) engine.rewind(session, base + kept);
    st.fed.insert(st.fed.end(), tokens.begin(), tokens.begin() + kept);
    if (drafting) note_fed(session, std::span<const int>(tokens.data(), kept), base, hidden.data(), H);
    st.decode_seconds += since(t1);
  }
  return st;
}

}  // namespace coli
