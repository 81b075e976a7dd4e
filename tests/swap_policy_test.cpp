// SwapPolicy (placement/swap_policy.h): decayed scores, hottest miss paired
// with the coldest resident, the hysteresis, frozen layers and swaps in
// flight left alone, slot for slot. Values worked by hand.
#include <gtest/gtest.h>

#include "placement/swap_policy.h"
#include "util/error.h"

namespace {

using coli::ExpertSwap;
using coli::SwapPolicy;
using coli::SwapPolicyOptions;

// 2 layers x 4 experts; pair = layer * 4 + expert.
std::vector<uint64_t> counts(std::initializer_list<uint64_t> c) { return std::vector<uint64_t>(c); }

}  // namespace

TEST(SwapPolicy, ScoresDecayEachWindow) {
  SwapPolicy p(2, 4, SwapPolicyOptions{0.5, 1.0, 4.0, 2});
  p.observe(counts({8, 0, 0, 0, 0, 0, 0, 2}).data());
  p.observe(counts({0, 4, 0, 0, 0, 0, 0, 2}).data());
  EXPECT_DOUBLE_EQ(p.score(0), 4.0);  // 8 * 0.5
  EXPECT_DOUBLE_EQ(p.score(1), 4.0);
  EXPECT_DOUBLE_EQ(p.score(7), 3.0);  // 2 * 0.5 + 2
  EXPECT_DOUBLE_EQ(p.score(2), 0.0);
}

TEST(SwapPolicy, HottestMissTakesTheColdestSlotPastTheHysteresis) {
  SwapPolicy p(2, 4, SwapPolicyOptions{0.5, 1.0, 4.0, 2});
  // Resident: 0, 1 (layer 0) and 4, 5 (layer 1).
  const std::vector<uint8_t> resident = {1, 1, 0, 0, 1, 1, 0, 0}, frozen = {0, 0}, busy(8, 0);
  // Scores: residents 0:10, 1:3, 4:1, 5:6; misses 2:7, 3:20, 6:5, 7:0.
  p.observe(counts({10, 3, 7, 20, 1, 6, 5, 0}).data());
  const std::vector<ExpertSwap> s = p.choose(resident, frozen, busy);
  // 20 > 2 * 1 + 4: 3 replaces 4; next, 7 > 2 * 3 + 4 = 10 fails: one swap.
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].candidate, 3);
  EXPECT_EQ(s[0].victim, 4);
}

TEST(SwapPolicy, NothingMovesUnderTheBar) {
  SwapPolicy p(2, 4, SwapPolicyOptions{0.5, 1.0, 4.0, 2});
  const std::vector<uint8_t> resident = {1, 1, 0, 0, 1, 1, 0, 0}, frozen = {0, 0}, busy(8, 0);
  p.observe(counts({3, 3, 9, 9, 3, 3, 9, 9}).data());  // 9 < 2 * 3 + 4
  EXPECT_TRUE(p.choose(resident, frozen, busy).empty());
  SwapPolicy q(2, 4, SwapPolicyOptions{0.5, 0.0, 0.0, 8});
  q.observe(counts({3, 3, 3, 3, 3, 3, 3, 3}).data());  // equal scores: never a swap
  EXPECT_TRUE(q.choose(resident, frozen, busy).empty());
}

TEST(SwapPolicy, FrozenLayersAndBusyPairsAreLeftAlone) {
  SwapPolicy p(2, 4, SwapPolicyOptions{0.5, 0.0, 1.0, 4});
  const std::vector<uint8_t> resident = {1, 1, 1, 1, 1, 0, 0, 0};
  p.observe(counts({0, 0, 0, 0, 1, 50, 40, 30}).data());
  // Layer 0 frozen (entirely resident): only pair 4 can give its slot.
  std::vector<uint8_t> busy(8, 0);
  std::vector<ExpertSwap> s = p.choose(resident, {1, 0}, busy);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].victim, 4);
  EXPECT_EQ(s[0].candidate, 5);
  busy[5] = 1;  // 5 is in flight: 6 is the hottest free miss
  s = p.choose(resident, {1, 0}, busy);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].candidate, 6);
  // Unfrozen, the coldest residents (score 0, lowest index first) give theirs.
  s = p.choose(resident, {0, 0}, std::vector<uint8_t>(8, 0));
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].victim, 0);
  EXPECT_EQ(s[0].candidate, 5);
  EXPECT_EQ(s[1].victim, 1);
  EXPECT_EQ(s[1].candidate, 6);
  EXPECT_EQ(s[2].victim, 2);
  EXPECT_EQ(s[2].candidate, 7);
}

