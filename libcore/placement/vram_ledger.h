// VramLedger: what a VRAM budget holds in a CUDA run, computed once for
// both sides that need it: the CUDA backend, which charges every device
// allocation to a DeviceBudget (device_budget.h) and fills the rest with
// expert slots, and the planner (plan_inputs.h: coli-place, coli-run
// --plan auto), which must predict the same number of slots.
//
// A budget holds, in the order the backend charges it:
//   1. the weight arena: every table entry (model/layer_tensors.h) outside
//      the routed experts of a tiered run, each padded to 256 bytes,
//      vectors as f32, lm_head even when tied; then the rotary frequencies;
//   2. the chunk buffers: every activation buffer and kernel workspace of
//      a max_chunk-token chunk (ChunkBuffers: the exact element counts);
//   3. the tier (the routed experts of the sparse layers: a dense MLP
//      layer has none, its MLP is in the arena), out of what is left
//      ("avail"): first the runtime reserve
//      (RuntimeReserve: KV cache for n_ctx, recurrent state, attention
//      scratch, the last row's logits, 8 MiB for graphs and rounding, and
//      the PCIe-read tables and decode-upload slots when those are on),
//      then slot 0 (the zero expert every miss reads) and the expert slots,
//      slots = (avail - reserve) / slot - 1; with prefill uploads, their
//      two staging areas and tables too, the slots shrinking by
//      max(1, slots / 64) until those fit (else the uploads are dropped).
// avail < reserve + slot is the backend's "--vram-budget exceeded" error
// (TierFill::fits false, expert_slots() -1).
//
// Contract: pure host arithmetic from a ModelSpec, the weights' per-tensor
// device bytes (from a bound Model, or a container's manifest without
// reading a blob) and the run's settings (VramSettings: CudaOptions' fields
// of the same names). The backend sizes its buffers from chunk_buffers()
// and its tier from runtime_reserve() and fill_tier(), so these are exact,
// not estimates: a change to what the backend allocates goes here.
// Allocations the backend makes after the slots (expert pointer tables and
// flags, routing heat, the ids buffer, the router's ticket, the decode
// graph) live in the reserve's 8 MiB.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "model/layer_tensors.h"
#include "model/model_spec.h"
#include "placement/device_sizes.h"
#include "placement/tier_plan.h"
#include "quant/format.h"

namespace coli {

class Model;
class Container;

// The run's settings that size its device memory (CudaOptions' fields).
struct VramSettings {
  uint64_t budget = 0;           // bytes; 0: no limit (every expert resident unless expert_slots >= 0)
  long long expert_slots = -1;   // >= 0: exactly this many slots (the budget must still hold the reserve and slot 0)
  int n_ctx = 0;                 // 0: 4096
  int sequences = 1;             // sessions alive at once (coli-serve --parallel): a KV cache and recurrent state each
  int max_chunk = 512;           // tokens of the largest chunk (at least 1)
  bool split_kv = true;          // asked for; on only where attention_split_supported(head_dim)
  bool chunked_gdn = true;
  double pcie_read_share = 0;    // > 0: the one-token pointer tables of the PCIe reads
  int decode_upload_max = 0;     // > 0: that many decode-upload slots and their buffers
  bool prefill_upload = false;   // the two staging areas and their tables
  bool swap = false;             // swaps in flight keep staging slots (kTierSwapsInFlight per area)
  int prefill_ring_slots = 0;    // a ring's slots per area (ExpertParts::grouped); 0: kPrefillRingSlots (tests set fewer)
  // The MTP module on the device (speculative decoding; a model with one):
  // its tensors in the arena (its routed experts only without a tier:
  // under one the host computes them), its attention layer's KV cache, the
  // rewind state of the Gated DeltaNet layers and a chunk's hidden rows in
  // the reserve (RuntimeReserve::mtp).
  bool mtp = false;

