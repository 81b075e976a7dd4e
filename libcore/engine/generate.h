// generate(): prompt in, tokens out, through an Engine session.
//
// Token 1 comes from the prompt's logits; each later token costs one decode
// step. Temperature 0 is greedy (argmax, ties to the lower id). Stops after
// n_predict tokens, or at an end-of-sequence id unless ignore_eos.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace coli {

struct GenerateOptions {
  int n_predict = 16;
  float temperature = 0.0f;
  uint64_t seed = 0;
  int top_logprobs = 0;  // report this many most likely ids per step
  bool ignore_eos = false;
};

struct TokenEvent {
  int id = 0;
  float logprob = 0;                        // of the chosen id, under the raw logits
  std::vector<std::pair<int, float>> top;   // (id, logprob), most likely first
};

struct GenerateStats {
  int n_prompt = 0;
  int n_generated = 0;
  double prefill_seconds = 0;  // prompt forward pass
  double decode_seconds = 0;   // all later steps
  int n_decode_steps = 0;
};

GenerateStats generate(Engine& engine, Session& session, std::span<const int> prompt, const GenerateOptions& opt,
                       const std::function<void(const TokenEvent&)>& on_token);

// log-softmax of logits (double accumulation).
std::vector<float> log_softmax(const std::vector<float>& logits);

}  // namespace coli
