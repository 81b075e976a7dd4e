// The CUDA backend: the whole model on one GPU. Weights are uploaded in
// their container formats (f32, bf16, f16, int8, int4 per row / grouped /
// asym) and every step of a chunk runs on the device: embedding, Gated
// DeltaNet and gated attention with their state and KV cache resident,
// router softmax + top-k, routed experts as two fused launches over all
// (token, expert) pairs, shared expert, lm_head. Only the token ids go in
// and the asked-for logits come out; a decode step is captured once as a
// CUDA graph and replayed. The per-layer Backend steps on host arrays run
// the same kernels one step at a time (uploading the step's input,
// downloading its output): the path of an engine that observes the
// routing. Plain C++ header: callers need no CUDA headers.
#pragma once
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda_device.h"
#include "cuda_tuning.h"
#include "engine/backend.h"
#include "engine/expert_host.h"
#include "model/weights.h"
#include "placement/swap_policy.h"
#include "placement/vram_ledger.h"
#include "util/error.h"

namespace coli::cuda {

// How the backend runs the step kinds (CudaOptions::profile).
enum class CudaProfile {
  kOff,
  // Each kind of step (projections, recurrence, router, experts, ...) timed
  // with events, graphs off; a table of kernel time on stderr at the end.
  kSteps,
  // Graphs on; the device time of a decode step's graph replay and the
  // host's share of a step on stderr at the end.
  kGraph,
  // Hybrid prefill's timeline: per prompt chunk and staging unit, when its
  // copies ran and when the GPU waited for them and finished with them
  // (ms from the chunk's start), on stderr after each chunk.
  kPrefill,
};

// Every field is the caller's: the library reads no environment variable.
// The tools take COLI_* variables into these fields (tools/env_options.h).
struct CudaOptions {
  int device = 0;
  int max_chunk = 512;   // most tokens per forward_chunk call (engine's prefill chunk)
  bool graphs = true;    // replay decode steps from a captured CUDA graph
  // Decode steps launch their kernels with Programmatic Dependent Launch
  // (sm_90+: each kernel starts while the previous one finishes).
  bool pdl = true;
  // Attention as split-KV online softmax (no T x heads x cache score
  // buffer, decode spread over splits of the cache) for head sizes of 32,
  // 64, 128 or 256; false: the score-buffer kernel (any head size).
  bool split_kv = true;
  // Gated DeltaNet prompt chunks in the chunked WY form (chunks of 64
  // tokens as dense products) where the head shape allows it; false: token
  // by token.
  bool chunked_gdn = true;
  // One-token int4 / int8 matmuls over at least this many rows (every
  // trunk projection and the lm_head's column ranges at the real shapes)
  // as a grid of resident blocks whose warps stride over the rows, loading
  // the next rows while multiplying these and the first rows before the
  // previous kernel ends; smaller ones as one wave of blocks. The same
  // arithmetic either way.
  int gemv_stream_min_rows = 2048;
  // Rows per lane group there: 1, 2, or 0 (2 from 32K rows, else 1).
  int gemv_stream_rows = 1;
  CudaTuning tuning;
  CudaProfile profile = CudaProfile::kOff;

