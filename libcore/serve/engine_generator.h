// EngineGenerator: coli-serve's generation slots over an Engine and its
// Tokenizer. A request's prompt is the chat template rendered over its
// messages (as coli-run --messages renders them) or a completion's text;
// the reply is generated with the request's sampling and handed out as text
// pieces, stop strings applied (serve/stop_strings.h), until an
// end-of-sequence id, a stop string, max_tokens or the context ends it, or
// the caller's callback returns false (a client gone).
//
// Slots (`parallel` of them): each holds a session and the ids in it. One
// scheduler thread owns the engine and runs steps. While slots are
// generating, each step is one batched forward of their decode rows and of
// up to prompt_chunk prompt ids of slots still reading theirs, round robin
// (Engine::forward_segments: the trunk and the routed experts read once
// for all of them), so a long prompt does not stall the replies in flight
// and a new request's prompt costs the others little (continuous batching
// with chunked prefill, as llama-server's). With no slot generating, a
// prompt goes whole as a pass of its own. mixed false: every prompt chunk
// is a pass of its own, between the decode steps (Engine::forward_rows).
// Each row is sampled with its own request's sampler (the rows of a step
// at once, on helper threads): a slot's tokens are those it would get
// alone (greedy: identical where routing is stable). A step whose rows are
// all greedy takes their ids from where the logits are computed
// (Engine::forward_rows_greedy: a GPU copies no logits to the host).
//
// Prompt reuse: a request takes the free slot whose ids are the longest
// prefix of its prompt (a chat's next turn: the earlier prompt, the reply,
// the new message), and feeds only the rest, so its prompt time does not
// grow with the conversation; a slot whose ids are not a prefix of the
// prompt starts a fresh session (a Gated DeltaNet state cannot be rolled
// back to a shorter prefix).
//
// Threads: run() may be called from any number of threads at once; each
// call waits for a slot, and its on_text runs on the calling thread (a
// slow client delays only its own generation: pieces queue up for it).
// The engine and tokenizer must outlive the generator; the destructor
// waits for the requests in flight.
#pragma once
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "engine/generate.h"
#include "serve/openai_api.h"
#include "serve/stop_strings.h"
#include "tokenizer/tokenizer.h"
#include "util/worker_pool.h"

namespace coli::serve {

struct GenerationResult {
  std::string finish_reason;  // "stop" or "length"; empty when cancelled
  Usage usage;                // prompt_tokens: the whole prompt; prompt_n in timings: the ids fed
  int cached_tokens = 0;      // of the prompt, ids the slot already held
  bool cancelled = false;
};

class EngineGenerator {
 public:
  // n_ctx: the context in tokens (prompt + reply) of each slot; > 1.
  // parallel: slots (>= 1). prompt_chunk: most prompt ids a decode step of
  // the other slots takes along, or feeds between two of them (>= 1).
  EngineGenerator(Engine& engine, const Tokenizer& tok, int n_ctx, int parallel = 1, int prompt_chunk = 256, bool mixed = true);
  ~EngineGenerator();
  EngineGenerator(const EngineGenerator&) = delete;
  EngineGenerator& operator=(const EngineGenerator&) = delete;

  // The prompt's ids; ApiError 400 when it leaves no room in the context.
  std::vector<int> prompt_ids(const GenerationRequest& r) const;
  // Generates the reply to r, whose prompt_ids() are `prompt`; on_text gets
  // each piece (never an empty one) and returns false to cancel. Rethrows
  // what the engine threw for this request (its slot starts afresh).
  GenerationResult run(const GenerationRequest& r, const std::vector<int>& prompt, const std::function<bool(const std::string&)>& on_text);
  // Runs fn on the calling thread while the engine is between two steps
  // (the backend's counters for /metrics).
  void with_engine(const std::function<void()>& fn);

  const Tokenizer& tokenizer() const { return tok_; }
  int n_ctx() const { return n_ctx_; }
  int parallel() const { return static_cast<int>(slots_.size()); }
  // Decode steps run and the rows they carried (rows / steps: the batch).
  long long decode_steps() const;
  long long decode_rows() const;
  // Prompt ids those steps took along (mixed).
  long long step_prompt_ids() const;
  // Requests inside run(): waiting for a slot or in one.
  int in_flight() const;
  // Where the scheduler's time went, in seconds since the start: prompt
  // chunks' forwards, decode steps' batched forwards, sampling and handing
  // out their rows, admitting requests (a fresh session where no prefix
  // matches). The rest of its time it waited for work.
  struct PhaseSeconds {
    double prompt = 0, decode_forward = 0, decode_sample = 0, admit = 0;
  };
  PhaseSeconds phase_seconds() const;

 private:
  struct Job;
  struct Slot;
  void loop();
  void admit(Job* job);
  void prefill_chunk(Slot& s);
  // The generating slots' decode rows and (mixed) prompt chunks of slots
  // reading theirs, as one forward.
  void decode_step();
  int sample_row(Slot& s, std::span<const float> logits, std::size_t row);
  void take(Slot& s, int id);
  static int sample_helpers(int parallel);
  void finish(Slot& s, const std::string& reason);
  void fail_all(std::exception_ptr e);

  Engine& engine_;
  const Tokenizer& tok_;
  ChatStyle style_;
  int n_ctx_, prompt_chunk_;
  bool mixed_;
  std::vector<int> stop_ids_;  // the model's end-of-sequence ids and the tokenizer's
  std::vector<std::unique_ptr<Slot>> slots_;  // the scheduler's
  std::size_t next_prefill_ = 0;              // round robin over slots reading their prompts
  std::vector<float> rows_logits_;            // the scheduler's: each decode step's [rows, vocab], one buffer reused
  WorkerPool sample_pool_;                    // the scheduler's: samples a step's rows at once
  mutable std::mutex mu_;                     // queue_, stop_, the counters
  std::condition_variable cv_;
  std::deque<Job*> queue_;
  bool stop_ = false;
  long long steps_ = 0, rows_ = 0, step_prompt_ids_ = 0;
  PhaseSeconds phases_;
  int in_flight_ = 0;
  std::mutex engine_mu_;  // held by the scheduler around each engine call; with_engine takes it
  std::thread thread_;
};

}  // namespace coli::serve
