// The planner's inputs for a coli container: the model's shape, one
// routed expert's bytes, and how much of a VRAM budget the expert slots
// get after the trunk (every non-expert tensor), the KV cache of `ctx`
// tokens, the buffers of a `chunk`-token prefill and the rest of what the
// CUDA backend charges before its slots: all from the VRAM ledger
// (vram_ledger.h), the arithmetic the backend itself sizes them by, so the
// planner's count of VRAM experts is the backend's count of slots.
#pragma once
#include <cstdint>
#include <string>

#include "formats/container.h"
#include "model/model_spec.h"
#include "placement/planner.h"
#include "placement/vram_ledger.h"

namespace coli {

// The ledger's charges in the groups coli-place prints. total(): what a
// budget must hold besides the expert slots past the zero expert's
// (VramLedger::device_floor()).
struct DeviceNeeds {
  uint64_t trunk = 0;        // the weight arena (256-byte padded tensors) and the rotary frequencies
  uint64_t kv = 0;           // KV cache for the context
  uint64_t state = 0;        // Gated DeltaNet conv windows and recurrent state
  uint64_t activations = 0;  // the chunk's buffers and workspaces, the attention scratch, the last row's logits
  uint64_t fixed = 0;        // 8 MiB (graphs, late allocations, rounding), PCIe-read tables, decode-upload slots, the zero expert's slot
  uint64_t total() const { return trunk + kv + state + activations + fixed; }
};

DeviceNeeds device_needs(const VramLedger& ledger);
// ctx: KV cache positions (0: 4096, as the backend); chunk: max_chunk;
// the backend's defaults otherwise (split-KV, chunked DeltaNet, no PCIe
// reads, no decode uploads).
DeviceNeeds device_needs(const Container& c, const ModelSpec& s, int ctx, int chunk);

// The routed experts' weight format ("int4-g32", ...: their gate's), or ""
// for a container without expert blobs. Names the probe's rates per format.
std::string expert_format_name(const Container& c);

// fingerprint, shape, expert_bytes, slot_bytes, budgets and vram_bytes
// (budget less device_needs, floored at 0: vram_bytes / slot_bytes is the
// backend's slot count, VramLedger::expert_slots) filled in; heat and rates
// left to the caller.
// prefill_upload: the run uploads prompt chunks' experts (--prefill-upload):
// the planner then keeps room for their staging areas
// (PlannerInputs::prefill_staging_extra: the swaps' slots, the tools' runs
// swapping by default) and tables.
PlannerInputs planner_inputs(const Container& c, const ModelSpec& s, uint64_t vram_budget, uint64_t ram_budget, int ctx, int chunk,
                             bool prefill_upload = false);
// The same for a run's full settings (run.budget: the VRAM budget; its
// pcie_read_share, decode_upload_max and swap size the reserve and the
// staging; PlannerInputs::pcie_read_share is left to the caller).
PlannerInputs planner_inputs(const Container& c, const ModelSpec& s, const VramSettings& run, uint64_t ram_budget);

}  // namespace coli