TEST(SwapPolicy, SlotForSlotAndDeterministic) {
  SwapPolicy p(2, 4, SwapPolicyOptions{0.5, 0.0, 0.5, 2}), q(2, 4, SwapPolicyOptions{0.5, 0.0, 0.5, 2});
  std::vector<uint8_t> resident = {1, 0, 1, 0, 1, 0, 1, 0};
  const auto c = counts({0, 5, 1, 5, 0, 6, 2, 5});
  p.observe(c.data()), q.observe(c.data());
  const auto a = p.choose(resident, {0, 0}, std::vector<uint8_t>(8, 0)), b = q.choose(resident, {0, 0}, std::vector<uint8_t>(8, 0));
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].victim, b[i].victim);
    EXPECT_EQ(a[i].candidate, b[i].candidate);
    EXPECT_TRUE(resident[a[i].victim]);
    EXPECT_FALSE(resident[a[i].candidate]);
    resident[a[i].victim] = 0, resident[a[i].candidate] = 1;
  }
  EXPECT_EQ(std::count(resident.begin(), resident.end(), 1), 4) << "budget-neutral";
  // Ties among the hottest (5 at pairs 1, 3, 7 after 6 at 5): the lower index first.
  EXPECT_EQ(a[0].candidate, 5);
  EXPECT_EQ(a[1].candidate, 1);
}

TEST(SwapPolicy, RejectsBadOptionsAndSizes) {
  EXPECT_THROW(SwapPolicy(2, 4, SwapPolicyOptions{1.0, 1.0, 4.0, 2}), coli::Error);
  EXPECT_THROW(SwapPolicy(2, 4, SwapPolicyOptions{0.5, -1.0, 4.0, 2}), coli::Error);
  SwapPolicy p(2, 4);
  EXPECT_THROW(p.choose(std::vector<uint8_t>(7, 0), {0, 0}, std::vector<uint8_t>(8, 0)), coli::Error);
}

// within_layer (hybrid prefill): a candidate only takes a slot of its own
// layer, so each layer keeps its count of residents.
TEST(SwapPolicy, WithinLayerKeepsEachLayersResidents) {
  SwapPolicyOptions o{0.5, 1.0, 4.0, 4};
  o.within_layer = true;
  SwapPolicy p(2, 4, o);
  // Resident: 0, 1 (layer 0) and 4, 5 (layer 1).
  const std::vector<uint8_t> resident = {1, 1, 0, 0, 1, 1, 0, 0}, frozen = {0, 0}, busy(8, 0);
  // Scores: residents 0:10, 1:3, 4:1, 5:6; misses 2:7, 3:20, 6:5, 7:0.
  p.observe(counts({10, 3, 7, 20, 1, 6, 5, 0}).data());
  // Across layers 3 would take 4 (score 1); within, it takes 1 (20 > 2 * 3 + 4),
  // then 2 faces 0 (7 > 2 * 10 + 4 fails), 6 faces 4 (5 > 2 * 1 + 4 fails), 7 gains nothing.
  const std::vector<ExpertSwap> s = p.choose(resident, frozen, busy);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].candidate, 3);
  EXPECT_EQ(s[0].victim, 1);
  // Layer 1 hot enough: 6 and 7 take 4 and 5, coldest first; 3 still takes 1.
  SwapPolicy q(2, 4, o);
  q.observe(counts({10, 3, 7, 20, 1, 6, 30, 20}).data());
  const std::vector<ExpertSwap> t = q.choose(resident, frozen, busy);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].candidate, 6);
  EXPECT_EQ(t[0].victim, 4);   // 30 > 2 * 1 + 4
  EXPECT_EQ(t[1].candidate, 3);
  EXPECT_EQ(t[1].victim, 1);   // 20 > 2 * 3 + 4
  EXPECT_EQ(t[2].candidate, 7);
  EXPECT_EQ(t[2].victim, 5);   // 20 > 2 * 6 + 4
}
