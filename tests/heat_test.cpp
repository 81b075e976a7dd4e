// Routing heat: counts against the transformers router top-k of the tiny
// fixture, the file format (round trip, every rejection naming the file and
// line), decay on merge, the tools' --heat, and the CUDA backend's device
// counters against the CPU's counts (skipped without a device).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "cpu_backend.h"
#include "cuda_backend.h"
#include "cuda_device.h"
#include "engine/engine.h"
#include "engine_util.h"
#include "model/fingerprint.h"
#include "model/weights.h"
#include "placement/heat.h"
#include "placement/heat_recorder.h"
#include "test_util.h"
#include "util/error.h"
#include "util/io.h"

using namespace coli;

namespace {

const std::string kTiny = "tiny-qwen35moe-text";

std::string tiny_path() { return test::data_dir() + "/" + kTiny; }

// Histogram of a golden prompt's router top-k: [layers * experts].
std::vector<uint64_t> golden_counts(const nlohmann::json& p, int layers, int experts) {
  std::vector<uint64_t> c(std::size_t(layers) * experts, 0);
  for (int l = 0; l < layers; ++l)
    for (const auto& tok : p["router_topk"][l])
      for (int e : tok.get<std::vector<int>>()) ++c[std::size_t(l) * experts + e];
  return c;
}

std::vector<uint64_t> to_vec(const Heat& h) { return {h.counts().begin(), h.counts().end()}; }

// The error message of parse_heat on text, "" when it parses.
std::string parse_error(const std::string& text) {
  try {
    parse_heat(text, "h.txt");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string valid_text() {
  return "coli-heat 1\nmodel 00000000000000ff\nlayers 2\nexperts 3\ntokens 5\nlayer 0 5 0 3\nlayer 1 1 2 4\n";
}

Heat random_heat(int layers, int experts, uint64_t seed) {
  Heat h(layers, experts);
  std::mt19937_64 rng(seed);
  const int K = std::min(4, experts);
  const int T = 50;
  for (int t = 0; t < T; ++t)
    for (int l = 0; l < layers; ++l) {
      std::vector<int> all(experts);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      h.add(l, all.data(), K);
    }
  h.add_tokens(T);
  return h;
}

}  // namespace

TEST(Heat, CpuPrefillCountsAreTheGoldenRouterTopK) {
  auto m = Model::load(tiny_path());
  const ModelSpec& s = m->spec();
  cpu::CpuBackend cpu(*m);
  for (int chunk : {512, 3}) {  // one chunk, and a prompt split over chunks
    Engine e(s, cpu, chunk);
    for (const auto& p : test::tiny_goldens()["prompts"]) {
      const std::vector<int> ids = p["ids"];
      Heat h(s.num_layers, s.num_experts);
      e.set_heat(&h);
      Session ses = e.new_session();
      e.forward(ses, ids);
      e.collect_heat();
      e.set_heat(nullptr);
      EXPECT_EQ(h.tokens(), ids.size());
      EXPECT_EQ(to_vec(h), golden_counts(p, s.num_layers, s.num_experts)) << "prompt of " << ids.size() << ", chunks of " << chunk;
    }
  }
}

TEST(Heat, DecodeStepsAreCountedAsTheRouterChoseThem) {
  auto m = Model::load(tiny_path());
  const ModelSpec& s = m->spec();
  cpu::CpuBackend cpu(*m);
  Engine counted(s, cpu), observed(s, cpu);
  const std::vector<int> ids = test::tiny_goldens()["prompts"][1]["ids"];
  Heat h(s.num_layers, s.num_experts), ref(s.num_layers, s.num_experts);
  counted.set_heat(&h);
  Session a = counted.new_session(), b = observed.new_session();
  auto observe = [&](int layer, int T, const int* idx, const float*) { ref.add(layer, idx, std::size_t(T) * s.num_experts_per_tok); };
  auto logits = counted.forward(a, ids);
  observed.forward(b, ids, observe);
  for (int step = 0; step < 4; ++step) {
    const std::vector<int> next{static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin())};
    logits = counted.forward(a, next);
    observed.forward(b, next, observe);
  }
  counted.collect_heat();
  EXPECT_EQ(h.tokens(), ids.size() + 4);
  EXPECT_EQ(to_vec(h), to_vec(ref));
  for (int l = 0; l < s.num_layers; ++l) {
    uint64_t sum = 0;
    for (int e = 0; e < s.num_experts; ++e) sum += h.count(l, e);
    EXPECT_EQ(sum, h.tokens() * s.num_experts_per_tok) << "layer " << l;
  }
}

TEST(Heat, SaveAndLoadRoundTrip) {
  test::TempDir d;
  const Heat h = random_heat(8, 16, 1);
  save_heat(d / "h.txt", h, 0x1234abcdULL);
  const Heat back = load_heat(d / "h.txt", 0x1234abcdULL, 8, 16);
  EXPECT_EQ(back.tokens(), h.tokens());
  EXPECT_EQ(to_vec(back), to_vec(h));
  const std::string text = read_text_file(d / "h.txt");
  EXPECT_EQ(text.rfind("coli-heat 1\n", 0), 0u);
  EXPECT_NE(text.find("\nmodel 000000001234abcd\n"), std::string::npos);
  EXPECT_EQ(format_heat(parse_heat(text, "x").heat, 0x1234abcdULL), text);
  // Saving again replaces the file, leaving nothing else in the directory.
  save_heat(d / "h.txt", Heat(8, 16), 0x1234abcdULL);
  EXPECT_EQ(load_heat(d / "h.txt", 0x1234abcdULL, 8, 16).tokens(), 0u);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(d.path()), std::filesystem::directory_iterator()), 1);
}

