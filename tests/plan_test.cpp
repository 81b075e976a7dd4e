// The residency plan file (placement/plan.h, man 5 coli-plan): a hand-made
// file read to known tiers, round trips, every rejection naming the file and
// line, another model's plan refused at load, atomic save, and the plan's
// VRAM set applied to the expert tier through plan_as_heat.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "placement/plan.h"
#include "placement/tier_plan.h"
#include "test_util.h"
#include "util/error.h"
#include "util/io.h"

using namespace coli;

namespace {

// 3 layers of 8 experts.
std::string valid_text() {
  return "# predicted: 12.5 tok/s decode\n"
         "coli-plan 1\n"
         "model 00000000000000ff layers 3 experts 8\n"
         "vram-budget 1000 ram-budget 2000\n"
         "prefill-chunk 512\n"
         "layer 0 vram 0-2,5 ram 3,6-7\n"
         "layer 1 vram - ram -\n"
         "layer 2 vram 7 ram 0-6\n";
}

// The error message of parse_plan on text, "" when it parses.
std::string parse_error(const std::string& text) {
  const std::string e = test::error_of([&] { parse_plan(text, "p.txt"); });
  return e == "(no error)" ? "" : e;
}

Plan random_plan(int layers, int experts, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Plan p;
  p.fingerprint = rng();
  p.layers = layers, p.experts = experts;
  p.vram_budget = rng(), p.ram_budget = rng() >> 20;
  p.prefill_chunk = int(rng() % ((1 << 20) + 1));
  p.tier.resize(std::size_t(layers) * experts);
  for (std::size_t i = 0; i < p.tier.size(); ++i) {
    // Runs of one tier, as a planner makes them, and single ids between.
    p.tier[i] = i > 0 && rng() % 3 != 0 ? p.tier[i - 1] : Tier(rng() % 3);
  }
  return p;
}

void expect_same(const Plan& a, const Plan& b) {
  EXPECT_EQ(a.fingerprint, b.fingerprint);
  EXPECT_EQ(a.layers, b.layers);
  EXPECT_EQ(a.experts, b.experts);
  EXPECT_EQ(a.vram_budget, b.vram_budget);
  EXPECT_EQ(a.ram_budget, b.ram_budget);
  EXPECT_EQ(a.prefill_chunk, b.prefill_chunk);
  EXPECT_TRUE(a.tier == b.tier);
}

}  // namespace

TEST(Plan, HandWrittenFileGivesItsTiers) {
  const Plan p = parse_plan(valid_text(), "p.txt");
  EXPECT_EQ(p.fingerprint, 0xffu);
  EXPECT_EQ(p.layers, 3);
  EXPECT_EQ(p.experts, 8);
  EXPECT_EQ(p.vram_budget, 1000u);
  EXPECT_EQ(p.ram_budget, 2000u);
  EXPECT_EQ(p.prefill_chunk, 512);
  EXPECT_TRUE(p.comments.empty());
  const Tier V = Tier::kVram, R = Tier::kRam, D = Tier::kDisk;
  const std::vector<Tier> want = {V, V, V, R, D, V, R, R,   // layer 0
                                  D, D, D, D, D, D, D, D,   // layer 1
                                  R, R, R, R, R, R, R, V};  // layer 2
  EXPECT_TRUE(p.tier == want);
  EXPECT_EQ(p.at(0, 5), V);
  EXPECT_EQ(p.at(2, 3), R);
  EXPECT_EQ(p.count(V), 5);
  EXPECT_EQ(p.count(R), 10);
  EXPECT_EQ(p.count(D), 9);
  EXPECT_EQ(p.count(V, 0), 4);
  EXPECT_EQ(p.count(R, 1), 0);
  EXPECT_EQ(p.count(D, 1), 8);
  EXPECT_EQ(p.count(R, 2), 7);
  EXPECT_THROW(p.count(V, 3), Error);
  EXPECT_THROW(p.count(V, -1), Error);
  // Written back in the compact form: runs of two or more as ranges.
  const std::string text = format_plan(p);
  EXPECT_EQ(text,
            "coli-plan 1\n"
            "model 00000000000000ff layers 3 experts 8\n"
            "vram-budget 1000 ram-budget 2000\n"
            "prefill-chunk 512\n"
            "layer 0 vram 0-2,5 ram 3,6-7\n"
            "layer 1 vram - ram -\n"
            "layer 2 vram 7 ram 0-6\n");
  // A non-compact but valid spelling reads to the same tiers.
  std::string loose = valid_text();
  loose.replace(loose.find("0-2,5"), 5, "0,1,2,5");
  loose.replace(loose.find("ram 0-6"), 7, "ram 0-1,2-3,4,5,6");
  expect_same(parse_plan(loose, "p.txt"), p);
}

