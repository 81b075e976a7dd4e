// The fast CPU backend (SIMD kernels, threads, fused experts) against the
// reference backend and the transformers goldens.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <nlohmann/json.hpp>

#include "convert/convert.h"
#include "convert/synth.h"
#include "kernels_vnni.h"
#include "cpu_backend.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "model/weights.h"
#include "engine_util.h"
#include "test_util.h"

using namespace coli;

TEST(FastBackend, MatchesGoldensOnTheCheckpoint) {
  auto m = Model::load(test::data_dir() + "/tiny-qwen35moe-text");
  for (int threads : {1, 3}) {
    cpu::CpuBackend be(*m, {threads, true});
    Engine e(m->spec(), be, 7);  // small prefill chunks: the panel path and chunking both run
    test::expect_golden_prompts(e, std::to_string(threads) + " threads, ");
  }
}

TEST(FastBackend, ChunkedDeltaNetPrefillMatchesGoldens) {
  auto m = Model::load(test::data_dir() + "/tiny-qwen35moe-text");
  cpu::CpuOptions o;
  o.threads = 2;
  o.fast = true;
  o.gdn_chunked = true;
  cpu::CpuBackend be(*m, o);
  Engine e(m->spec(), be, 100);  // 60-token prompt: one chunk of 60 in the chunked form
  test::expect_golden_prompts(e);
}

TEST(FastBackend, Int8ContainerGivesTheGoldenTokens) {
  test::TempDir d;
  auto m = test::convert_all(test::data_dir() + "/tiny-qwen35moe-text", d / "m.coli", QuantFormat::I8);
  cpu::CpuBackend ref(*m), fast(*m, {4, true});
  Engine er(m->spec(), ref), ef(m->spec(), fast);
  for (const auto& p : test::tiny_goldens()["prompts"]) {
    const std::vector<int> ids = p["ids"];
    EXPECT_EQ(test::greedy_tokens(ef, ids), p["greedy"].get<std::vector<int>>());
    Session sr = er.new_session(), sf = ef.new_session();
    const auto lr = er.forward(sr, ids), lf = ef.forward(sf, ids);
    // The fast path quantizes activations to int8 per 32 columns for int8 and
    // int4 weights (AVX512-VNNI): logits move by up to ~1e-3 of their range.
    float err = 0, range = 0;
    for (std::size_t i = 0; i < lr.size(); ++i) err = std::max(err, std::fabs(lr[i] - lf[i])), range = std::max(range, std::fabs(lr[i]));
    std::printf("[ info     ] int8 container, fast vs reference: max |dlogit| %.4f of max |logit| %.2f\n", err, range);
    EXPECT_LT(err, 2e-3f * range);
  }
}

// A decode step's experts as one parallel run (expert_one_token.cpp) give
// the two-run path's sums bit for bit: the same kernels on the same rows,
// the experts summed in the same order. A synthetic container at shapes
// the VNNI kernel takes (hidden 256, intermediate 128), int4-g32 experts;
// every count of distinct experts, in routing (not id) order.
namespace {
// A synthetic container of `layers` layers at shapes the VNNI kernel takes
// (hidden 256, intermediate 128; 16 experts top-8), int4-g32 experts.
std::unique_ptr<Model> vnni_shaped_model(const std::string& path, int layers) {
  SynthOptions so;
  so.layers = layers, so.vocab = 300, so.hidden = 256, so.experts = 16, so.top_k = 8, so.moe_inter = 128, so.shared_inter = 64;
  so.heads = 2, so.kv_heads = 1, so.head_dim = 32, so.lin_k_heads = 2, so.lin_v_heads = 4, so.lin_k_dim = 16, so.lin_v_dim = 16;
  ConvertOptions co;
  co.experts = co.down = QuantFormat::I4_G32, co.verify = false;
  write_synthetic_container(path, so, co);
  return Model::load(path);
}
}  // namespace

