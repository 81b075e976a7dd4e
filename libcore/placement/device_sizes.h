// Device sizes: the host arithmetic that sizes the CUDA backend's kernel
// workspaces and device regions, defined once here so that the backend
// (libcuda, which uses these through kernels.cuh) and the VRAM ledger
// (vram_ledger.h: the planner's side) cannot disagree about a byte.
//
// Contract: pure functions of their arguments, no device needed; sizes are
// element counts of floats unless the name says bytes. A change to a
// kernel's workspace layout changes its function here, not in libcuda.
#pragma once
#include <cstddef>
#include <cstdint>

namespace coli {

// Every device region the backend sub-allocates (the weight arena's
// tensors, an expert slot's gate, up and down) starts 256-byte aligned.
constexpr std::size_t kDeviceAlign = 256;
constexpr uint64_t device_padded(uint64_t bytes) { return (bytes + kDeviceAlign - 1) / kDeviceAlign * kDeviceAlign; }

// Chunks of at least this many tokens group their routed pairs by expert
// (the grouped GEMM, whose per-pair outputs take T * K * hidden floats).
constexpr int kMoeGroupedMinTokens = 4;
// Background swaps of the expert tier in flight at once: each keeps a
// prefill staging slot per area (a swap evicts before its copy lands).
constexpr int kTierSwapsInFlight = 8;
// Tokens a speculative verify window may feed between mark_state and
// rewind_state (CudaBackend's journal of the Gated DeltaNet layers' inputs,
// the verify chunk's rows of logits): 1 + kMaxDraft of engine/generate.h.
constexpr int kRewindTokens = 9;
// Hybrid prefill's staging ring (expert_tier.cuh): when the experts run as
// grouped GEMMs over expert ranges (int8 / int4 formats), a prompt chunk's
// missing experts stream through two areas of at most this many slots, a
// group of a layer's experts at a time, each group's copies overlapping
// the previous group's kernels. 16 experts' copies (28 MB at the real
// shapes, 0.5 ms at 55 GB/s) outlast their group's kernels and the per
// group costs (a few launches and events) at every chunk size measured.
constexpr int kPrefillRingSlots = 16;

// Greedy ids on the device (greedy.cu): a logits row's partials (at most
// kGreedyMaxSlices of 12 bytes) and its id, in bytes.
constexpr int kGreedyMaxSlices = 128;
constexpr uint64_t greedy_row_bytes() { return uint64_t(kGreedyMaxSlices) * 12 + 4; }

// Split-KV attention (online softmax over splits of the cache) exists for
// head sizes of 32, 64, 128 and 256; others take the score-buffer kernel.
bool attention_split_supported(int head_dim);
// Splits of the cache for T tokens over cap positions, *keys_per_split
// positions each: a decode step (T = 1) up to 64 splits of at least 64
// keys, a prompt chunk one. Its partials are T * heads * splits * (hd + 2)
// floats.
int attention_splits(int T, int cap, int* keys_per_split);

// The float-format tiled matmul of prompt chunks (the router): chunks of
// at least kFloatTiledMinTokens tokens, the columns in slices of
// kFloatTiledSlice, one partial sum per slice, token and row.
constexpr int kFloatTiledMinTokens = 32;
constexpr int kFloatTiledSlice = 256;
int float_tiled_slices(int cols);
std::size_t float_tiled_work_floats(int T, int rows, int cols);

// The chunked (WY) Gated DeltaNet prefill: per value head and token, W
// [dk], U [dv], the chunk's q.k row [kGdnChunk], exp(G) and the decay to
// the chunk's end.
constexpr int kGdnChunk = 64;
std::size_t gdn_chunk_workspace_floats(int T, int value_heads, int key_dim, int value_dim);

}  // namespace coli