TEST(Plan, CommentsAreWrittenFirstAndSkippedOnRead) {
  Plan p = parse_plan(valid_text(), "p.txt");
  p.comments = {"decode 12.5 tok/s", "two\nlines", ""};
  const std::string text = format_plan(p);
  EXPECT_EQ(text.rfind("# decode 12.5 tok/s\n# two\n# lines\n#\ncoli-plan 1\n", 0), 0u) << text;
  const Plan back = parse_plan(text, "p.txt");
  expect_same(back, p);
  EXPECT_TRUE(back.comments.empty());
  // Comments and blank lines anywhere, CRLF and tabs are fine.
  std::string t = valid_text();
  t.replace(t.find("layer 1"), 0, "\n  # between layers\n\n");
  t.replace(t.find("prefill-chunk 512\n"), 18, "prefill-chunk\t512\r\n");
  EXPECT_EQ(parse_error(t), "");
  expect_same(parse_plan(t, "p.txt"), p);
}

TEST(Plan, RandomPlansRoundTrip) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const int layers = 1 + int(seed * 7 % 13), experts = 1 + int(seed * 31 % 97);
    const Plan p = random_plan(layers, experts, seed);
    const std::string text = format_plan(p);
    const Plan back = parse_plan(text, "r.txt");
    expect_same(back, p);
    EXPECT_EQ(format_plan(back), text);
  }
  // The extremes of every field.
  Plan p = random_plan(1, 65536 / 16, 99);
  p.fingerprint = UINT64_MAX, p.vram_budget = UINT64_MAX, p.ram_budget = 0, p.prefill_chunk = 1 << 20;
  expect_same(parse_plan(format_plan(p), "x"), p);
  Plan all_vram = random_plan(4096, 1, 5);
  std::fill(all_vram.tier.begin(), all_vram.tier.end(), Tier::kVram);
  expect_same(parse_plan(format_plan(all_vram), "x"), all_vram);
}