TEST(Heat, CorruptFilesAreRejectedNamingFileAndLine) {
  ASSERT_EQ(parse_error(valid_text()), "");
  const HeatFile f = parse_heat(valid_text(), "h.txt");
  EXPECT_EQ(f.fingerprint, 0xffu);
  EXPECT_EQ(f.heat.count(1, 2), 4u);
  EXPECT_EQ(f.heat.tokens(), 5u);
  auto with = [](const std::string& from, const std::string& to) {
    std::string t = valid_text();
    t.replace(t.find(from), from.size(), to);
    return t;
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "h.txt: empty file"},
      {"hello\n", "h.txt:1: not a coli heat file"},
      {"\n" + valid_text(), "h.txt:1: not a coli heat file"},
      {with("coli-heat 1", "coli-heat 2"), "h.txt:1: heat file version 2 is not supported"},
      {with("coli-heat 1", "coli-heat x"), "h.txt:1: version 'x' is not a decimal number"},
      {with("model 00000000000000ff", "model 00ff"), "h.txt:2: model fingerprint '00ff' is not 16 lowercase hex digits"},
      {with("layers 2", "layer 2"), "h.txt:3: expected 'layers N'"},
      {with("layers 2", "layers 0"), "h.txt:3: heat of 0 layers"},
      {with("experts 3", "experts 99999999999"), "h.txt:4: heat of 2 layers x 99999999999 experts is outside"},
      {with("tokens 5", "tokens 99999999999999999999"), "h.txt:5: tokens '99999999999999999999' is not below 2^64"},
      {with("tokens 5", "tokens -5"), "h.txt:5: tokens '-5' is not a decimal number"},
      {with("layer 0 5 0 3", "layer 0 6 0 3"), "h.txt:6: count 6 of expert 0 exceeds the 5 tokens"},
      {with("layer 0 5 0 3", "layer 0 5 0"), "h.txt:6: layer 0 has 2 counts, not 3"},
      {with("layer 0 5 0 3", "layer 1 5 0 3"), "h.txt:6: expected layer 0 here"},
      {with("layer 1 1 2 4\n", ""), "h.txt: ends early: no line for layer 1 of 2"},
      {valid_text() + "layer 2 0 0 0\n", "h.txt:8: unexpected 'layer' after the last layer"},
      {"coli-heat 1\nmodel 00000000000000ff\n", "h.txt: ends early: no 'layers' line"},
  };
  for (const auto& [text, want] : cases) {
    const std::string got = parse_error(text);
    EXPECT_EQ(got.rfind(want, 0), 0u) << "text:\n" << text << "\ngot: " << got << "\nwant: " << want;
  }
  // Comments, blank lines and CRLF line ends are fine.
  EXPECT_EQ(parse_error(with("layers 2\n", "# note\n\nlayers 2\r\n")), "");
}