  // The expert tier. With a VRAM budget (bytes; 0: none) every byte the
  // backend allocates on the device is charged to it (weights, expert
  // slots, KV cache, recurrent state, activations, workspaces, the decode
  // graph), and over budget is an error naming what did not fit. The trunk,
  // router, shared experts, embeddings and lm_head come first, then the KV
  // cache for n_ctx tokens and the activations of a max_chunk chunk, then as
  // many expert slots as the rest holds. Without a budget every expert is
  // resident as before.
  uint64_t vram_budget = 0;
  int n_ctx = 0;  // context the KV cache is sized for up front under a budget (0: 4096)
  // Sessions alive at once under a budget (coli-serve --parallel): the
  // VRAM ledger leaves each its KV cache and recurrent state.
  int sequences = 1;
  // Expert slots: -1 as the budget allows; n >= 0 exactly n (tests, benchmarks).
  long long expert_slots = -1;
  // Routing counts [layers * experts] (layer-major) for the initial fill,
  // hottest first; empty: spread evenly over the layers.
  std::vector<uint64_t> heat;
  // Host memory that holds the model's weights in shared memory (a coli-pin
  // mirror's mapping), which the backend may register with the device
  // while it lives: registered, it uploads at 55.3 GB/s straight from
  // there, as from cudaMallocHost, but registering costs about 0.05-0.1 s
  // per GB in every process, and the start's uploads need none (their
  // staged pipeline, staged_upload.cuh). register_hosts says when:
  // kWhenNeeded registers only for the options that copy experts during a
  // run from pinned memory (decode_upload_max, pcie_read_share,
  // prefill_upload under a tier). Registered whole (256 GiB pieces: a copy whose source spans two
  // registrations is refused); a piece the driver refuses is skipped.
  std::vector<std::pair<const void*, std::size_t>> host_regions;
  // The same for host memory mapped read-only, such as a coli container's
  // own mapping when no mirror serves it (the tools' default under a
  // budget): registered read-only (cudaHostRegisterReadOnly), which pins
  // the file's pages in the page cache while the backend lives. A range
  // the driver refuses (too little lockable memory, a file system whose
  // pages cannot be pinned) stays pageable: TierStats::pinned_host_bytes
  // says what was pinned.
  std::vector<std::pair<const void*, std::size_t>> read_only_host_regions;
  enum class Register { kNever, kWhenNeeded, kAlways } register_hosts = Register::kWhenNeeded;
  // read_only_host_regions being pinned on another thread (the tools pin a
  // container's mapping in the background so that the first token does not
  // wait for it): when valid, the backend registers none of those regions
  // itself and starts on the pageable path (no PCIe reads; prompt chunks'
  // missing experts on the host). At each chunk's start it looks: once
  // the pin is ready it takes a reference on it and switches over between
  // two chunks (PCIe reads, prompt uploads, the decode graph captured
  // again); a prompt chunk of at least kPinWaitTokens tokens that would
  // upload waits for it (its uploads gain more than the wait). A refused
  // pin (bytes() 0) leaves the run pageable with prompt uploads off, as if
  // never asked. TierStats::pin_pending / pin_wait_ms say where it stands.
  std::shared_future<HostPin> pending_pin;
  static constexpr int kPinWaitTokens = 256;
  // A device twin made by another process (coli-pin start --gpu,
  // device_twin.h): the host bytes [host, host + bytes) have a copy on
  // `device` that this backend maps through CUDA IPC. Weights whose bytes
  // lie in it are read there in place (no upload, and not charged to the
  // budget: the keeper allocated them); the expert tier's slots are filled
  // from it device to device. Ignored when host is null, when the twin is
  // on another device, or when the driver refuses the mapping.
  struct Twin {
    const void* host = nullptr;
    std::size_t bytes = 0;
    int device = 0;
    uint8_t handle[64] = {};
  } twin;
  // Decode misses over PCIe (issue 16's lever): in a one-token step, up to
  // decode_upload_max of a layer's misses (about decode_upload_share of
  // them) are uploaded from pinned host memory (a registered mirror:
  // host_regions) and computed on the device while the CPU computes the
  // rest; misses whose weights are not in pinned memory stay on the CPU.
  // 0: off. Same kernels as resident experts: the results do not change
  // beyond the CPU kernels' own error, as for any placement.
  int decode_upload_max = 0;
  double decode_upload_share = 0.4;
  // Zero-copy decode reads (issue 16's lever): in a one-token step, of a
  // layer's m misses whose bytes lie in registered host memory (a mirror:
  // host_regions), round(share x (m + offset)) (at most m, in routing
  // order) are computed by the device, its expert kernels reading their
  // weights over PCIe in place, while the CPU computes the others. offset
  // is the CPU's fixed cost of a layer counted in experts: balancing
  // a + b (m - g) = c g (the CPU's time, a fixed and b per expert, against
  // the device's c per expert read over PCIe) gives g = share (m + a / b)
  // with share = b / (b + c). The split is made on the device per layer and step (the post
  // kernel), so both sides get their share of every layer. No copy and no
  // host call per step; the host's cores read at most about 70 of the
  // host's 80-95 GB/s, the rest can cross PCIe. Prompt chunks leave them
  // to the host (or to prefill_upload): a grouped GEMM would read them
  // once per token tile. 0: off. Same kernels as resident experts: results
  // as for any placement (a split is a fixed function of the routing).
  double pcie_read_share = 0;
  double pcie_read_offset = 2;
  // With the PCIe split: share x (misses + offset) experts a layer for the
  // device as whole experts and a fraction of one more, split by its
  // intermediate rows (128 at a time: the host's int4 kernels read 128
  // columns at once) with the host, so the two sides could end together
  // (a whole expert is a quarter of a layer's misses at 40 layers); off
  // (the default): the count rounded. Measured on the H200 machine it did
  // not pay (docs/perf/hybrid.md, calls H1, H2, I: -2 to -7 % at 8 layers,
  // -3 to +4 % at 40, run-to-run noise as large), so it is an A/B switch
  // (COLI_CUDA_SPLIT_EXPERTS=1). Needs intermediate rows in 128s, >= 256.
  bool split_experts = false;
  // A decode step's router, routing and handoff post as one kernel, and
  // the handoff's join inside the residual add and norm after it (route.cuh,
  // norm.cuh): the same arithmetic in two or three fewer launches a layer
  // on the path each token waits on. false (COLI_CUDA_FUSE=0): the separate
  // kernels, for A/B runs.
  bool fuse_decode = true;
  // The decode steps of several sessions (coli-serve's slots,
  // Engine::forward_rows) as one forward pass: the trunk's matmuls and the
  // routed experts over all the rows at once, each row's attention or
  // Gated DeltaNet on its own cache and state in the same launches, a
  // captured graph per row count on the whole model. false
  // (COLI_CUDA_ROWS=0): each session's step in turn, for A/B runs.
  bool batch_rows = true;
  // Hybrid prefill (issue 18): a prompt chunk's routed experts outside the
  // tier are uploaded, a whole layer at a time, into one of two staging
  // areas on a copy stream of their own, the next tiered layer's while the
  // current one computes, and run on the device with the residents as one
  // grouped GEMM (no host handoff for the chunk). The two areas (each as
  // many slots as the layer with the fewest residents misses, plus one per
  // swap in flight) are charged to the budget before the tier's slots (if
  // they cannot fit, the option is dropped, not the tier). Sources in
  // registered memory (host_regions) are copied straight; pageable ones
  // (the container, an unregistered mirror) through a pinned ring filled by
  // host threads (prefill_stager.cuh). Decode steps are unchanged.
  bool prefill_upload = false;
  // The staging ring's slots per area when the experts run as grouped GEMMs
  // over expert ranges (int8 / int4): 0, kPrefillRingSlots; fewer make a
  // layer come in more groups (tests).
  int prefill_ring_slots = 0;
  // The CPU as a third place of those prompt chunks (issue 30): per
  // uploading layer, some of its non-resident experts (the last ones by id,
  // or the least routed: prefill_cpu_by_routing) are computed on the host through the handoff, as in a decode step,
  // while the rest upload: as many as balance the host's time against the
  // uploads' (placement/prefill_split.h prefill_cpu_count, from pcie_gbs,
  // host_expert_gbs and the host's time per pair measured on the chunks
  // so far). -1: so, when the sources are pinned (from pageable memory the
  // stager's host threads need the cores); n >= 0: n per layer, at most
  // its misses (tests; 0: off). With the grouped expert kernels only
  // (int8 / int4 experts: the ring). Results as for any placement: the
  // host's kernels' own rounding for those experts.
  int prefill_cpu_experts = -1;
  // Which experts those are: false, the last ones by id, the count from the
  // mean pairs an expert; true (COLI_CUDA_PREFILL_ORDER=routed), the least
  // routed (each expert's share of its layer's pairs in the prompt chunks
  // so far, or the heat's), the count from their expected pairs, the
  // count's correction guarded for experts of one or two pairs. Off until
  // measured on both families (docs/perf/families.md, session 18).
  bool prefill_cpu_by_routing = false;
  // A host expert that the chunk's routing makes hot (more than this many
  // pairs) is read over PCIe by the GPU instead, from its pinned host bytes
  // (decided on the device after the router, so the choice above, made
  // before the routing is known, cannot leave the host an expert many
  // times the pairs it was planned for). -1: twice the layer's mean pairs
  // an expert (COLI_CUDA_PREFILL_HOT=auto); n >= 0: more than n (0: every
  // host expert a token comes to: tests); INT_MAX: never (off). Results:
  // the GPU's kernels', as for an uploaded expert.
  int prefill_hot_pairs = -1;
  double pcie_gbs = 55;         // the machine's rates (placement/planner.h MachineRates) for that split
  double host_expert_gbs = 60;
  double prefill_layer_token_s = 2.5e-6;
  // Background swaps: every swap_window tokens the window's routing counts
  // (decayed) let a hot non-resident expert replace a cold resident one,
  // copied from pinned staging on a stream of its own, never blocking a
  // step; budget-neutral (slot for slot). Off by default here (results then
  // depend only on the inputs); the tools turn it on unless --no-swap.
  bool swap = false;
  int swap_window = 16;
  SwapPolicyOptions swap_policy;  // its max_swaps: at most 8 in flight
  // Computes the experts the tier does not hold, on the host, while the
  // device computes the rest (hybrid decode). Required when the tier holds
  // fewer than all experts; the backend keeps it alive.
  std::shared_ptr<ExpertHost> expert_host;
  // The host's part of each handoff computed on the calling thread once the
  // stream has drained, instead of by a host thread that a device kernel
  // waits for (graphs then off): for tools that serialise the device, such
  // as compute-sanitizer's racecheck, under which a kernel spinning on a
  // host flag may not see it change. The same kernels and results, slower.
  bool serve_handoff_inline = false;
  // The model's MTP module on the device, for speculative decoding
  // (Model::has_mtp(); ignored without one): its fc, norms and decoder
  // layer in the weight arena (the layer's routed experts too without a
  // tier; under one the host computes them, expert_host), its KV cache,
  // and per session the Gated DeltaNet layers' rewind journal
  // (mark_state). The VRAM ledger counts them (VramSettings::mtp). false:
  // the MTP steps and mark_state throw.
  bool mtp = false;
};

// The fields of o that size a run's device memory, for the VRAM ledger
// (placement/vram_ledger.h) the backend and the planner share.
inline VramSettings vram_settings(const CudaOptions& o) {
  VramSettings v;
  v.budget = o.vram_budget, v.expert_slots = o.expert_slots, v.n_ctx = o.n_ctx, v.max_chunk = o.max_chunk;
  v.split_kv = o.split_kv, v.chunked_gdn = o.chunked_gdn, v.pcie_read_share = o.pcie_read_share;
  v.decode_upload_max = o.decode_upload_max, v.prefill_upload = o.prefill_upload, v.swap = o.swap, v.prefill_ring_slots = o.prefill_ring_slots;
  v.mtp = o.mtp, v.sequences = o.sequences;
  return v;
}

// Throws coli::Error naming the reason when no device is usable (or the
// build has no CUDA), a matrix has a format the GPU kernels do not take
// (fp8 checkpoints: convert them first), or the model does not fit.
std::unique_ptr<Backend> make_cuda_backend(const Model& model, const CudaOptions& opt = {});

// Test seam: the greedy ids the backend computes on the device
// (Backend::greedy_only) for host rows logits[rows, V], by the same
// kernels. Throws coli::Error when no device is usable.
std::vector<int> device_greedy_ids(const float* logits, int rows, int V);

// The tools' --device: "cuda" (this backend or an error), "cpu" (nullptr:
// the caller builds its CPU backend) or "auto" (this backend when it can be
// made, else nullptr with *why saying why). Other values: coli::UsageError.
inline std::unique_ptr<Backend> make_device_backend(const std::string& device, const Model& model, const CudaOptions& opt, std::string* why) {
  if (device == "cpu") return nullptr;
  if (device == "cuda") return make_cuda_backend(model, opt);
  if (device != "auto") throw UsageError("--device must be cuda, cpu or auto, not '" + device + "'");
  try {
    return make_cuda_backend(model, opt);
  } catch (const Error& e) {
    if (why) *why = e.what();
    return nullptr;
  }
}

}  // namespace coli::cuda