TEST(Plan, MalformedFilesAreErrorsNamingFileAndLine) {
  ASSERT_EQ(parse_error(valid_text()), "");
  auto with = [](const std::string& from, const std::string& to) {
    std::string t = valid_text();
    const std::size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    t.replace(at, from.size(), to);
    return t;
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "p.txt:1: empty file, not a coli plan file"},
      {"# only a comment\n\n", "p.txt:1: only blank lines or comments, not a coli plan file (expected 'coli-plan 1')"},
      {"\r\r\r", "p.txt:1: only blank lines or comments, not a coli plan file"},
      {"hello\n", "p.txt:1: not a coli plan file (expected 'coli-plan 1')"},
      {with("coli-plan 1", "coli-heat 1"), "p.txt:2: not a coli plan file"},
      {with("coli-plan 1", "coli-plan 2"), "p.txt:2: plan file version 2 is not supported"},
      {with("coli-plan 1", "coli-plan 1 x"), "p.txt:2: not a coli plan file"},
      {with("00000000000000ff", "00ff"), "p.txt:3: model fingerprint '00ff' is not 16 lowercase hex digits"},
      {with("00000000000000ff", "00000000000000FF"), "p.txt:3: model fingerprint '00000000000000FF' is not 16 lowercase hex digits"},
      {with("layers 3 experts 8", "layers 3"), "p.txt:3: expected 'model FINGERPRINT layers L experts E'"},
      {with("layers 3", "layers 0"), "p.txt:3: plan of 0 layers x 8 experts is outside"},
      {with("layers 3", "layers 4097"), "p.txt:3: plan of 4097 layers x 8 experts is outside"},
      {with("experts 8", "experts 65537"), "p.txt:3: plan of 3 layers x 65537 experts is outside"},
      {with("experts 8", "experts 99999999999999999999"), "p.txt:3: experts '99999999999999999999' is not below 2^64"},
      {with("layers 3", "layers -3"), "p.txt:3: layers '-3' is not a decimal number"},
      {with("vram-budget 1000", "vram-budget 1e3"), "p.txt:4: vram-budget '1e3' is not a decimal number"},
      {with("ram-budget 2000", "ram-budget 18446744073709551616"), "p.txt:4: ram-budget '18446744073709551616' is not below 2^64"},
      {with("ram-budget 2000", "ram-budget 2000 extra"), "p.txt:4: expected 'vram-budget BYTES ram-budget BYTES'"},
      {with("prefill-chunk 512", "prefill-chunk 1048577"), "p.txt:5: prefill-chunk 1048577 is outside 0..1048576"},
      {with("prefill-chunk 512", "prefill-chunk 512x"), "p.txt:5: prefill-chunk '512x' is not a decimal number"},
      {with("prefill-chunk 512\n", ""), "p.txt:5: expected 'prefill-chunk TOKENS'"},
      {with("layer 0 vram", "layer 1 vram"), "p.txt:6: layer 1 where layer 0 was expected"},
      {with("layer 1 vram", "layer 0 vram"), "p.txt:7: layer 0 again"},
      {with("layer 2 vram 7 ram 0-6\n", ""), "p.txt:8: ends early: no line for layer 2 of 3"},
      {with("layer 1 vram - ram -", "layer 1 ram - vram -"), "p.txt:7: expected 'layer 1 vram LIST ram LIST'"},
      {with("layer 1 vram - ram -", "layer 1 vram - ram - x"), "p.txt:7: expected 'layer 1 vram LIST ram LIST'"},
      {with("layer 1 vram - ram -", "layer 1 vram 8 ram -"), "p.txt:7: layer 1 vram expert 8 is outside [0, 8)"},
      {with("layer 1 vram - ram -", "layer 1 vram 2-8 ram -"), "p.txt:7: layer 1 vram expert 8 is outside [0, 8)"},
      {with("layer 1 vram - ram -", "layer 1 vram 5,3 ram -"), "p.txt:7: layer 1 vram list is not ascending and disjoint at '3'"},
      {with("layer 1 vram - ram -", "layer 1 vram 1-4,4 ram -"), "p.txt:7: layer 1 vram list is not ascending and disjoint at '4'"},
      {with("layer 1 vram - ram -", "layer 1 vram 3,3 ram -"), "p.txt:7: layer 1 vram list is not ascending and disjoint at '3'"},
      {with("layer 1 vram - ram -", "layer 1 vram - ram 4-2"), "p.txt:7: layer 1 ram range 4-2 is not ascending"},
      {with("layer 1 vram - ram -", "layer 1 vram - ram 4-4"), "p.txt:7: layer 1 ram range 4-4 is not ascending"},
      {with("layer 1 vram - ram -", "layer 1 vram 1,,2 ram -"), "p.txt:7: layer 1 vram list '1,,2' has an empty item"},
      {with("layer 1 vram - ram -", "layer 1 vram 1, ram -"), "p.txt:7: layer 1 vram list '1,' has an empty item"},
      {with("layer 1 vram - ram -", "layer 1 vram 1-2-3 ram -"), "p.txt:7: vram expert '2-3' is not a decimal number"},
      {with("layer 1 vram - ram -", "layer 1 vram -1 ram -"), "p.txt:7: vram expert '' is not a decimal number"},
      {with("layer 1 vram - ram -", "layer 1 vram 0x3 ram -"), "p.txt:7: vram expert '0x3' is not a decimal number"},
      {with("layer 1 vram - ram -", "layer 1 vram 99999999999999999999 ram -"), "p.txt:7: vram expert '99999999999999999999' is not below 2^64"},
      {with("layer 1 vram - ram -", "layer 1 vram 0-3 ram 3-5"), "p.txt:7: layer 1 expert 3 is in both the vram and the ram lists"},
      {with("layer 1 vram - ram -", "layer 1 vram -- ram -"), "p.txt:7: vram expert '' is not a decimal number"},
      {valid_text() + "layer 3 vram - ram -\n", "p.txt:9: unexpected 'layer' after the last layer"},
      {"coli-plan 1\n", "p.txt:2: ends early: no 'model' line"},
  };
  for (const auto& [text, want] : cases) {
    const std::string got = parse_error(text);
    EXPECT_EQ(got.rfind(want, 0), 0u) << "text:\n" << text << "\ngot: " << got << "\nwant: " << want;
  }
}

TEST(Plan, FormatRefusesPlansItCannotWriteBack) {
  Plan p = parse_plan(valid_text(), "p.txt");
  Plan bad = p;
  bad.tier.pop_back();
  EXPECT_THROW(format_plan(bad), Error);
  EXPECT_THROW(plan_as_heat(bad), Error);
  bad = p, bad.prefill_chunk = -1;
  EXPECT_THROW(format_plan(bad), Error);
  bad = p, bad.tier[0] = Tier(7);
  EXPECT_THROW(format_plan(bad), Error);
  bad = p, bad.layers = 0, bad.tier.clear();
  EXPECT_THROW(format_plan(bad), Error);
}

