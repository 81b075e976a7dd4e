// qwen3_moe and qwen3_next (issue 31) on the paths that need no fixture
// from transformers: the fused DeltaNet projections' row order against a
// transcription of transformers' own reordering, synthetic checkpoints of
// each family that bind straight and convert, and the CPU backend running
// them with their layers' differences (plain-w norms and no output gate or
// shared expert for qwen3_moe, qwen3_next's split projections), the
// checkpoint and its bf16 container giving the same logits.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>

#include "convert/convert.h"
#include "convert/synth.h"
#include "cpu_backend.h"
#include "engine/engine.h"
#include "formats/container.h"
#include "model/fused_projections.h"
#include "model/layer_tensors.h"
#include "model/weights.h"
#include "engine_util.h"
#include "test_util.h"
#include "util/error.h"

using namespace coli;

namespace {

SynthOptions small(ModelFamily f, int layers) {
  SynthOptions o = synth_shapes(SynthOptions{}, f);
  o.layers = layers;
  o.vocab = 300, o.hidden = 128, o.experts = f == ModelFamily::kQwen3Next ? 32 : 16, o.top_k = f == ModelFamily::kQwen3Next ? 5 : 4;
  o.moe_inter = 32, o.shared_inter = f == ModelFamily::kQwen3Moe ? 0 : 48;
  o.heads = 4, o.kv_heads = 2, o.head_dim = 32, o.lin_k_heads = 2, o.lin_v_heads = 6, o.lin_k_dim = 16, o.lin_v_dim = 8;
  o.shard_bytes = 1 << 20;
  return o;
}

}  // namespace

// Qwen3NextGatedDeltaNet.fix_query_key_value_ordering, transcribed: the
// fused output viewed as [nk, 2 dk + 2 r dv] and split per group into q
// (dk), k (dk), v (r dv), z (r dv); q, k, v each flattened group-major and
// concatenated for the conv; ba viewed as [nk, 2 r] and split into b, a.
// fused_row must name, for every split row, the fused row this gives.
TEST(Families, FusedProjectionRowsFollowTransformersOrdering) {
  ModelSpec s;
  s.linear_num_key_heads = 3, s.linear_num_value_heads = 6, s.linear_key_head_dim = 4, s.linear_value_head_dim = 5, s.hidden_size = 8;
  const int nk = 3, dk = 4, dv = 5, r = 2, group = 2 * dk + 2 * r * dv;
  std::vector<int> q, k, v, z, b, a;
  for (int g = 0; g < nk; ++g) {
    const int base = g * group;
    for (int i = 0; i < dk; ++i) q.push_back(base + i);
    for (int i = 0; i < dk; ++i) k.push_back(base + dk + i);
    for (int i = 0; i < r * dv; ++i) v.push_back(base + 2 * dk + i);
    for (int i = 0; i < r * dv; ++i) z.push_back(base + 2 * dk + r * dv + i);
    for (int i = 0; i < r; ++i) b.push_back(g * 2 * r + i);
    for (int i = 0; i < r; ++i) a.push_back(g * 2 * r + r + i);
  }
  std::vector<int> qkv = q;
  qkv.insert(qkv.end(), k.begin(), k.end());
  qkv.insert(qkv.end(), v.begin(), v.end());
  const struct {
    TensorRole role;
    const std::vector<int>& rows;
    bool ba;
  } cases[] = {{TensorRole::kInProjQkv, qkv, false}, {TensorRole::kInProjZ, z, false}, {TensorRole::kInProjB, b, true}, {TensorRole::kInProjA, a, true}};
  for (const auto& c : cases)
    for (std::size_t i = 0; i < c.rows.size(); ++i) {
      const FusedRow f = fused_row(s, c.role, static_cast<int64_t>(i));
      EXPECT_EQ(f.ba, c.ba);
      EXPECT_EQ(f.row, c.rows[i]) << "role " << static_cast<int>(c.role) << " row " << i;
    }
  EXPECT_EQ(fused_qkvz_shape(s), (std::vector<int64_t>{nk * group, 8}));
  EXPECT_EQ(fused_ba_shape(s), (std::vector<int64_t>{2 * nk * r, 8}));
  EXPECT_THROW(fused_row(s, TensorRole::kInProjZ, nk * r * dv), Error);
  EXPECT_THROW(fused_row(s, TensorRole::kRouter, 0), Error);
}

