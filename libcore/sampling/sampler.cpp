#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <unordered_set>

#include "util/error.h"

namespace coli {

void check_sampling_params(const SamplingParams& p) {
  auto need = [](bool ok, const char* flag, const char* range, float v) {
    if (!ok) throw UsageError(std::string(flag) + " must be " + range + ", not " + std::to_string(v));
  };
  // Written so that NaN fails every test.
  need(p.temperature >= 0 && std::isfinite(p.temperature), "--temp", "a finite number >= 0 (0: greedy)", p.temperature);
  need(p.top_p > 0 && p.top_p <= 1, "--top-p", "in (0, 1]", p.top_p);
  need(p.min_p >= 0 && p.min_p <= 1, "--min-p", "in [0, 1]", p.min_p);
  need(p.repeat_penalty > 0 && std::isfinite(p.repeat_penalty), "--repeat-penalty", "a finite number > 0 (1: off)", p.repeat_penalty);
  need(std::isfinite(p.presence_penalty), "--presence-penalty", "a finite number (0: off)", p.presence_penalty);
  if (p.top_k < 0) throw UsageError("--top-k must be >= 0 (0: off), not " + std::to_string(p.top_k));
  if (p.penalty_last_n < -1) throw UsageError("--repeat-last-n must be >= -1 (-1: all), not " + std::to_string(p.penalty_last_n));
}

std::vector<float> Sampler::penalised(std::span<const float> logits, std::span<const int> history) const {
  std::vector<float> l(logits.begin(), logits.end());
  if (p_.repeat_penalty == 1.0f && p_.presence_penalty == 0.0f) return l;
  const std::size_t n = p_.penalty_last_n < 0 ? history.size() : std::min<std::size_t>(history.size(), p_.penalty_last_n);
  std::unordered_set<int> seen(history.end() - n, history.end());
  for (int id : seen) {
    if (id < 0 || id >= static_cast<int>(l.size())) continue;
    float& v = l[id];
    v = v > 0 ? v / p_.repeat_penalty : v * p_.repeat_penalty;
    v -= p_.presence_penalty;
  }
  return l;
}

std::vector<std::pair<int, float>> Sampler::distribution(std::span<const float> logits, std::span<const int> history) const {
  if (p_.temperature <= 0) return {};
  std::vector<float> l = penalised(logits, history);
  std::vector<int> ids(l.size());
  std::iota(ids.begin(), ids.end(), 0);
  auto by_logit = [&](int a, int b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
  std::size_t k = ids.size();
  if (p_.top_k > 0 && static_cast<std::size_t>(p_.top_k) < k) {
    k = p_.top_k;
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), by_logit);
    ids.resize(k);
  } else {
    std::sort(ids.begin(), ids.end(), by_logit);
  }
  // Probabilities of the kept candidates at temperature 1 for top-p/min-p
  // (llama.cpp applies temperature last).
  auto softmax = [&](float temp) {
    std::vector<double> p(ids.size());
    const double m = l[ids[0]];
    double sum = 0;
    for (std::size_t i = 0; i < ids.size(); ++i) sum += p[i] = std::exp((l[ids[i]] - m) / temp);
    for (auto& v : p) v /= sum;
    return p;
  };
  std::vector<double> p = softmax(1.0f);
  if (p_.top_p < 1.0f) {
    double cum = 0;
    std::size_t keep = ids.size();
    for (std::size_t i = 0; i < ids.size(); ++i) {
      cum += p[i];
      if (cum >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
    ids.resize(keep);
    p.resize(keep);
  }
  if (p_.min_p > 0.0f) {
    const double floor = p[0] * p_.min_p;
    std::size_t keep = 1;
    while (keep < ids.size() && p[keep] >= floor) ++keep;
    ids.resize(keep);
  }
  p = softmax(p_.temperature);
  std::vector<std::pair<int, float>> out(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) out[i] = {ids[i], static_cast<float>(p[i])};
  return out;
}

int Sampler::sample(std::span<const float> logits, std::span<const int> history) {
  if (p_.temperature <= 0) {
    std::vector<float> l = penalised(logits, history);
    return static_cast<int>(std::max_element(l.begin(), l.end()) - l.begin());
  }
  const auto d = distribution(logits, history);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  double r = u(rng_), cum = 0;
  for (const auto& [id, p] : d) {
    cum += p;
    if (r < cum) return id;
  }
  return d.back().first;
}

}  // namespace coli
