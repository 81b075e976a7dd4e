// Sampler: logits -> next token id, the llama.cpp chain in its order:
// repetition and presence penalties over the last `penalty_last_n` ids,
// then top-k, top-p (nucleus), min-p, temperature, and a draw from a seeded
// RNG. Temperature <= 0 is greedy (argmax after penalties, ties to the lower
// id). A disabled stage: top_k <= 0, top_p >= 1, min_p <= 0, penalty 1 / 0.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace coli {

struct SamplingParams {
  float temperature = 0.8f;
  int top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;    // > 1 discourages repeats: logit / p if > 0, logit * p otherwise
  float presence_penalty = 0.0f;  // subtracted once from every id seen
  int penalty_last_n = 64;        // ids of the history the penalties look at (-1: all)
  uint64_t seed = 0;
};

// Throws coli::UsageError naming the coli-run flag of the first parameter
// out of its range: temperature, penalties and probabilities must be
// finite numbers (temperature >= 0, top_p in (0, 1], min_p in [0, 1],
// repeat_penalty > 0), top_k >= 0 and penalty_last_n >= -1.
void check_sampling_params(const SamplingParams& p);

class Sampler {
 public:
  // Throws as check_sampling_params for parameters out of range.
  explicit Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) { check_sampling_params(p); }
  // history: prompt and generated ids so far (for the penalties).
  int sample(std::span<const float> logits, std::span<const int> history);
  // Whether sample() is the logits' first largest alone (temperature 0, no
  // penalties): what a backend's greedy ids give (Backend::greedy_only).
  bool greedy() const { return p_.temperature <= 0 && p_.repeat_penalty == 1.0f && p_.presence_penalty == 0.0f; }
  // The probability of each candidate left after the filters, for tests:
  // (id, p) sorted by p descending; empty when greedy.
  std::vector<std::pair<int, float>> distribution(std::span<const float> logits, std::span<const int> history) const;
  // A draw from a distribution of (id, p) whose p sum to 1 (distribution's,
  // or speculative sampling's residual), and a uniform number in [0, 1),
  // both from this sampler's RNG (engine/speculative.h).
  int draw(std::span<const std::pair<int, float>> dist);
  double uniform();

 private:
  // The logits after the penalties: logits itself when none applies, else
  // buf (resized, reused across calls) holding the penalised copy.
  const float* penalised(std::span<const float> logits, std::span<const int> history, std::vector<float>& buf) const;
  std::vector<std::pair<int, float>> distribution(std::span<const float> logits, std::span<const int> history, std::vector<float>& buf) const;
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<float> buf_;  // sample()'s penalised logits
};

}  // namespace coli
