#include "engine/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "util/error.h"

namespace coli {

std::vector<float> log_softmax(const std::vector<float>& logits) {
  const float m = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float v : logits) sum += std::exp(double(v) - m);
  const double lse = m + std::log(sum);
  std::vector<float> out(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<float>(logits[i] - lse);
  return out;
}

GenerateStats generate(Engine& engine, Session& session, std::span<const int> prompt, const GenerateOptions& opt,
                       const std::function<void(const TokenEvent&)>& on_token) {
  if (prompt.empty()) throw Error("the prompt is empty");
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

  for (int i = 0; i < opt.n_predict; ++i) {
    TokenEvent ev;
    ev.id = sampler.sample(logits, history);
    const std::vector<float> lp = log_softmax(logits);
    ev.logprob = lp[ev.id];
    if (opt.top_logprobs > 0) {
      std::vector<int> ids(lp.size());
      std::iota(ids.begin(), ids.end(), 0);
      const int k = std::min<int>(opt.top_logprobs, static_cast<int>(ids.size()));
      std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int a, int b) { return lp[a] > lp[b] || (lp[a] == lp[b] && a < b); });
      for (int j = 0; j < k; ++j) ev.top.emplace_back(ids[j], lp[ids[j]]);
    }
    ev.is_stop = !opt.ignore_eos && std::find(stops.begin(), stops.end(), ev.id) != stops.end();
    on_token(ev);
    ++st.n_generated;
    history.push_back(ev.id);
    if (ev.is_stop || i + 1 == opt.n_predict) break;
    const int tok = ev.id;
    auto t1 = clock::now();
    logits = engine.forward(session, std::span<const int>(&tok, 1));
    st.decode_seconds += std::chrono::duration<double>(clock::now() - t1).count();
    ++st.n_decode_steps;
    st.fed.push_back(tok);
  }
  return st;
}

}  // namespace coli
