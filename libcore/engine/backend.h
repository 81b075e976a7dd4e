// Backend: the coarse per-layer operations the engine schedules.
//
// One call per layer step, so a backend can fuse inside a step and a
// scheduler can split work between backends. Activations are row-major
// float32 [T, hidden] host arrays at this interface. The CPU backend
// implements every operation; it is the reference the others are tested
// against (and the always-available fake of a device in tests).
//
// Threads: a backend is not thread-safe. One thread at a time calls it (the
// engine's); a backend may run threads of its own inside a call (the CPU
// backend's pool, the CUDA backend's hybrid handoff thread), and those are
// idle or parked again when the call returns, except between start_chunk
// and finish_chunk, when the chunk may still be running on them.
//
// Lifetimes: the model given at construction must outlive the backend;
// the backend owns what it made of the weights (device copies, packed
// rows) and the per-session state new_state() returns, which is used only
// with the backend that made it and must outlive any chunk started on it.
// Pointers passed to a call are read or written during that call only;
// start_chunk's ids are read until finish_chunk returns.
//
// What a failed call leaves: an operation that throws coli::Error leaves
// the weights intact and the session state it was given undefined (a
// layer's KV cache or recurrent state may be part advanced): start a new
// session. The backend stays usable unless the device itself failed (a
// sticky CUDA error, named in the message). A chunk started and never
// finished is drained by a device backend's next call, or forgotten by the
// default start_chunk (which had not run it); its logits are dropped
// either way. finish_chunk rethrows what failed while the chunk ran, and
// that chunk's logits are then void.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace coli {

// Per-session state a backend keeps for the model: KV cache of attention
// layers, conv and recurrent state of Gated DeltaNet layers.
class BackendState {
 public:
  virtual ~BackendState() = default;
};

// One routed (token, expert) assignment with its renormalised router weight.
struct ExpertPair {
  int token;
  int expert;
  float weight;
  // > 0: only the expert's intermediate rows [first_row, moe_intermediate)
  // (gate and up rows, down columns): a decode expert split between a
  // device, which computes the rows before it, and the host. A multiple
  // of 32; 0: the whole expert.
  int first_row = 0;
};

// What a backend with an expert tier reports (coli-run's stats line,
// coli-bench's records). Counts are since the backend was made.
struct TierStats {
  bool tiered = false;           // an expert tier with a budget or a slot count
  long long resident = 0, experts = 0;  // (layer, expert) pairs in VRAM slots / in the model
  long long pairs = 0, misses = 0;      // routed (token, expert) pairs computed; of them on the host
  long long handoffs = 0;               // device -> host -> device round trips
  long long device_misses = 0;          // misses uploaded and computed on the device instead (CudaOptions::decode_upload_max)
  long long pcie_read = 0;              // experts outside the tier that one-token steps may read over PCIe in place (CudaOptions::pcie_read_share)
  long long pcie_misses = 0;            // pairs outside the tier the device read over PCIe (not in misses: the GPU computed them)
  long long split_misses = 0;           // of the misses, experts split by rows between the device (over PCIe) and the host (CudaOptions::split_experts)
  long long prompt_misses = 0;          // of the misses, prompt chunks' (T > 1), and the distinct experts of each post they went to (host_expert_bytes counts those once)
  long long prompt_experts = 0;
  double pcie_read_share = 0;           // the split's share in effect (CudaOptions::pcie_read_share; 0 when no expert is readable)
  long long tokens = 0;                 // tokens run through the model
  uint64_t host_expert_bytes = 0;       // expert weights the host read for the misses
  uint64_t pcie_expert_bytes = 0;       // decode steps' expert weights over PCIe: read in place (pcie_misses) and uploaded (device_misses)
  double host_experts_ms = 0;           // the host computing misses
  double device_wait_ms = 0;            // the device waiting for the host
  double device_experts_ms = 0;         // the device's own expert work meanwhile (shared and resident experts, post to join)
  long long swaps = 0;                  // background swaps completed (a hot miss took a cold resident's slot)
  uint64_t swap_bytes = 0;              // expert bytes those swaps copied to the device
  uint64_t prefill_upload_bytes = 0;    // expert bytes prompt chunks uploaded (CudaOptions::prefill_upload)
  bool prefill_upload = false;          // prompt chunks upload the experts the tier lacks (their staging fit the budget)
  double prefill_wait_ms = 0;           // prompt chunks: the GPU's expert kernels waiting for staged copies (not overlapped)
  // Where prompt chunks' experts ran in the layers that uploaded: per
  // (layer, chunk) each expert once, resident in a slot, uploaded, or on
  // the host (the third place); and the host's time on prompt experts.
  long long prefill_placed_resident = 0, prefill_placed_uploaded = 0, prefill_placed_host = 0;
  // Of the host's: those a chunk's routing made hot, read over PCIe by the
  // GPU instead (CudaOptions::prefill_hot_pairs).
  long long prefill_hot_pcie = 0;
  double prefill_host_ms = 0;
  uint64_t pinned_host_bytes = 0;       // host memory registered with the device for this backend (a mirror, a container's mapping)
  bool pin_pending = false;             // a background pin of the weights not yet taken over (CudaOptions::pending_pin)
  double pin_wait_ms = 0;               // prompt chunks' wait for that pin
  long long pin_switch_tokens = -1;     // tokens run on the pageable path before the switch to the pin (-1: none taken)
  uint64_t vram_budget = 0, vram_peak = 0;  // bytes: the limit (0: none) and the most charged at once
  double hit_rate() const { return pairs ? 1.0 - double(misses) / double(pairs) : 1.0; }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Threads the backend computes with (for benchmark records).
  virtual int num_threads() const { return 1; }
  virtual std::unique_ptr<BackendState> new_state() const = 0;