  bool tiered() const { return budget > 0 || expert_slots >= 0; }
  int context_tokens() const { return n_ctx > 0 ? n_ctx : 4096; }
  int sequence_count() const { return sequences > 1 ? sequences : 1; }
  int chunk_tokens() const { return max_chunk > 1 ? max_chunk : 1; }
};

// Device bytes of a table entry before padding: a matrix's layout_of(...)
// total in its stored format, a vector's elements as f32. 0: nothing on the
// device for it (the backend's device twin holds the matrix).
using TensorBytes = std::function<uint64_t(const TensorDesc&)>;
TensorBytes tensor_bytes_of(const Model& m);
// From the manifest (the container must outlive the function): the same
// numbers as of the container's bound Model. A tied lm_head (no blob) takes
// embed's. Throws coli::Error for an entry the container lacks.
TensorBytes tensor_bytes_of(const Container& c);

// One routed expert's gate, up and down, unpadded (layer 0, expert 0: every
// expert has that format and shape).
struct ExpertParts {
  uint64_t gate = 0, up = 0, down = 0;
  // Prompt chunks run the experts as grouped GEMMs, which take expert
  // ranges (so the prefill staging can be a ring, kPrefillRingSlots): the
  // three matrices int8 or int4, gate and up of one of the two, every
  // input width a multiple of 32 (the int8 activations' blocks).
  bool grouped = false;
};
bool grouped_expert_formats(QuantFormat gate, QuantFormat up, QuantFormat down, int64_t gate_cols, int64_t down_cols);
ExpertParts expert_parts_of(const Model& m);
ExpertParts expert_parts_of(const Container& c);  // throws when it has no expert blob

// An expert slot: gate | up | down, each padded to 256 bytes.
struct ExpertSlot {
  uint64_t gate = 0, up = 0, down = 0;  // padded
  uint64_t bytes() const { return gate + up + down; }
  uint64_t up_offset() const { return gate; }
  uint64_t down_offset() const { return gate + up; }
};
ExpertSlot expert_slot(const ExpertParts& p);

// 1. The weight arena's bytes (tiered: without the routed experts); with
// mtp (and s.mtp_layers > 0) the MTP module's too, its routed experts only
// when not tiered.
uint64_t arena_bytes(const ModelSpec& s, const TensorBytes& bytes, bool tiered, bool mtp = false);
// Under a tier the token embedding stays in host memory when its rows are
// plain (f32, bf16, f16: a row is one run of bytes, no scales): a chunk's
// rows are copied to pinned memory the embedding kernel reads in place (4
// KB a token at bf16, hidden 2048), and its VRAM holds experts instead:
// 1 GB at Qwen3.5's vocabulary of 248,320 (llama.cpp keeps it on the host
// too). The ledger's TensorBytes of a Model or a Container then give the
// embedding 0 bytes, as the backend's arena does.
bool embedding_on_host(bool tiered, QuantFormat embed);
// bytes, with the embedding's 0 when it stays on the host.
TensorBytes device_bytes(TensorBytes bytes, bool embed_on_host);
uint64_t inv_freq_bytes(const ModelSpec& s);  // max(1, rotary_dim / 2) floats

// 2. Element counts of the buffers of a T-token chunk (CudaBackend::
// ensure_buffers and its members of the same names). Floats unless noted.
// router_work is 0 below kFloatTiledMinTokens, gdn_work 0 without
// chunked_gdn or Gated DeltaNet layers: none allocated.
struct ChunkBuffers {
  int T = 0;
  std::size_t x = 0, hn = 0, mix = 0, sh = 0, routed = 0;  // [T, hidden]
  std::size_t proj = 0;                                    // [T, max(heads * hd * 2, conv_dim)]
  std::size_t z = 0, b = 0, a = 0;                         // [T, value_dim], [T, value_heads] x 2
  std::size_t conv_out = 0, heads_out = 0, k = 0, v = 0;   // [T, conv_dim], [T, max(heads * hd, value_dim)], [T, kv_heads * hd] x 2
  std::size_t rlogits = 0;                                 // [T, experts]
  std::size_t ridx = 0;                                    // int [T, K + 1]
  std::size_t rw = 0;                                      // [T, K + 1]
  std::size_t sg = 0, su = 0, sgate = 0;                   // [T, shared_inter] x 2, [T]
  std::size_t act = 0;                                     // [T, K + 1, moe_inter]
  std::size_t order = 0, offsets = 0;                      // int [T, K], [2 (experts + 1)] (pairs', chunks' offsets)
  std::size_t ey = 0;                                      // [T, K, hidden] from kMoeGroupedMinTokens, else 1
  std::size_t router_work = 0;                             // float_tiled_work_floats(T, experts, hidden)
  std::size_t gdn_work = 0;                                // gdn_chunk_workspace_floats(T, ...)
  std::size_t qx_codes = 0;                                // int8
  std::size_t qx_scale = 0;                                // float
  std::size_t qx_sum = 0;                                  // int
  // The buffers used only inside a layer's mixer (proj, z, b, a, conv_out,
  // heads_out, k, v, gdn_work) and those used only inside its MoE block
  // (rlogits, router_work, ridx, rw, sg, su, act, order, offsets, ey) share
  // one allocation: the forward pass runs the two in turn on one stream.
  // Each set's bytes with every buffer 256-byte aligned, in that order.
  uint64_t mixer_bytes() const;
  uint64_t moe_bytes() const;
  uint64_t shared_bytes() const { return mixer_bytes() > moe_bytes() ? mixer_bytes() : moe_bytes(); }
  uint64_t bytes() const;  // the shared allocation and the other buffers
};
ChunkBuffers chunk_buffers(const ModelSpec& s, int T, bool chunked_gdn);

// 3. What the tier leaves aside for later charges (slot: ExpertSlot::bytes(),
// for the decode-upload slots).
struct RuntimeReserve {
  uint64_t kv = 0;                 // K and V of every attention layer for n_ctx positions, f32, for each of the sequences
  uint64_t state = 0;              // conv window and recurrent state of every Gated DeltaNet layer, for each of the sequences
  uint64_t attention_scratch = 0;  // split-KV partials or scores, at n_ctx, the largest of 1, max_chunk and sequences tokens
  uint64_t logits = 0;             // the last row's; with sequences > 1 a rows step's (one a sequence)
  uint64_t fixed = 0;              // 8 MiB: decode graphs, what is allocated after the slots (a rows step's table: KiBs), rounding
  uint64_t pcie_read_tables = 0;   // pcie_read_share > 0
  uint64_t decode_upload = 0;      // decode_upload_max > 0
  // VramSettings::mtp: the MTP layer's KV cache, per Gated DeltaNet layer
  // the rewind state (its recurrent state and conv window at the mark, and
  // kRewindTokens tokens' conv inputs, beta and decay inputs), a chunk's
  // final-normed hidden rows, the MTP fc's input ([T, 2 hidden]) and the
  // logits of a verify chunk's rows (kRewindTokens) beyond the last one's.
  uint64_t mtp = 0;
  uint64_t runtime() const { return kv + state + attention_scratch + logits + fixed + mtp; }  // CudaBackend::runtime_reserve()
  uint64_t total() const { return runtime() + pcie_read_tables + decode_upload; }       // build_tier's reserve
};
RuntimeReserve runtime_reserve(const ModelSpec& s, const VramSettings& run, uint64_t slot);

// Hybrid prefill's staging slots per area for a plan: the most experts a
// layer leaves out, plus the swaps in flight when swaps run and anything is
// resident; at most the experts of a layer.
// ring > 0 (ExpertParts::grouped: a ring of that many slots at most): at
// most ring, a layer's non-residents then come in groups of that many.
int prefill_stage_slots(const TierPlan& plan, bool swap, int ring = 0);
// A ring's slots per area for a budget whose expert room is `room` slots
// (before the staging takes its share): ring_min, or more where the room
// is large, up to a sixteenth of it per area (the two areas an eighth).
// Each group of a layer costs a few launches and events and splits the
// grouped GEMM into smaller grids: measured on the GPU machine, 16-slot
// groups took a 4096-token chunk of the 40-layer model from 8,400 to 6,000
// tokens/s where the budget held whole-layer staging, and 2 % of a small
// budget's experts kept for staging is what the ring is for.
int prefill_ring_size(int ring_min, long long room);
// The ring's least slots per area: run.prefill_ring_slots (or
// kPrefillRingSlots) when the experts are grouped (ExpertParts::grouped),
// else 0 (no ring: whole-layer areas).
int prefill_ring_min(bool grouped, const VramSettings& run);
uint64_t prefill_table_bytes(int layers, int experts);  // per layer three pointer arrays of experts + 1, the host experts' flags, choice and host addresses

struct TierFillInputs {
  int layers = 0, experts = 0;
  uint64_t avail = 0;               // the budget left when the slots are made (UINT64_MAX: no limit)
  uint64_t reserve = 0;             // RuntimeReserve::total()
  uint64_t slot = 0;                // ExpertSlot::bytes()
  long long expert_slots = -1;      // VramSettings::expert_slots
  bool prefill_upload = false, swap = false;
  int prefill_ring = 0;             // > 0: the staging is a ring of prefill_ring_size(this, the room) slots per area (VramLedger::prefill_ring)
  const std::vector<uint64_t>* heat = nullptr;  // plan_tier's ranking (layers * experts counts) or null
  const std::vector<uint8_t>* sparse = nullptr;  // the layers with routed experts (ModelSpec::sparse_layers) or null: every layer
};
struct TierFill {
  bool fits = false;        // avail >= reserve + slot (or no limit); else nothing below is set
  uint64_t need = 0;        // reserve + slot
  long long slots = 0;      // asked of plan_tier (before its clamp to [0, layers * experts])
  TierPlan plan;            // the residents
  bool prefill = false;     // the prefill uploads stay on (their staging and tables fit)
  int stage_slots = 0;      // per staging area, when prefill
  uint64_t stage_bytes = 0, prefill_tables = 0;  // when prefill
  uint64_t slot_array = 0;  // the slots' allocation: slot 0 (unless every expert is resident) and the residents
};
// build_tier's arithmetic: the fit check, the slot count, the plan, the
// prefill shrink loop.
TierFill fill_tier(const TierFillInputs& in);

class VramLedger {
 public:
  VramLedger(const ModelSpec& s, const TensorBytes& bytes, const ExpertParts& expert, const VramSettings& run);
  VramLedger(const Model& m, const VramSettings& run);
  // The planner's: from the manifest, reading no blob (the container need
  // not outlive the ledger).
  VramLedger(const Container& c, const ModelSpec& s, const VramSettings& run);

