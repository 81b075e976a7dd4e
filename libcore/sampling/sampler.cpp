#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
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

namespace {

constexpr std::size_t kBlock = 128;  // logits per block of the top-k scan

// The largest of l[i, end) (NaN loses; -Inf when empty): eight running
// maxima, which the compiler keeps in vector registers.
float block_max(const float* l, std::size_t i, std::size_t end) {
  float m[8];
  for (float& v : m) v = -std::numeric_limits<float>::infinity();
  for (; i + 8 <= end; i += 8)
    for (int k = 0; k < 8; ++k) m[k] = l[i + k] > m[k] ? l[i + k] : m[k];
  for (; i < end; ++i) m[0] = l[i] > m[0] ? l[i] : m[0];
  float r = m[0];
  for (float v : m) r = v > r ? v : r;
  return r;
}

// The k best ids of l[0, n) by logit, then the lower id (0 < k < n), in
// that order: what a partial sort of every id gives. A heap of the k best
// so far (its worst at the front) and blocks of kBlock logits: a block
// whose maximum is below the worst kept cannot hold a better one, and for a
// vocabulary's logits nearly every block after the first few is skipped on
// its vectorized maximum alone (248,320 logits, k = 40, default sampling:
// 1,341 us a token with a partial sort of every id, 56 us this way, on the
// development machine; the same ids: Sampler.TopKScanMatchesAFullSort).
std::vector<int> top_ids(const float* l, std::size_t n, std::size_t k) {
  auto better = [&](int a, int b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
  std::vector<int> heap;
  heap.reserve(k);
  std::size_t i = 0;
  for (; i < k; ++i) heap.push_back(static_cast<int>(i));
  std::make_heap(heap.begin(), heap.end(), better);
  while (i < n) {
    const std::size_t end = std::min(n, i + kBlock);
    if (block_max(l, i, end) < l[heap.front()]) {  // ties go on: a lower id never comes later
      i = end;
      continue;
    }
    for (; i < end; ++i)
      if (l[i] >= l[heap.front()] && better(static_cast<int>(i), heap.front())) {
        std::pop_heap(heap.begin(), heap.end(), better);
        heap.back() = static_cast<int>(i);
        std::push_heap(heap.begin(), heap.end(), better);
      }
  }
  std::sort(heap.begin(), heap.end(), better);
  return heap;
}

}  // namespace

const float* Sampler::penalised(std::span<const float> logits, std::span<const int> history, std::vector<float>& buf) const {
  if (p_.repeat_penalty == 1.0f && p_.presence_penalty == 0.0f) return logits.data();
  buf.assign(logits.begin(), logits.end());
  const std::size_t n = p_.penalty_last_n < 0 ? history.size() : std::min<std::size_t>(history.size(), p_.penalty_last_n);
  std::unordered_set<int> seen(history.end() - n, history.end());
  for (int id : seen) {
    if (id < 0 || id >= static_cast<int>(buf.size())) continue;
    float& v = buf[id];
    v = v > 0 ? v / p_.repeat_penalty : v * p_.repeat_penalty;
    v -= p_.presence_penalty;
  }
  return buf.data();
}

std::vector<std::pair<int, float>> Sampler::distribution(std::span<const float> logits, std::span<const int> history) const {
  std::vector<float> buf;
  return distribution(logits, history, buf);
}

std::vector<std::pair<int, float>> Sampler::distribution(std::span<const float> logits, std::span<const int> history, std::vector<float>& buf) const {
  if (p_.temperature <= 0 || logits.empty()) return {};
  const float* l = penalised(logits, history, buf);
  auto by_logit = [&](int a, int b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
  std::vector<int> ids;
  if (p_.top_k > 0 && static_cast<std::size_t>(p_.top_k) < logits.size()) {
    ids = top_ids(l, logits.size(), p_.top_k);
  } else {
    ids.resize(logits.size());
    std::iota(ids.begin(), ids.end(), 0);
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
  if (logits.empty()) throw Error("sampler: no logits");
  if (p_.temperature <= 0) {  // the first largest: ties to the lower id
    const float* l = penalised(logits, history, buf_);
    const std::size_t n = logits.size();
    // The first block holding the largest, then its first: two vectorized
    // passes' worth instead of a scalar scan with an index.
    constexpr std::size_t kGreedyBlock = 1024;
    float m = -std::numeric_limits<float>::infinity();
    std::size_t at = 0;
    for (std::size_t i = 0; i < n; i += kGreedyBlock)
      if (const float b = block_max(l, i, std::min(n, i + kGreedyBlock)); b > m) m = b, at = i;
    for (std::size_t i = at; i < std::min(n, at + kGreedyBlock); ++i)
      if (l[i] == m) return static_cast<int>(i);
    return 0;  // no logit above -Inf (or every one NaN): the first
  }
  return draw(distribution(logits, history, buf_));
}

double Sampler::uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }

int Sampler::draw(std::span<const std::pair<int, float>> d) {
  if (d.empty()) throw Error("sampler: an empty distribution (internal)");
  double r = uniform(), cum = 0;
  for (const auto& [id, p] : d) {
    cum += p;
    if (r < cum) return id;
  }
  return d.back().first;
}

}  // namespace coli