  // x[T, H] = embedding rows of ids.
  virtual void embed(const int* ids, int T, float* x) = 0;
  // Trunk step: x += mixer(input_norm(x)) for tokens at positions
  // pos0 .. pos0+T-1, where the mixer is gated attention or Gated DeltaNet
  // by the layer's kind. Appends to / advances the layer's state (an
  // attention cache longer than pos0 is cut to pos0 first: a rewound
  // session, or the MTP layer drafting again from an earlier position).
  virtual void trunk_step(int layer, BackendState& state, int pos0, int T, float* x) = 0;
  // The trunk step of S rows of S sessions, one token each at its own
  // position (Engine::forward_rows): row i of x[S, hidden] gets
  // x[i] += mixer(input_norm(x[i])) with *states[i] at positions[i]. The
  // states are distinct. Default: trunk_step row by row; a backend may
  // batch the rows' row-wise work (projections) and step each row's own
  // cache or state.
  virtual void trunk_rows(int layer, BackendState* const* states, const int* positions, int S, int hidden, float* x);
  // hn[T, H] = post_attention_norm(x).
  virtual void ffn_norm(int layer, int T, const float* x, float* hn) = 0;
  // Router: softmax over experts, top-k (most probable first, ties to the
  // lower index), weights renormalised to sum to 1. idx, w: [T, k].
  // Sparse layers only (ModelSpec::is_sparse).
  virtual void route(int layer, int T, const float* hn, int* idx, float* w) = 0;
  // out[T, H] = sigmoid(shared_gate . hn) * SwiGLU_shared(hn); 0 in a model
  // without a shared expert (qwen3_moe); in a dense layer its MLP,
  // SwiGLU_dense(hn), with no gate.
  virtual void shared_expert(int layer, int T, const float* hn, float* out) = 0;
  // out[t] = sum over the pairs p with p.token == t of
  // p.weight * SwiGLU_expert(hn[t]), for t = 0 .. the largest p.token
  // (rows without pairs become 0; rows after it are left alone).
  virtual void routed_experts(int layer, const ExpertPair* pairs, int n, const float* hn, float* out) = 0;
  // x[i] += routed[i] + shared[i] for i < n: the MoE output added to the
  // residual. Default: one loop on the calling thread.
  virtual void add_moe_output(std::size_t n, const float* routed, const float* shared, float* x);
  // logits[T, V] = lm_head(final_norm(x)).
  virtual void logits(int T, const float* x, float* out) = 0;

  // Multi-token prediction (ModelSpec::mtp_layers; Engine::mtp_forward).
  // The MTP decoder layer runs through the per-layer steps above as layer
  // num_layers (its KV cache is in the session's state like any layer's);
  // these are the module's parts around it. Defaults throw: a backend that
  // has not built them names itself.
  // h[T, H] = final_norm(x) (mtp false: the hidden the main model gives the
  // MTP layer) or the MTP module's norm (mtp true: the MTP's own output,
  // which a chained draft reads back); logits() is lm_head(output_norm).
  virtual void output_norm(int T, const float* x, float* h, bool mtp);
  // logits[T, V] = lm_head(h) for rows h already normed.
  virtual void lm_head(int T, const float* h, float* out);
  // x[T, H] = fc([pre_fc_norm_embedding(e) | pre_fc_norm_hidden(h)]): the
  // MTP layer's input from token embeddings e and hidden rows h.
  virtual void mtp_input(int T, const float* e, const float* h, float* x);
  // The whole MTP pass in one call (what Engine::mtp_forward's per-layer
  // steps compute, on a device): rows ids[0..T) with hidden rows h[T, H] at
  // positions pos0.., the logits of the last logit_rows rows into logits,
  // and with g the MTP's output rows after its norm [T, H]. false: the
  // backend does not (the default; the engine runs the steps).
  virtual bool mtp_chunk(BackendState& state, const int* ids, const float* h, int T, int pos0, int logit_rows, float* logits, float* g) {
    return false;
  }

  // Speculative verification (Engine::mark / Engine::rewind): mark_state
  // starts keeping, in the state, what rewinding the recurrent (Gated
  // DeltaNet) layers needs: their state now and the inputs of the tokens
  // the trunk steps feed from now on. rewind_state(tokens) sets those
  // layers to their state after the first `tokens` tokens fed since the
  // mark (all of them: as they are) and stops keeping. Attention caches
  // need nothing: a trunk step at position p drops the cache from p on.
  // Defaults throw.
  virtual void mark_state(BackendState& state);
  virtual void rewind_state(BackendState& state, int tokens);

