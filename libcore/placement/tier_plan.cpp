#include "placement/tier_plan.h"

#include <algorithm>
#include <numeric>

#include "util/error.h"

namespace coli {

int TierPlan::resident_in_layer(int layer) const {
  const auto b = resident.begin() + static_cast<std::ptrdiff_t>(layer) * experts;
  return static_cast<int>(std::count(b, b + experts, uint8_t{1}));
}

TierPlan plan_tier(int layers, int experts, int64_t slots, const std::vector<uint64_t>* heat) {
  const int64_t n = static_cast<int64_t>(layers) * experts;
  if (heat && static_cast<int64_t>(heat->size()) != n)
    throw Error("expert tier: the heat has " + std::to_string(heat->size()) + " counts for " + std::to_string(n) + " (layer, expert) pairs");
  TierPlan p;
  p.layers = layers, p.experts = experts;
  p.resident.assign(static_cast<std::size_t>(n), 0);
  p.count = std::clamp<int64_t>(slots, 0, n);
  const bool hot = heat && std::any_of(heat->begin(), heat->end(), [](uint64_t c) { return c > 0; });
  p.source = p.count == n ? "all" : hot ? "heat" : "even";
  // Pair i = layer * experts + expert; its place in the even spread.
  auto spread = [&](int64_t i) { return (i % experts) * layers + i / experts; };
  std::vector<int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    const uint64_t ha = hot ? (*heat)[a] : 0, hb = hot ? (*heat)[b] : 0;
    return ha != hb ? ha > hb : spread(a) < spread(b);
  });
  for (int64_t i = 0; i < p.count; ++i) p.resident[order[i]] = 1;
  return p;
}

}  // namespace coli