// Each family's synthetic checkpoint binds from its own tensor names (a
// qwen3_next one holds only the fused projections), runs on the CPU
// reference, and its bf16 container gives the same logits; the container
// holds the split projections and no fused ones.
TEST(Families, SyntheticCheckpointsRunAndConvertExactly) {
  for (const ModelFamily f : {ModelFamily::kQwen3Moe, ModelFamily::kQwen3Next}) {
    SCOPED_TRACE(family_name(f));
    test::TempDir d;
    const SynthOptions so = small(f, 4);
    write_synthetic_checkpoint(d / "ck", so);
    auto ck = Model::load(d / "ck");
    const ModelSpec& s = ck->spec();
    EXPECT_EQ(s.family, f);
    EXPECT_EQ(s.num_attention_layers(), f == ModelFamily::kQwen3Moe ? 4 : 1);
    EXPECT_EQ(s.has_shared_expert(), f == ModelFamily::kQwen3Next);
    ConvertOptions co;
    co.experts = co.down = co.trunk = co.shared = co.lm_head = co.embed = co.router = QuantFormat::BF16;
    co.threads = 2;
    convert_checkpoint(d / "ck", d / "m.coli", co);
    auto ct = Model::load(d / "m.coli");
    Container c(d / "m.coli");
    bool fused = false, split = false;
    for (const Blob& bl : c.manifest().blobs)
      for (const auto& p : bl.parts) fused |= p.name.find("in_proj_qkvz") != std::string::npos, split |= p.name.find("in_proj_qkv.") != std::string::npos;
    EXPECT_FALSE(fused);
    EXPECT_EQ(split, f == ModelFamily::kQwen3Next);
    cpu::CpuBackend b1(*ck), b2(*ct);
    Engine e1(s, b1), e2(ct->spec(), b2);
    const std::vector<int> ids = {3, 141, 59, 26, 5, 35, 8, 97};
    Session s1 = e1.new_session(), s2 = e2.new_session();
    const std::vector<float> l1 = e1.forward(s1, ids), l2 = e2.forward(s2, ids);
    ASSERT_EQ(l1.size(), static_cast<std::size_t>(s.vocab_size));
    EXPECT_EQ(l1, l2);
    float range = 0;
    bool finite = true;
    for (float v : l1) range = std::max(range, std::fabs(v)), finite &= std::isfinite(v);
    EXPECT_TRUE(finite);
    EXPECT_GT(range, 0.0f);
    EXPECT_EQ(test::greedy_tokens(e1, ids, 6), test::greedy_tokens(e2, ids, 6));
  }
}

// The fast CPU backend (SIMD kernels, fused jobs, the one-token expert
// run) on each family's synthetic bf16 container against the reference
// backend on the same container: the same layers, only the kernels'
// summation order differs. (On int8 containers the fast path's int8
// activations move these random models' logits by 10-20 % of their range,
// qwen3_5_moe's as much as the others': the fixtures' goldens test that
// path.)
TEST(Families, FastCpuMatchesTheReference) {
  for (const ModelFamily f : {ModelFamily::kQwen35Moe, ModelFamily::kQwen3Moe, ModelFamily::kQwen3Next}) {
    SCOPED_TRACE(family_name(f));
    test::TempDir d;
    SynthOptions so = small(f, 4);
    so.hidden = 256, so.moe_inter = 64;  // VNNI rows of 256 columns
    ConvertOptions co;
    co.experts = co.down = co.trunk = co.shared = co.lm_head = co.embed = QuantFormat::BF16;
    co.threads = 2, co.verify = false;
    write_synthetic_container(d / "m.coli", so, co);
    auto m = Model::load(d / "m.coli");
    cpu::CpuBackend ref(*m), fast(*m, cpu::CpuOptions{2, true});
    Engine er(m->spec(), ref), ef(m->spec(), fast);
    std::vector<int> ids(20);
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int>((i * 71 + 5) % so.vocab);
    Session sr = er.new_session(), sf = ef.new_session();
    std::vector<float> lr = er.forward(sr, ids), lf = ef.forward(sf, ids);
    float err = 0, range = 0;
    for (int step = 0; step < 4; ++step) {
      for (std::size_t i = 0; i < lr.size(); ++i) err = std::max(err, std::fabs(lr[i] - lf[i])), range = std::max(range, std::fabs(lr[i]));
      const int next = static_cast<int>(std::max_element(lr.begin(), lr.end()) - lr.begin());
      lr = er.forward(sr, std::vector<int>{next}), lf = ef.forward(sf, std::vector<int>{next});
    }
    std::printf("[ info     ] %s: max |dlogit| fast vs reference %.2e of %.2e\n", family_name(f), err, range);
    EXPECT_GT(range, 0.0f);
    EXPECT_LT(err, 1e-3f * range);
  }
}

