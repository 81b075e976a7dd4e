// TierPlan: which routed experts get the device's expert slots when the
// VRAM budget holds fewer than all of them (the initial fill of the tier).
//
// plan_tier() ranks every (layer, expert) by heat, hottest first, over all
// layers at once (the global top-N of ktransformers' "frequency" policy, not
// a fixed share per layer), and takes the first `slots`. Ties, and every
// pair without heat, follow the even spread: expert 0 of every layer, then
// expert 1 of every layer, ..., so that without heat each layer gets
// slots / layers experts (the first slots % layers layers one more).
// Deterministic: the same inputs give the same plan.
//
// A model with dense MLP layers (qwen3_moe's mlp_only_layers /
// decoder_sparse_step) has no routed experts there: `sparse` marks the
// layers that do, and the plan ranks and spreads only their pairs (a
// dense layer's flags stay 0 and count for nothing).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace coli {

struct TierPlan {
  int layers = 0, experts = 0;
  std::vector<uint8_t> resident;  // [layer * experts + expert]: 1 = in a slot
  std::vector<uint8_t> sparse;    // [layers]: 1 the layer has routed experts; empty: every layer has
  int64_t count = 0;              // resident pairs
  std::string source;             // "all", "heat" or "even"

  bool is_resident(int layer, int expert) const { return resident[static_cast<std::size_t>(layer) * experts + expert] != 0; }
  bool has_experts(int layer) const { return sparse.empty() || sparse[static_cast<std::size_t>(layer)] != 0; }
  int resident_in_layer(int layer) const;
  int64_t pairs() const;  // the (layer, expert) pairs of the layers with experts
  bool all() const { return count == pairs(); }
};

// heat: counts [layers * experts] (layer-major) or null; sparse: [layers]
// (ModelSpec::sparse_layers) or null (every layer). slots is clamped to
// [0, the sparse layers' pairs].
TierPlan plan_tier(int layers, int experts, int64_t slots, const std::vector<uint64_t>* heat, const std::vector<uint8_t>* sparse = nullptr);

}  // namespace coli