TEST(FastBackend, OneTokenRunIsBitIdenticalToTwoRuns) {
  test::TempDir d;
  auto model = vnni_shaped_model(d / "m.coli", 2);
  const ModelSpec& s = model->spec();
  const MoeWeights& moe = model->layer(1).moe;
  if (!cpu::vnni_applies(moe.experts[0].gate, 1) || !cpu::vnni_applies(moe.experts[0].down, 1))
    GTEST_SKIP() << "the one-token run takes the VNNI kernel: this CPU has no AVX512-VNNI";
  cpu::CpuOptions one{4, true}, two{4, true};
  two.one_token_run = false;
  cpu::CpuBackend a(*model, one), b(*model, two);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> hn(s.hidden_size);
  for (int n = 1; n <= s.num_experts_per_tok; ++n)
    for (int layer = 0; layer < s.num_layers; ++layer) {
      for (float& v : hn) v = nd(rng);
      std::vector<int> ids(s.num_experts);
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      std::vector<ExpertPair> pairs;
      for (int i = 0; i < n; ++i) pairs.push_back(ExpertPair{0, ids[i], std::uniform_real_distribution<float>(0.01f, 1.0f)(rng)});
      std::vector<float> ya(s.hidden_size, 1.0f), yb(s.hidden_size, 2.0f);
      a.routed_experts(layer, pairs.data(), n, hn.data(), ya.data());
      b.routed_experts(layer, pairs.data(), n, hn.data(), yb.data());
      ASSERT_EQ(0, std::memcmp(ya.data(), yb.data(), ya.size() * sizeof(float))) << n << " experts, layer " << layer;
      float mx = 0;
      for (float v : ya) mx = std::max(mx, std::fabs(v));
      EXPECT_GT(mx, 0.0f);  // real sums, not two zero rows
    }
}

// A decode expert split with the device (ExpertPair::first_row): the host
// computes its intermediate rows from the first row on, which is the
// scalar reference's sum over those rows (within the int8 activations'
// rounding), and the one-token run and the two-run path agree bit for bit
// with some of a step's experts split.
TEST(FastBackend, SplitExpertsComputeTheirRowsFromTheFirstRow) {
  test::TempDir d;
  auto model = vnni_shaped_model(d / "m.coli", 1);
  const ModelSpec& s = model->spec();
  const int H = s.hidden_size, I = s.moe_intermediate_size;
  const MoeWeights& moe = model->layer(0).moe;
  cpu::CpuOptions one{3, true}, two{3, true};
  two.one_token_run = false;
  cpu::CpuBackend a(*model, one), b(*model, two);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> hn(H);
  for (float& v : hn) v = nd(rng);
  // The scalar reference of expert e's rows [r0, I), weight w.
  auto reference = [&](int e, int r0, float w) {
    const ExpertWeights& x = moe.experts[e];
    std::vector<float> row(H), act(I, 0.0f), drow(I), y(H, 0.0f);
    for (int r = r0; r < I; ++r) {
      double g = 0, u = 0;
      x.gate.row_f32(r, row.data());
      for (int h = 0; h < H; ++h) g += double(row[h]) * hn[h];
      x.up.row_f32(r, row.data());
      for (int h = 0; h < H; ++h) u += double(row[h]) * hn[h];
      act[r] = static_cast<float>(g / (1.0 + std::exp(-g)) * u);
    }
    for (int h = 0; h < H; ++h) {
      x.down.row_f32(h, drow.data());
      double acc = 0;
      for (int r = r0; r < I; ++r) acc += double(drow[r]) * act[r];
      y[h] = static_cast<float>(w * acc);
    }
    return y;
  };
  for (int first : {0, 32, 64, 96}) {
    const ExpertPair p{0, 5, 0.7f, first};
    const std::vector<float> ref = reference(5, first, 0.7f);
    float mx = 0, err = 0;
    std::vector<float> ya(H), yb(H);
    a.routed_experts(0, &p, 1, hn.data(), ya.data());
    b.routed_experts(0, &p, 1, hn.data(), yb.data());
    for (int h = 0; h < H; ++h) mx = std::max(mx, std::fabs(ref[h])), err = std::max({err, std::fabs(ya[h] - ref[h]), std::fabs(yb[h] - ref[h])});
    EXPECT_GT(mx, 0.0f);
    EXPECT_LT(err, 0.02f * mx + 1e-6f) << "first row " << first;
  }
  // A step's experts, some split: the two paths bit for bit.
  for (int trial = 0; trial < 6; ++trial) {
    std::vector<int> ids(s.num_experts);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<ExpertPair> pairs;
    for (int i = 0; i < 5; ++i) pairs.push_back(ExpertPair{0, ids[i], 0.2f + 0.1f * i, i % 2 ? 32 * (1 + trial % 3) : 0});
    std::vector<float> ya(H, 1.0f), yb(H, 2.0f);
    a.routed_experts(0, pairs.data(), 5, hn.data(), ya.data());
    b.routed_experts(0, pairs.data(), 5, hn.data(), yb.data());
    if (cpu::vnni_applies(moe.experts[0].gate, 1)) {
      ASSERT_EQ(0, std::memcmp(ya.data(), yb.data(), ya.size() * sizeof(float))) << "trial " << trial;
    }
  }
  // The reference path does not split: a clear internal error.
  cpu::CpuBackend ref(*model);
  const ExpertPair p{0, 1, 1.0f, 32};
  std::vector<float> y(H);
  EXPECT_THROW(ref.routed_experts(0, &p, 1, hn.data(), y.data()), Error);
}