// The transformers fixtures (scripts/make_tiny_fixture_families.py, made on
// the GPU machine with transformers 5.17 in float32): tiny-qwen3moe (8
// attention layers, dense MLP layers 0, 2, 4, 5, 6, sparse 1, 3, 7, plain-w
// norms, no output gate or shared expert) and tiny-qwen3next (the
// DeltaNet / attention pattern, fused DeltaNet projections, a shared
// expert, an mtp.* tensor to ignore). Each prompt's last logits within 1e-3
// and its 16 greedy tokens, on the reference and fast CPU backends, from
// the checkpoint and from a bf16 container; an int8 container keeps the
// greedy tokens.
namespace {

void expect_family_goldens(const std::string& fixture) {
  const nlohmann::json& g = test::goldens_of(fixture);
  const std::string dir = test::data_dir() + "/" + fixture;
  auto ck = Model::load(dir);
  EXPECT_EQ(std::string(family_name(ck->spec().family)), g["model_type"].get<std::string>());
  cpu::CpuBackend ref(*ck), fast(*ck, cpu::CpuOptions{2, true});
  Engine er(ck->spec(), ref), ef(ck->spec(), fast);
  test::expect_golden_prompts(er, fixture + " reference: ", g);
  test::expect_golden_prompts(ef, fixture + " fast: ", g);
  test::TempDir d;
  ConvertOptions co;
  co.experts = co.down = co.trunk = co.shared = co.lm_head = co.embed = co.router = QuantFormat::BF16;
  co.threads = 2;
  convert_checkpoint(dir, d / "bf16.coli", co);
  auto b16 = Model::load(d / "bf16.coli");
  cpu::CpuBackend rb(*b16), fb(*b16, cpu::CpuOptions{2, true});
  Engine erb(b16->spec(), rb), efb(b16->spec(), fb);
  test::expect_golden_prompts(erb, fixture + " bf16 container: ", g);
  test::expect_golden_prompts(efb, fixture + " bf16 container, fast: ", g);
  auto i8 = test::convert_all(dir, d / "i8.coli", QuantFormat::I8);
  cpu::CpuBackend r8(*i8), f8(*i8, cpu::CpuOptions{2, true});
  Engine er8(i8->spec(), r8), ef8(i8->spec(), f8);
  for (const auto& p : g["prompts"]) {
    const std::vector<int> ids = p["ids"];
    EXPECT_EQ(test::greedy_tokens(er8, ids), p["greedy"].get<std::vector<int>>()) << fixture << " int8, prompt of " << ids.size();
    EXPECT_EQ(test::greedy_tokens(ef8, ids), p["greedy"].get<std::vector<int>>()) << fixture << " int8 fast, prompt of " << ids.size();
  }
}

}  // namespace

TEST(Families, Qwen3MoeFixtureMatchesTransformers) { expect_family_goldens("tiny-qwen3moe"); }
TEST(Families, Qwen3NextFixtureMatchesTransformers) { expect_family_goldens("tiny-qwen3next"); }