TEST(Heat, AnotherModelsFileIsAnErrorNamingIt) {
  test::TempDir d;
  save_heat(d / "h.txt", random_heat(8, 16, 2), 7);
  auto error = [&](uint64_t fp, int layers, int experts) {
    try {
      load_heat(d / "h.txt", fp, layers, experts);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error(7, 8, 16), "");
  EXPECT_EQ(error(8, 8, 16), d / "h.txt" + ": heat of model 0000000000000007, not of this model 0000000000000008 (give another --heat file)");
  EXPECT_EQ(error(7, 8, 32).rfind(d / "h.txt" + ": heat of 8 layers x 16 experts, the model has 8 x 32", 0), 0u);
  std::filesystem::remove(d / "h.txt");
  EXPECT_NE(error(7, 8, 16).find(d / "h.txt"), std::string::npos);  // missing
}

TEST(Heat, MergeDecaysTheOlderCountsByTheHalfLife) {
  Heat old(1, 4), newer(1, 4);
  const int a[] = {0, 1, 0, 2}, b[] = {3, 3};
  old.add(0, a, 4), old.add_tokens(1000);
  newer.add(0, b, 2), newer.add_tokens(100);
  Heat plain = old;
  plain.merge(newer, 0);  // no decay
  EXPECT_EQ(to_vec(plain), (std::vector<uint64_t>{2, 1, 1, 2}));
  EXPECT_EQ(plain.tokens(), 1100u);
  // One half-life of newer tokens halves the older table (rounded).
  Heat big(1, 4);
  big.add_counts(std::vector<uint64_t>{800, 301, 0, 7}), big.add_tokens(1000);
  big.merge(newer, 100);
  EXPECT_EQ(to_vec(big), (std::vector<uint64_t>{400, 151, 0, 6}));  // 150.5 -> 151, 3.5 -> 4, + 2
  EXPECT_EQ(big.tokens(), 600u);
  // Saturation instead of wrapping.
  Heat sat(1, 4), huge(1, 4);
  sat.add_counts(std::vector<uint64_t>{UINT64_MAX, 0, 0, 0}), sat.add_tokens(UINT64_MAX);
  huge.add_counts(std::vector<uint64_t>{5, 0, 0, 0}), huge.add_tokens(5);
  sat.merge(huge, 0);
  EXPECT_EQ(sat.count(0, 0), UINT64_MAX);
  EXPECT_EQ(sat.tokens(), UINT64_MAX);
  EXPECT_THROW(sat.merge(Heat(2, 4)), Error);
  const int bad[] = {4};
  EXPECT_THROW(old.add(0, bad, 1), Error);
}

TEST(Heat, HottestFirstOrders) {
  Heat h(2, 4);
  h.add_counts(std::vector<uint64_t>{3, 9, 3, 0, 1, 0, 9, 4});
  EXPECT_EQ(h.order(0), (std::vector<int>{1, 0, 2, 3}));  // ties: lower index first
  EXPECT_EQ(h.order(1), (std::vector<int>{2, 3, 0, 1}));
  const auto g = h.global_order();
  ASSERT_EQ(g.size(), 8u);
  auto at = [&](int i) { return std::to_string(g[i].layer) + "/" + std::to_string(g[i].expert) + "=" + std::to_string(g[i].count); };
  EXPECT_EQ(at(0), "0/1=9");  // ties: lower layer first
  EXPECT_EQ(at(1), "1/2=9");
  EXPECT_EQ(at(2), "1/3=4");
  EXPECT_EQ(at(3), "0/0=3");
  EXPECT_EQ(at(4), "0/2=3");
}

TEST(Heat, DefaultPathFollowsTheCacheDirectory) {
  EXPECT_EQ(default_heat_path(0xab, "/c", "/h"), "/c/coli/heat-00000000000000ab.txt");
  EXPECT_EQ(default_heat_path(0xab, "relative", "/h"), "/h/.cache/coli/heat-00000000000000ab.txt");
  EXPECT_EQ(default_heat_path(0xab, nullptr, "/h"), "/h/.cache/coli/heat-00000000000000ab.txt");
  EXPECT_EQ(default_heat_path(0xab, nullptr, nullptr), "");
  EXPECT_EQ(heat_path_for("none", 0xab, "/c", "/h"), "");
  EXPECT_EQ(heat_path_for("", 0xab, "/c", "/h"), "/c/coli/heat-00000000000000ab.txt");
  EXPECT_EQ(heat_path_for("my.txt", 0xab, "/c", "/h"), "my.txt");
}

TEST(Heat, RecorderMergesIntoTheFileAtEachSave) {
  test::TempDir d;
  auto m = Model::load(tiny_path());
  const ModelSpec& s = m->spec();
  const std::string path = d / "sub/dir/h.txt";  // directories made at save
  HeatRecorder r(path, 42, s);
  EXPECT_TRUE(r.previous().empty());
  const int a[] = {1, 2, 3, 4};
  r.run()->add(0, a, 4), r.run()->add_tokens(1);
  r.save();
  r.save();  // nothing new: the file keeps one token
  EXPECT_EQ(load_heat(path, 42, s.num_layers, s.num_experts).tokens(), 1u);
  HeatRecorder r2(path, 42, s);
  EXPECT_EQ(r2.previous().count(0, 3), 1u);
  EXPECT_THROW(HeatRecorder(path, 43, s), Error);  // another model's file: before any work
  HeatRecorder off("", 42, s);
  EXPECT_EQ(off.run(), nullptr);
  off.save();
}

// ---- through the binaries ------------------------------------------------

namespace {

std::string run_tool(const std::string& args, int* rc, const std::string& env = "") {
  std::string out;
  *rc = test::run_command(env + " " + test::bin_dir() + "/" + args + " 2>&1", &out);
  return out;
}

}  // namespace

TEST(HeatTool, ColiRunCreatesTheFileAndTheNextRunAccumulates) {
  test::TempDir d;
  const std::string heat = d / "h.txt";
  const std::string args = "coli-run --model " + tiny_path() + " --prompt-ids 1,2,3,4,5 -n 4 --temp 0 --device cpu --heat " + heat;
  int rc = 0;
  std::string out = run_tool(args, &rc);
  ASSERT_EQ(rc, 0) << out;
  auto m = Model::load(tiny_path());
  const ModelSpec& s = m->spec();
  const uint64_t fp = model_fingerprint(tiny_path());
  const Heat one = load_heat(heat, fp, s.num_layers, s.num_experts);
  EXPECT_EQ(one.tokens(), 5u + 3u);  // the prompt and 3 decode steps (the 4th token is not fed back)
  out = run_tool(args, &rc);
  ASSERT_EQ(rc, 0) << out;
  const Heat two = load_heat(heat, fp, s.num_layers, s.num_experts);
  EXPECT_EQ(two.tokens(), 2 * one.tokens());  // decay of 8 tokens over the default half-life rounds away
  std::vector<uint64_t> twice = to_vec(one);
  for (auto& c : twice) c *= 2;
  EXPECT_EQ(to_vec(two), twice);
}

TEST(HeatTool, DefaultPathNoneAndBadFiles) {
  test::TempDir d;
  const std::string base = "coli-run --model " + tiny_path() + " --prompt-ids 1,2,3 -n 2 --temp 0 --device cpu";
  const std::string env = "XDG_CACHE_HOME=" + d.path();
  int rc = 0;
  std::string out = run_tool(base + " --heat none", &rc, env);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_FALSE(std::filesystem::exists(d / "coli"));
  out = run_tool(base, &rc, env);
  ASSERT_EQ(rc, 0) << out;
  char name[64];
  std::snprintf(name, sizeof name, "coli/heat-%016llx.txt", static_cast<unsigned long long>(model_fingerprint(tiny_path())));
  EXPECT_TRUE(std::filesystem::exists(d / name)) << name;
  // A corrupt file: exit 1 naming it, before generating anything.
  { std::ofstream(d / "bad.txt") << "coli-heat 1\nmodel zz\n"; }
  out = run_tool(base + " --heat " + d / "bad.txt", &rc, env);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find(d / "bad.txt" + ":2: model fingerprint 'zz'"), std::string::npos) << out;
  out = run_tool(base + " --heat ''", &rc, env);
  EXPECT_EQ(rc, 2) << out;
}

