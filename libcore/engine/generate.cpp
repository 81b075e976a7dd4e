#include "engine/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "engine/speculative.h"
#include "util/error.h"

namespace coli {

namespace {
// The log of the softmax's normaliser; NaN or +Inf when a logit is.
double log_sum_exp(std::span<const float> logits) {
  float m = -std::numeric_limits<float>::infinity();
  for (float v : logits) m = std::max(m, v);  // a NaN logit is caught by the sum below
  double sum = 0;
  for (float v : logits) sum += std::exp(double(v) - m);
  return m + std::log(sum);
}

[[noreturn]] void not_finite(std::span<const float> logits, const std::string& step) {
  std::size_t bad = 0;
  while (bad < logits.size() && (std::isfinite(logits[bad]) || logits[bad] == -std::numeric_limits<float>::infinity())) ++bad;
  throw Error(step + ": the logits are not finite (" +
              (bad < logits.size() ? "id " + std::to_string(bad) + " is " + std::to_string(logits[bad]) : std::string("all -inf")) +
              "): the model's weights or config.json are broken");
}
}  // namespace

void check_logits_finite(const std::vector<float>& logits, const std::string& step) { check_logits_finite(std::span<const float>(logits), step); }

void check_logits_finite(std::span<const float> logits, const std::string& step) {
  if (logits.empty()) throw Error(step + ": no logits");
  // v * 0 is NaN exactly when v is NaN or infinite; eight running sums
  // vectorize (25 us for 248,320 logits against 2 ms for a log-softmax).
  // Only when one is NaN does the exact scan decide (-Inf is legal).
  float acc[8] = {};
  const std::size_t n = logits.size();
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += logits[i + k] * 0.0f;
  float sum = 0;
  for (; i < n; ++i) sum += logits[i] * 0.0f;
  for (float a : acc) sum += a;
  if (sum == sum) return;
  bool any = false;  // some logit above -Inf
  for (float v : logits) {
    if (v != v || v == std::numeric_limits<float>::infinity()) not_finite(logits, step);
    any |= v > -std::numeric_limits<float>::infinity();
  }
  if (!any) not_finite(logits, step);
}

int check_greedy_id(int code, const std::string& step) {
  if (code >= 0) return code;
  throw Error(step + ": the logits are not finite (" + (code == -1 ? std::string("all -inf") : "id " + std::to_string(-2 - code) + " is nan or inf") +
              "): the model's weights or config.json are broken");
}

std::vector<float> log_softmax(const std::vector<float>& logits, const std::string& step) { return log_softmax(std::span<const float>(logits), step); }

std::vector<float> log_softmax(std::span<const float> logits, const std::string& step) {
  if (logits.empty()) throw Error(step + ": no logits");
  const double lse = log_sum_exp(logits);
  if (!std::isfinite(lse)) not_finite(logits, step);
  std::vector<float> out(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<float>(logits[i] - lse);
  return out;
}

TokenEvent token_event(std::span<const float> logits, int id, const GenerateOptions& opt, const std::vector<int>& stops, const std::string& step) {
  TokenEvent ev;
  ev.id = id;
  ev.is_stop = !opt.ignore_eos && std::find(stops.begin(), stops.end(), id) != stops.end();
  if (!opt.logprobs && opt.top_logprobs <= 0) return ev;
  const std::vector<float> lp = log_softmax(logits, step);
  ev.logprob = lp[id];
  if (opt.top_logprobs > 0) {
    std::vector<int> ids(lp.size());
    std::iota(ids.begin(), ids.end(), 0);
    const int k = std::min<int>(opt.top_logprobs, static_cast<int>(ids.size()));
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int a, int b) { return lp[a] > lp[b] || (lp[a] == lp[b] && a < b); });
    for (int j = 0; j < k; ++j) ev.top.emplace_back(ids[j], lp[ids[j]]);
  }
  return ev;
}

void check_generate_args(const Session& session, std::span<const int> prompt, const GenerateOptions& opt) {
  if (prompt.empty()) throw Error("the prompt is empty");
  if (opt.n_ctx > 0 && session.n_past + static_cast<long>(prompt.size()) + 1 > opt.n_ctx)
    throw Error("the prompt has " + std::to_string(prompt.size()) + " tokens" +
                (session.n_past ? " after " + std::to_string(session.n_past) + " in the conversation" : std::string()) +
                ": with one generated token that exceeds the context size of " + std::to_string(opt.n_ctx) + " tokens (-c/--ctx-size)");
}

GenerateStats generate(Engine& engine, Session& session, std::span<const int> prompt, const GenerateOptions& opt,
                       const std::function<void(const TokenEvent&)>& on_token) {
  if (opt.draft < 0 || opt.draft > kMaxDraft) throw Error("draft: " + std::to_string(opt.draft) + " tokens a step (0 to " + std::to_string(kMaxDraft) + ")");
  if (opt.draft > 0) return generate_speculative(engine, session, prompt, opt, on_token);
  check_generate_args(session, prompt, opt);
  using clock = std::chrono::steady_clock;
  GenerateStats st;
  st.n_prompt = static_cast<int>(prompt.size());
  Sampler sampler(opt.sampling);
  std::vector<int> stops = engine.spec().eos_token_ids;
  stops.insert(stops.end(), opt.stop_ids.begin(), opt.stop_ids.end());
  std::vector<int> history(prompt.begin(), prompt.end());

  auto t0 = clock::now();
  std::vector<float> logits = engine.forward(session, prompt);
  st.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  st.fed = history;

  // Greedy decoding without log-probabilities takes each step's id from
  // where the logits are computed (a GPU: no logits to the host, no scan;
  // Engine::forward_rows_greedy), where the backend can.
  const bool on_device = sampler.greedy() && !opt.logprobs && opt.top_logprobs <= 0;
  std::vector<int> greedy;  // the last step's id when it came that way
  for (int i = 0; i < opt.n_predict; ++i) {
    const std::string step = i == 0 ? std::string("the prompt's forward pass") : "decode step " + std::to_string(i);
    int id = 0;
    if (!greedy.empty()) {
      id = check_greedy_id(greedy[0], step);
    } else {
      check_logits_finite(logits, step);
      id = sampler.sample(logits, history);
    }
    const TokenEvent ev = token_event(logits, id, opt, stops, step);
    on_token(ev);
    ++st.n_generated;
    history.push_back(ev.id);
    if (ev.is_stop || i + 1 == opt.n_predict) break;
    if (opt.keep_going && !opt.keep_going()) {
      st.stopped_by_caller = true;
      break;
    }
    // session.n_past tokens are in the state and ev.id waits to be fed.
    if (opt.n_ctx > 0 && session.n_past + 1 >= opt.n_ctx) {
      st.context_full = true;
      break;
    }
    const int tok = ev.id;
    auto t1 = clock::now();
    Session* one = &session;
    if (on_device && engine.forward_rows_greedy(std::span<Session* const>(&one, 1), std::span<const int>(&tok, 1), greedy)) {
      logits.clear();
    } else {
      greedy.clear();
      logits = engine.forward(session, std::span<const int>(&tok, 1));
    }
    st.decode_seconds += std::chrono::duration<double>(clock::now() - t1).count();
    ++st.n_decode_steps;
    st.fed.push_back(tok);
  }
  return st;
}

}  // namespace coli
