#include "placement/tier_plan.h"

#include <algorithm>
#include <numeric>

#include "util/error.h"

namespace coli {

int TierPlan::resident_in_layer(int layer) const {
  const auto b = resident.begin() + static_cast<std::ptrdiff_t>(layer) * experts;
  return static_cast<int>(std::count(b, b + experts, uint8_t{1}));
}

int64_t TierPlan::pairs() const {
  if (sparse.empty()) return static_cast<int64_t>(layers) * experts;
  return static_cast<int64_t>(std::count(sparse.begin(), sparse.end(), uint8_t{1})) * experts;
}

TierPlan plan_tier(int layers, int experts, int64_t slots, const std::vector<uint64_t>* heat, const std::vector<uint8_t>* sparse) {
  const int64_t n = static_cast<int64_t>(layers) * experts;
  if (heat && static_cast<int64_t>(heat->size()) != n)
    throw Error("expert tier: the heat has " + std::to_string(heat->size()) + " counts for " + std::to_string(n) + " (layer, expert) pairs");
  if (sparse && static_cast<int>(sparse->size()) != layers)
    throw Error("expert tier: " + std::to_string(sparse->size()) + " layer kinds for " + std::to_string(layers) + " layers (internal)");
  TierPlan p;
  p.layers = layers, p.experts = experts;
  p.resident.assign(static_cast<std::size_t>(n), 0);
  if (sparse && std::count(sparse->begin(), sparse->end(), uint8_t{0}) > 0)
    for (uint8_t k : *sparse) p.sparse.push_back(k != 0);
  const int64_t routed = p.pairs();
  p.count = std::clamp<int64_t>(slots, 0, routed);
  const bool hot = heat && std::any_of(heat->begin(), heat->end(), [](uint64_t c) { return c > 0; });
  p.source = p.count == routed ? "all" : hot ? "heat" : "even";
  // Pair i = layer * experts + expert; its place in the even spread over
  // the layers with experts (rank: the layer's index among them).
  std::vector<int64_t> rank(static_cast<std::size_t>(layers));
  int64_t with = 0;
  for (int l = 0; l < layers; ++l) rank[l] = p.has_experts(l) ? with++ : -1;
  auto spread = [&](int64_t i) { return (i % experts) * with + rank[i / experts]; };
  std::vector<int64_t> order;
  order.reserve(static_cast<std::size_t>(routed));
  for (int64_t i = 0; i < n; ++i)
    if (rank[i / experts] >= 0) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    const uint64_t ha = hot ? (*heat)[a] : 0, hb = hot ? (*heat)[b] : 0;
    return ha != hb ? ha > hb : spread(a) < spread(b);
  });
  for (int64_t i = 0; i < p.count; ++i) p.resident[order[i]] = 1;
  return p;
}

}  // namespace coli
