// The planner's inputs for a coli container: the model's shape, one
// routed expert's bytes, and how much of a VRAM budget the expert slots
// get after the trunk (every non-expert tensor), the KV cache of `ctx`
// tokens and the activations of a `chunk`-token prefill (estimated as the
// CUDA backend charges them: float K and V rows, the recurrent state, the
// chunk's buffers and attention scratch, 8 MiB for graphs and rounding).
#pragma once
#include <cstdint>
#include <string>

#include "formats/container.h"
#include "model/model_spec.h"
#include "placement/planner.h"

namespace coli {

struct DeviceNeeds {
  uint64_t trunk = 0, kv = 0, state = 0, activations = 0, fixed = 0;
  uint64_t total() const { return trunk + kv + state + activations + fixed; }
};

DeviceNeeds device_needs(const Container& c, const ModelSpec& s, int ctx, int chunk);

// The routed experts' weight format ("int4-g32", ...: their gate's), or ""
// for a container without expert blobs. Names the probe's rates per format.
std::string expert_format_name(const Container& c);

// fingerprint, shape, expert_bytes, budgets and vram_bytes (the budget less
// device_needs, floored at 0) filled in; heat and rates left to the caller.
// prefill_upload: the run uploads prompt chunks' experts (--prefill-upload):
// the planner then keeps room for their staging areas
// (PlannerInputs::prefill_staging_extra).
PlannerInputs planner_inputs(const Container& c, const ModelSpec& s, uint64_t vram_budget, uint64_t ram_budget, int ctx, int chunk,
                             bool prefill_upload = false);

}  // namespace coli