TEST(HeatTool, ColiBenchCountsEveryToken) {
  test::TempDir d;
  int rc = 0;
  const std::string heat = d / "b.txt";
  std::string out = run_tool("coli-bench -m " + tiny_path() + " -p 4 -n 2 -r 1 --no-warmup --heat " + heat, &rc);
  ASSERT_EQ(rc, 0) << out;
  auto m = Model::load(tiny_path());
  const Heat h = load_heat(heat, model_fingerprint(tiny_path()), m->spec().num_layers, m->spec().num_experts);
  EXPECT_EQ(h.tokens(), 6u);  // pp 4 and tg 2
  out = run_tool("coli-bench -m " + tiny_path() + "," + tiny_path() + " -p 4 -n 0 -r 1 --heat " + heat, &rc);
  EXPECT_EQ(rc, 2) << out;  // one file, several models
}

// ---- the CUDA backend's device counters ------------------------------------

TEST(HeatCuda, DeviceCountsEqualTheCpuCounts) {
  std::string why;
  if (cuda::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  auto m = Model::load(tiny_path());
  const ModelSpec& s = m->spec();
  cpu::CpuBackend ref(*m);
  auto gpu = cuda::make_cuda_backend(*m);
  ASSERT_TRUE(gpu->runs_whole_chunks());
  // 7: prompt chunks on the per-pair expert kernels; 64: grouped by expert.
  for (int chunk : {7, 64}) {
    Engine er(s, ref, chunk), eg(s, *gpu, chunk);
    for (const auto& p : test::tiny_goldens()["prompts"]) {
      const std::vector<int> ids = p["ids"];
      Session warm = eg.new_session();
      eg.forward(warm, ids);  // counted on the device with no heat set: dropped by set_heat
      Heat hr(s.num_layers, s.num_experts), hg(s.num_layers, s.num_experts);
      er.set_heat(&hr), eg.set_heat(&hg);
      Session sr = er.new_session(), sg = eg.new_session();
      auto lr = er.forward(sr, ids);
      eg.forward(sg, ids);
      eg.collect_heat();
      EXPECT_EQ(to_vec(hg), to_vec(hr)) << "prompt of " << ids.size() << ", chunks of " << chunk;
      for (int step = 0; step < 3; ++step) {  // decode steps: graph replays; the same token fed to both
        const std::vector<int> next{static_cast<int>(std::max_element(lr.begin(), lr.end()) - lr.begin())};
        lr = er.forward(sr, next);
        eg.forward(sg, next);
      }
      er.collect_heat(), eg.collect_heat();
      EXPECT_EQ(hg.tokens(), ids.size() + 3);
      EXPECT_EQ(hg.tokens(), hr.tokens());
      EXPECT_EQ(to_vec(hg), to_vec(hr)) << "prompt of " << ids.size() << " + 3 decode steps, chunks of " << chunk;
      er.set_heat(nullptr), eg.set_heat(nullptr);
    }
  }
  // With a route observer the engine takes the per-layer steps, which the
  // device does not count: the engine counts them, once.
  Engine er(s, ref, 7), eg(s, *gpu, 7);
  const std::vector<int> ids = test::tiny_goldens()["prompts"][2]["ids"];
  Heat hr(s.num_layers, s.num_experts), hg(s.num_layers, s.num_experts);
  er.set_heat(&hr), eg.set_heat(&hg);
  Session sr = er.new_session(), sg = eg.new_session();
  er.forward(sr, ids);
  eg.forward(sg, ids, [](int, int, const int*, const float*) {});
  eg.collect_heat();
  EXPECT_EQ(hg.tokens(), ids.size());
  EXPECT_EQ(to_vec(hg), to_vec(hr));
}
