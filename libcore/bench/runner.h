// The coli-bench runner: llama-bench's tests over the cartesian product of
// the parameter lists, one record per (configuration, test), written as soon
// as it is measured.
//
// Tests (each at every depth d: d tokens of context are prefilled first,
// untimed, in every repetition):
//   pp N      prompt processing of N tokens          ts = N / time
//   tg N      N decode steps, one token each          ts = N / time
//   tg N xk   N verify steps of k tokens each         ts = N / time (steps)
//   tg N draftk  N tokens, k drafts a step (MTP)      ts = N / decode time
//   tg N pP   N decode steps of P sessions at once    ts = N x P / time
//             (Engine::forward_rows: coli-serve's slots; aggregate tok/s)
//   pp P+tg G P prompt tokens then G decode steps      ts = (P + G) / time
// Inputs are deterministic random token ids (seeded) or the ids of a text
// file. A warm-up run precedes the timed repetitions. A configuration that
// fails (bad model, out of memory, ...) gives records with an "error" field
// and the run goes on; so does a test whose depth + prompt + generation
// exceeds the model's max_position_embeddings.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/record_writer.h"
#include "engine/backend.h"
#include "model/weights.h"

namespace coli {

class HeatRecorder;
class MirrorAttachment;

struct BenchOptions {
  std::vector<std::string> models;
  std::vector<int> n_prompt = {512};
  std::vector<int> n_gen = {128};
  std::vector<std::pair<int, int>> prompt_gen;  // pp+tg pairs
  std::vector<int> n_depth = {0};
  // Tokens each tg step feeds: 1, or k > 1 for the cost of a speculative
  // verify step of k tokens (logits of every row; the context grows by k a
  // step; ts is then steps per second). Test "tgN xk".
  std::vector<int> n_verify = {1};
  // Drafts a step for "tgN draftK" tests (K > 0; 0: none): N tokens
  // generated greedily with speculative decoding by the model's MTP layer
  // after the depth's tokens (or one id) as the prompt; ts in tokens per
  // second of the decode part, with the acceptance rate, tokens a step and
  // the MTP layer's time in the record.
  std::vector<int> draft = {0};
  // Sessions decoded together for "tgN pP" tests (P > 1; 1: the plain tg
  // test): P sessions, each its own ids (and the depth's tokens, untimed),
  // step N times as one Engine::forward_rows call a step, as coli-serve's
  // slots do; ts is the aggregate of all P, latencies per step.
  std::vector<int> n_parallel = {1};
  std::vector<int> threads = {0};
  std::vector<int> n_batch = {2048};
  std::vector<int> n_ubatch = {512};        // 0: the factory's choice
  std::vector<uint64_t> vram_budget = {0};  // per configuration, passed to the factory as is
  int repetitions = 5;
  bool warmup = true;
  uint64_t seed = 0;
  // Random ids of their own for every repetition (seed + 1 + repetition;
  // the warm-up seed's): what a backend learns from one prompt's routing
  // is then measured on prompts it has not seen. Not with prompt_file.
  bool vary_prompt = false;
  std::string prompt_file;  // token source instead of random ids (needs a tokenizer)
  std::string mirror = "auto";  // coli-pin mirror: auto, off or a segment name (mirror/mirror_load.h)
  // Routing heat (placement/heat_recorder.h): the heat file of the model
  // with this fingerprint, "" for none; every token run (warm-up and depth
  // included) is counted and merged into it when the runner moves to the
  // next model and at the end. A file that does not match the model fails
  // that model's records; a failed save is a line on stderr and a failure.
  std::function<std::string(uint64_t fingerprint)> heat_path;
};

// What a configuration asks of the backend factory.
struct BackendRequest {
  const Model* model = nullptr;
  const MirrorAttachment* mirror = nullptr;  // the shared-memory mirror the model's blobs come from, or null
  std::string model_path;                    // as -m named it
  int threads = 0;                           // as -t asked (0: the backend's default)
  uint64_t vram_budget = 0;                  // one of BenchOptions::vram_budget, as the tool reads it
  int n_ubatch = 0;                          // one of BenchOptions::n_ubatch (0: the factory chooses)
  const HeatRecorder* heat = nullptr;        // the model's routing heat (its file), or null
  int sequences = 1;                         // sessions alive at once (the largest of BenchOptions::n_parallel)
};
// The backend it made, the chunk it runs (n_ubatch's value, or the chosen
// one) and record fields that describe the choice (coli-bench: where the
// experts are, the budget taken from the card, ...).
struct BenchBackend {
  std::unique_ptr<Backend> backend;
  int n_ubatch = 0;
  nlohmann::json fields = nlohmann::json::object();  // field name -> value, merged into each record
};
using BackendFactory = std::function<BenchBackend(const BackendRequest& request)>;

// Runs everything, writing records; progress lines go to `log` (may be null).
// Returns the number of records that carry an error.
int run_bench(const BenchOptions& opt, const BackendFactory& make_backend, RecordWriter& out, std::FILE* log);

}  // namespace coli
