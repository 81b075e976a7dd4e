#include "placement/swap_policy.h"

#include <algorithm>
#include <numeric>

#include "util/error.h"

namespace coli {

SwapPolicy::SwapPolicy(int layers, int experts, SwapPolicyOptions opt)
    : layers_(layers), experts_(experts), opt_(opt), score_(static_cast<std::size_t>(layers) * experts, 0.0) {
  if (layers < 0 || experts < 0) throw Error("swap policy: negative model size");
  if (!(opt.decay >= 0 && opt.decay < 1) || !(opt.hysteresis >= 0) || !(opt.min_gain >= 0) || opt.max_swaps < 0)
    throw Error("swap policy: decay must be in [0, 1), hysteresis, min_gain and max_swaps at least 0");
}

void SwapPolicy::observe(const uint64_t* counts) {
  for (std::size_t i = 0; i < score_.size(); ++i) score_[i] = opt_.decay * score_[i] + static_cast<double>(counts[i]);
}

std::vector<ExpertSwap> SwapPolicy::choose(const std::vector<uint8_t>& resident, const std::vector<uint8_t>& frozen, const std::vector<uint8_t>& busy) const {
  const std::size_t n = score_.size();
  if (resident.size() != n || busy.size() != n || frozen.size() != static_cast<std::size_t>(layers_))
    throw Error("swap policy: residency, busy or frozen flags of the wrong size (internal)");
  std::vector<int> hot, cold;  // candidates (not resident), victims (resident)
  for (std::size_t i = 0; i < n; ++i) {
    if (busy[i]) continue;
    if (!resident[i]) hot.push_back(static_cast<int>(i));
    else if (!frozen[i / experts_]) cold.push_back(static_cast<int>(i));
  }
  const auto k = static_cast<std::size_t>(opt_.max_swaps);
  auto hotter = [&](int a, int b) { return score_[a] != score_[b] ? score_[a] > score_[b] : a < b; };
  auto colder = [&](int a, int b) { return score_[a] != score_[b] ? score_[a] < score_[b] : a < b; };
  auto gains = [&](int candidate, int victim) { return score_[candidate] > (1.0 + opt_.hysteresis) * score_[victim] + opt_.min_gain; };
  std::vector<ExpertSwap> out;
  if (opt_.within_layer) {
    // Hottest candidates first, each with the coldest victim of its layer
    // not yet taken.
    std::sort(hot.begin(), hot.end(), hotter);
    std::sort(cold.begin(), cold.end(), colder);
    std::vector<std::vector<int>> victims(static_cast<std::size_t>(layers_));
    for (int v : cold) victims[static_cast<std::size_t>(v / experts_)].push_back(v);
    std::vector<std::size_t> taken(static_cast<std::size_t>(layers_), 0);
    for (int c : hot) {
      if (out.size() == k) break;
      const auto l = static_cast<std::size_t>(c / experts_);
      if (taken[l] == victims[l].size() || !gains(c, victims[l][taken[l]])) continue;
      out.push_back({victims[l][taken[l]++], c});
    }
    return out;
  }
  const std::size_t nh = std::min(k, hot.size()), nc = std::min(k, cold.size());
  std::partial_sort(hot.begin(), hot.begin() + static_cast<std::ptrdiff_t>(nh), hot.end(), hotter);
  std::partial_sort(cold.begin(), cold.begin() + static_cast<std::ptrdiff_t>(nc), cold.end(), colder);
  for (std::size_t i = 0; i < std::min(nh, nc); ++i) {
    if (!gains(hot[i], cold[i])) break;  // the next pairs gain less
    out.push_back({cold[i], hot[i]});
  }
  return out;
}

}  // namespace coli
