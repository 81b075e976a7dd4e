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
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace coli {

struct TierPlan {
  int layers = 0, experts = 0;
  std::vector<uint8_t> resident;  // [layer * experts + expert]: 1 = in a slot
  int64_t count = 0;              // resident pairs
  std::string source;             // "all", "heat" or "even"

  bool is_resident(int layer, int expert) const { return resident[static_cast<std::size_t>(layer) * experts + expert] != 0; }
  int resident_in_layer(int layer) const;
  bool all() const { return count == static_cast<int64_t>(layers) * experts; }
};

// heat: counts [layers * experts] (layer-major) or null. slots is clamped to
// [0, layers * experts].
TierPlan plan_tier(int layers, int experts, int64_t slots, const std::vector<uint64_t>* heat);

}  // namespace coli
