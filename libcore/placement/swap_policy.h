// SwapPolicy: which resident expert gives its slot to which non-resident
// one while a run decodes (the expert tier's background swaps). Pure
// bookkeeping: the device backend feeds it routing counts and applies the
// swaps it picks; it never touches memory, so CPU-only tests reach it.
//
// Scores are decayed routing counts: every observed window of tokens,
// score = decay * score + count. choose() pairs the hottest non-resident
// experts with the coldest resident ones, hottest with coldest, and takes a
// pair only when the candidate's score beats the victim's by the
// hysteresis (score_c > (1 + hysteresis) * score_v + min_gain), so uniform
// routing's noise does not churn the tier. A swap trades one slot for one
// slot: the count of resident experts never changes (budget-neutral).
// Deterministic: ties go to the lower (layer, expert) index.
#pragma once
#include <cstdint>
#include <vector>

namespace coli {

struct SwapPolicyOptions {
  double decay = 0.5;       // weight of the previous windows' score
  double hysteresis = 1.0;  // the candidate must score (1 + h) times the victim ...
  double min_gain = 4.0;    // ... plus this many decayed routings
  int max_swaps = 8;        // per choose()
  // Pair each candidate only with a victim of its own layer, so that every
  // layer keeps its count of residents (hybrid prefill sizes its staging
  // areas by the layer with the most non-residents).
  bool within_layer = false;
};

struct ExpertSwap {
  int victim = 0, candidate = 0;  // pair index: layer * experts + expert
};

class SwapPolicy {
 public:
  SwapPolicy(int layers, int experts, SwapPolicyOptions opt = {});
  // One window of routing counts [layers * experts], layer-major.
  void observe(const uint64_t* counts);
  // Up to max_swaps swaps for the residency flags resident [layers *
  // experts] (1 = in a slot). Victims are never taken from a layer whose
  // frozen[layer] is set (a layer entirely resident keeps no handoff in
  // the decode graph), and never one in `busy` (a swap in flight).
  std::vector<ExpertSwap> choose(const std::vector<uint8_t>& resident, const std::vector<uint8_t>& frozen, const std::vector<uint8_t>& busy) const;
  double score(int pair) const { return score_[pair]; }
  int layers() const { return layers_; }
  int experts() const { return experts_; }

 private:
  int layers_, experts_;
  SwapPolicyOptions opt_;
  std::vector<double> score_;
};

}  // namespace coli
