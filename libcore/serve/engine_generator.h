// EngineGenerator: one generation slot of coli-serve over an Engine and its
// Tokenizer. A request's prompt is the chat template rendered over its
// messages (as coli-run --messages renders them) or a completion's text;
// the reply is generated with the request's sampling and handed out as text
// pieces, stop strings applied (serve/stop_strings.h), until an
// end-of-sequence id, a stop string, max_tokens or the context ends it, or
// the caller's callback returns false (a client gone).
//
// Prompt reuse: the slot keeps its session and the ids in it; a request
// whose prompt extends them (a chat's next turn: the earlier prompt, the
// reply, the new message) feeds only the new ids, so its prompt time does
// not grow with the conversation. Any other prompt starts a fresh session
// (a Gated DeltaNet state cannot be rolled back to a shorter prefix).
//
// Threads: not thread-safe; the server runs one request at a time on it.
// The engine and tokenizer must outlive it. One slot (parallel slots with
// batched decoding are issue 32's next step).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/generate.h"
#include "serve/openai_api.h"
#include "serve/stop_strings.h"
#include "tokenizer/tokenizer.h"

namespace coli::serve {

struct GenerationResult {
  std::string finish_reason;  // "stop" or "length"; empty when cancelled
  Usage usage;                // prompt_tokens: the whole prompt; prompt_n in timings: the ids fed
  int cached_tokens = 0;      // of the prompt, ids the slot already held
  bool cancelled = false;
};

class EngineGenerator {
 public:
  // n_ctx: the context in tokens (prompt + reply); > 0.
  EngineGenerator(Engine& engine, const Tokenizer& tok, int n_ctx);

  // The prompt's ids; ApiError 400 when it leaves no room in the context.
  std::vector<int> prompt_ids(const GenerationRequest& r) const;
  // Generates the reply to r, whose prompt_ids() are `prompt`; on_text gets
  // each piece (never an empty one) and returns false to cancel.
  GenerationResult run(const GenerationRequest& r, const std::vector<int>& prompt, const std::function<bool(const std::string&)>& on_text);

  const Tokenizer& tokenizer() const { return tok_; }
  int n_ctx() const { return n_ctx_; }

 private:
  Engine& engine_;
  const Tokenizer& tok_;
  ChatStyle style_;
  int n_ctx_;
  Session session_;
  std::vector<int> fed_;  // the ids in session_
};

}  // namespace coli::serve