  const ModelSpec& spec() const { return s_; }
  const VramSettings& settings() const { return run_; }
  uint64_t arena() const { return arena_; }
  uint64_t inv_freq() const { return inv_freq_; }
  const ChunkBuffers& buffers() const { return buffers_; }  // for max_chunk tokens
  const ExpertSlot& slot() const { return slot_; }
  int prefill_ring() const { return prefill_ring_min(grouped_, run_); }
  const RuntimeReserve& reserve() const { return reserve_; }
  // In use when the tier is built: arena + inv_freq + buffers.
  uint64_t before_slots() const { return arena_ + inv_freq_ + buffers_.bytes(); }
  // Everything but the expert slots past slot 0: before_slots + reserve +
  // one slot. A budget below it is refused; the rest holds expert slots.
  uint64_t device_floor() const { return before_slots() + reserve_.total() + slot_.bytes(); }

  // fill_tier for a budget (settings().budget, or another; 0: no limit).
  TierFill fill(uint64_t budget, const std::vector<uint64_t>* heat = nullptr) const;
  // The slots a budget yields before any prefill shrink ((avail - reserve)
  // / slot - 1; layers * experts without a limit; expert_slots when set),
  // -1 when the budget does not hold device_floor().
  long long expert_slots(uint64_t budget) const;
  long long expert_slots() const { return expert_slots(run_.budget); }

 private:
  ModelSpec s_;
  VramSettings run_;
  uint64_t arena_ = 0, inv_freq_ = 0;
  ChunkBuffers buffers_;
  ExpertSlot slot_;
  bool grouped_ = false;
  RuntimeReserve reserve_;
};

}  // namespace coli