TEST(Plan, LoadRefusesAnotherModelsPlan) {
  test::TempDir d;
  const std::string path = d / "p.txt";
  save_plan(path, random_plan(8, 16, 3));
  const uint64_t fp = random_plan(8, 16, 3).fingerprint;
  EXPECT_EQ(test::error_of([&] { load_plan(path, fp, 8, 16); }), "(no error)");
  const std::string other = test::error_of([&] { load_plan(path, fp ^ 1, 8, 16); });
  EXPECT_EQ(other.rfind(path + ": plan of model ", 0), 0u) << other;
  EXPECT_NE(other.find("not of this model"), std::string::npos) << other;
  EXPECT_EQ(test::error_of([&] { load_plan(path, fp, 8, 32); }), path + ": plan of 8 layers x 16 experts, the model has 8 x 32");
  EXPECT_EQ(test::error_of([&] { load_plan(path, fp, 9, 16); }), path + ": plan of 8 layers x 16 experts, the model has 9 x 16");
  std::filesystem::remove(path);
  EXPECT_NE(test::error_of([&] { load_plan(path, fp, 8, 16); }).find(path), std::string::npos);  // missing
  test::write_file(path, "coli-plan 1\nmodel zz layers 8 experts 16\n");
  EXPECT_EQ(test::error_of([&] { load_plan(path, fp, 8, 16); }).rfind(path + ":2: model fingerprint 'zz'", 0), 0u);
}

TEST(Plan, SaveAndLoadRoundTripAtomically) {
  test::TempDir d;
  const std::string path = d / "plan.txt";
  Plan p = random_plan(6, 40, 4);
  p.comments = {"predicted decode 7.1 tok/s"};
  save_plan(path, p);
  const Plan back = load_plan(path, p.fingerprint, 6, 40);
  expect_same(back, p);
  EXPECT_EQ(read_text_file(path), format_plan(p));
  // Saving again replaces the file and leaves nothing else in the directory.
  Plan q = random_plan(6, 40, 5);
  q.fingerprint = p.fingerprint;
  save_plan(path, q);
  expect_same(load_plan(path, p.fingerprint, 6, 40), q);
  EXPECT_EQ(test::listing(d.path()), "plan.txt");
  // A plan that cannot be written leaves the old file as it was.
  Plan bad = q;
  bad.tier.clear();
  EXPECT_THROW(save_plan(path, bad), Error);
  expect_same(load_plan(path, p.fingerprint, 6, 40), q);
  EXPECT_EQ(test::listing(d.path()), "plan.txt");
}

TEST(Plan, AsHeatMakesTheTierPickExactlyThePlansVramExperts) {
  for (uint64_t seed : {11, 12, 13}) {
    const Plan p = random_plan(5, 24, seed);
    const std::vector<uint64_t> heat = plan_as_heat(p);
    ASSERT_EQ(heat.size(), p.tier.size());
    for (std::size_t i = 0; i < heat.size(); ++i) EXPECT_EQ(heat[i], p.tier[i] == Tier::kVram ? 1u : 0u);
    const TierPlan t = plan_tier(p.layers, p.experts, p.count(Tier::kVram), &heat);
    EXPECT_EQ(t.count, p.count(Tier::kVram));
    for (int l = 0; l < p.layers; ++l) {
      EXPECT_EQ(t.resident_in_layer(l), p.count(Tier::kVram, l));
      for (int e = 0; e < p.experts; ++e) EXPECT_EQ(t.is_resident(l, e), p.at(l, e) == Tier::kVram) << l << "/" << e;
    }
  }
  // No VRAM experts: no slots, nothing resident.
  Plan none = random_plan(2, 4, 1);
  std::fill(none.tier.begin(), none.tier.end(), Tier::kRam);
  const std::vector<uint64_t> zero = plan_as_heat(none);
  EXPECT_EQ(plan_tier(2, 4, none.count(Tier::kVram), &zero).count, 0);
}

// With heat, the plan's VRAM experts still come first, and among them (and
// among the others) the hotter one first: a tier one slot smaller than the
// plan drops the plan's coldest VRAM expert.
TEST(Plan, AsHeatKeepsTheHottestOfThePlanFirst) {
  Plan p;
  p.fingerprint = 1, p.layers = 1, p.experts = 4;
  p.tier = {Tier::kVram, Tier::kDisk, Tier::kVram, Tier::kRam};
  const std::vector<uint64_t> heat = {5, 100, 9, 50};
  const std::vector<uint64_t> h = plan_as_heat(p, heat);
  EXPECT_GT(h[0], h[1]);
  EXPECT_GT(h[2], h[0]);
  EXPECT_GT(h[1], h[3]);
  const TierPlan one = plan_tier(1, 4, 1, &h);
  EXPECT_TRUE(one.is_resident(0, 2));
  EXPECT_FALSE(one.is_resident(0, 0));
  const TierPlan three = plan_tier(1, 4, 3, &h);
  EXPECT_TRUE(three.is_resident(0, 0) && three.is_resident(0, 2) && three.is_resident(0, 1));
}
