// generate(): prompt in, tokens out, through an Engine session.
//
// Token 1 comes from the prompt's logits; each later token costs one decode
// step. The Sampler picks tokens (temperature 0 = greedy). Stops after
// n_predict tokens or at a stop id (end-of-sequence ids of the model and the
// tokenizer) unless ignore_eos; the stop id is reported but not fed back.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "sampling/sampler.h"

namespace coli {

// The most tokens GenerateOptions::draft may ask a step to draft.
constexpr int kMaxDraft = 8;

struct GenerateOptions {
  int n_predict = 16;
  SamplingParams sampling;
  int top_logprobs = 0;  // report this many most likely ids per step
  // Report each token's logprob (a log-softmax over the whole vocabulary
  // per step: 248,320 exponentials at the real size). Off: TokenEvent's
  // logprob is 0 and only a scan checks that the logits are finite.
  bool logprobs = true;
  bool ignore_eos = false;
  std::vector<int> stop_ids;  // in addition to the model's eos ids
  int n_ctx = 0;              // context size in tokens (session + prompt + generated); 0: no limit
  // Asked after each token's callback: false ends the generation there (a
  // stop string, a client gone); GenerateStats::stopped_by_caller says so.
  std::function<bool()> keep_going;
  // Speculative decoding with the model's MTP layer (engine/speculative.h):
  // up to `draft` drafted tokens verified per step; 0: off. The model must
  // have an MTP module (Engine::has_mtp).
  int draft = 0;
  // Tests: a draft proposed for generated token i (from 0) becomes
  // draft_hook(i, proposed): a drafter right or wrong where a test says.
  std::function<int(int i, int proposed)> draft_hook;
};

struct TokenEvent {
  int id = 0;
  float logprob = 0;                       // of the chosen id, under the raw logits (when asked for)
  std::vector<std::pair<int, float>> top;  // (id, logprob), most likely first
  bool is_stop = false;                    // an end-of-sequence id that ends generation
};

struct GenerateStats {
  int n_prompt = 0;
  int n_generated = 0;
  double prefill_seconds = 0;  // prompt forward pass
  double decode_seconds = 0;   // all later steps
  int n_decode_steps = 0;
  bool context_full = false;  // generation stopped at n_ctx
  bool stopped_by_caller = false;  // GenerateOptions::keep_going said no
  std::vector<int> fed;  // ids fed to the session by this call (prompt + generated but the last)
  // Speculative decoding (GenerateOptions::draft): tokens drafted and of
  // them accepted; rounds (verify chunks, also in n_decode_steps); the MTP
  // layer's share of the decode time; why drafting was off ("" when on or
  // not asked for).
  int n_drafted = 0, n_accepted = 0, n_rounds = 0;
  double mtp_seconds = 0;
  std::string draft_off;
};

GenerateStats generate(Engine& engine, Session& session, std::span<const int> prompt, const GenerateOptions& opt,
                       const std::function<void(const TokenEvent&)>& on_token);

// The event of choosing `id` from logits (its logprob and the top ones
// when asked for, whether it stops); `step` names the step in errors. The
// caller has checked the logits (check_logits_finite) before sampling.
// generate()'s and generate_speculative()'s.
TokenEvent token_event(std::span<const float> logits, int id, const GenerateOptions& opt, const std::vector<int>& stops, const std::string& step);
// The prompt is not empty and fits opt.n_ctx with one generated token.
void check_generate_args(const Session& session, std::span<const int> prompt, const GenerateOptions& opt);

// log-softmax of logits (double accumulation). Throws coli::Error naming
// `step` when a logit is NaN or +Inf (which make the normaliser non-finite).
std::vector<float> log_softmax(const std::vector<float>& logits, const std::string& step);
std::vector<float> log_softmax(std::span<const float> logits, const std::string& step);
// The same check alone, one pass without exponentials: NaN or +Inf is a
// coli::Error naming `step` and the first such id (-Inf is a legal "never").
void check_logits_finite(const std::vector<float>& logits, const std::string& step);
void check_logits_finite(std::span<const float> logits, const std::string& step);  // a row of a batch, in place
// A greedy id found on the device (Engine::forward_rows_greedy's code):
// the id, or the coli::Error check_logits_finite throws for its row.
int check_greedy_id(int code, const std::string& step);

}  // namespace coli