  // A backend that keeps activations on its own device runs a whole chunk
  // (embedding, every layer, the logits) in one call: the engine then calls
  // forward_chunk instead of the steps above (unless it must observe the
  // routing). Tokens ids[0..T) at positions pos0.. of the session; logits of
  // the last logit_rows tokens (0, 1 or T) into logits[logit_rows, V].
  virtual bool runs_whole_chunks() const { return false; }
  // The decode step of S sessions as one pass, for a backend that runs
  // whole chunks (Engine::forward_rows): row i is token ids[i] at position
  // positions[i] of *states[i] (distinct states, S >= 2), its logits row i
  // of logits[S, V]; each row's logits are those of its session stepped
  // alone up to the rounding of S-row kernels. false: not taken, nothing
  // done (the default; the engine then steps each session alone).
  // logits may be null where kept_logits() is not: the rows then stay in
  // the backend's own host buffer.
  virtual bool step_rows(BackendState* const* states, const int* ids, const int* positions, int S, float* logits) { return false; }
  // The same for segments of n sessions (Engine::forward_segments: decode
  // rows and prompt chunks in one pass): segment i is the lens[i] tokens
  // ids[off_i ..) (the segments' ids one after another) at positions
  // positions[i].. of *states[i]; its last token's logits are row i of
  // logits[n, V] (or of kept_logits(); kept_greedy() with greedy_only).
  // false: not taken, nothing done (the engine's per-layer path runs it).
  virtual bool step_segments(BackendState* const* states, const int* ids, const int* positions, const int* lens, int n, float* logits) {
    return false;
  }
  // The host buffer a backend that runs whole chunks copies each chunk's
  // logits into (pinned memory on a GPU) before finish_chunk or step_rows
  // writes them to the caller's: after a step_rows or finish_chunk given
  // no logits (null: allowed only where this is not), their rows [rows, V],
  // valid until the next chunk or step starts. Null (the default): the
  // backend keeps none; pass a buffer.
  virtual const float* kept_logits() const { return nullptr; }
  // Greedy ids where the logits are computed (a greedy decode step hands
  // the host an id a row, not a vocabulary of floats). greedy_only(true)
  // on a backend that runs whole chunks: every chunk or rows step from now
  // on computes, for each logits row, the id of its largest logit (ties to
  // the lower id: Sampler::sample at temperature 0 without penalties) into
  // kept_greedy()'s [logit_rows] and copies no logits (the logits argument
  // and kept_logits() are not written), until greedy_only(false). A code
  // below 0 marks a row that is not finite (-1: no logit above -Inf; -2 - i:
  // id i is NaN or +Inf). Not between start_chunk and finish_chunk. Returns
  // whether the backend does it (the default: false, nothing changes).
  virtual bool greedy_only(bool on) { return false; }
  // The ids of the last chunk or rows step taken greedy_only; null when none.
  virtual const int* kept_greedy() const { return nullptr; }
  // The expert tier's counters (zeros for a backend without one).
  virtual TierStats tier_stats() const { return {}; }
  // Where construction's time went: named phases in milliseconds, in order
  // (empty for a backend that does not time them). For the tools' logs.
  virtual std::vector<std::pair<std::string, double>> start_phases() const { return {}; }
  virtual void forward_chunk(BackendState& state, const int* ids, int T, int pos0, int logit_rows, float* logits);
  // forward_chunk in two halves, so that the caller's own work (allocating
  // the logits) overlaps the device's: start_chunk launches and returns,
  // finish_chunk waits and writes the logits; ids must stay valid until
  // then. Default: start remembers the arguments, finish runs forward_chunk.
  virtual void start_chunk(BackendState& state, const int* ids, int T, int pos0, int logit_rows);
  virtual void finish_chunk(BackendState& state, float* logits);
  // Whole chunks that also give every row's final-normed hidden (the MTP
  // layer's input): after chunk_hidden(h) returns true, the next chunk
  // started writes its [T, hidden] rows to h by the time its finish_chunk
  // returns (h must stay valid until then). false: not kept (the default;
  // the engine then takes the per-layer steps, which compute them).
  virtual bool chunk_hidden(float* hidden) { return false; }

  // Routing heat counted on the device by a backend that runs whole chunks
  // (the engine counts the per-layer path's route() itself): every token of
  // every forward_chunk / start_chunk adds 1 to counts[layer * experts + e]
  // for each expert e of its top-k at that layer; route() calls are not
  // counted. read_heat sets counts to the table [layers * experts] counted
  // since the last call, zeroes it, and returns true. It waits for the
  // device; call it from the thread that runs the chunks, not between
  // start_chunk and finish_chunk. Default: false, nothing counted.
  virtual bool read_heat(std::vector<uint64_t>& counts) { return false; }

 private:
  struct PendingChunk {
    const int* ids = nullptr;
    int T = 0, pos0 = 0, logit_rows = 0;
  } pending_;
};

}  // namespace coli
