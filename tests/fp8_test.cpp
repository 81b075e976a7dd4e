// Block-scaled fp8 (e4m3, 128 x 128 blocks, as Qwen publishes FP8
// checkpoints): a tiny fp8 checkpoint is made from the fixture here, then
// loaded, run and converted.
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "convert/convert.h"
#include "cpu_backend.h"
#include "engine/engine.h"
#include "eval/compare.h"
#include "formats/safetensors.h"
#include "model/weights.h"
#include "quant/format.h"
#include "convert/synth.h"
#include "model/fused_projections.h"
#include "test_util.h"
#include "util/error.h"

using namespace coli;

namespace {

uint8_t to_e4m3(float x) {  // nearest code by search: independent of the decoder's arithmetic
  static std::vector<float> table = [] {
    std::vector<float> t(256);
    for (int i = 0; i < 256; ++i) t[i] = fp8_e4m3_to_f32(static_cast<uint8_t>(i));
    return t;
  }();
  int best = 0;
  for (int i = 0; i < 256; ++i)
    if (!std::isnan(table[i]) && std::fabs(table[i] - x) < std::fabs(table[best] - x)) best = i;
  return static_cast<uint8_t>(best);
}

// A 2-D tensor as fp8 e4m3 codes with f32 scale_inv per 128 x 128 block
// (amax / 448, as Qwen's FP8 checkpoints): the codes and the scale tensor.
void fp8_tensors(const std::string& name, const TensorView& t, std::vector<test::RawTensor>& out) {
  const int64_t R = t.shape[0], C = t.shape[1], br = (R + 127) / 128, bc = (C + 127) / 128;
  std::vector<float> w(R * C), scale(br * bc);
  to_f32(t.dtype, t.data, w.size(), w.data());
  std::string codes(R * C, '\0');
  for (int64_t i = 0; i < br; ++i)
    for (int64_t j = 0; j < bc; ++j) {
      float amax = 0;
      for (int64_t r = i * 128; r < std::min(R, (i + 1) * 128); ++r)
        for (int64_t c = j * 128; c < std::min(C, (j + 1) * 128); ++c) amax = std::max(amax, std::fabs(w[r * C + c]));
      const float sc = amax > 0 ? amax / 448.0f : 1.0f;
      scale[i * bc + j] = sc;
      for (int64_t r = i * 128; r < std::min(R, (i + 1) * 128); ++r)
        for (int64_t c = j * 128; c < std::min(C, (j + 1) * 128); ++c) codes[r * C + c] = static_cast<char>(to_e4m3(w[r * C + c] / sc));
    }
  out.push_back({name, "F8_E4M3", t.shape, codes});
  out.push_back({name + "_scale_inv", "F32", {br, bc}, test::pod_bytes(scale)});
}

// Writes DIR: the text fixture with every 2-D projection (not embeddings,
// norms or the router) stored as fp8 with f32 scale_inv blocks.
void make_fp8_checkpoint(const std::string& dir) {
  const std::string src = test::data_dir() + "/tiny-qwen35moe-text";
  auto cfg = nlohmann::json::parse(test::read_file(src + "/config.json"));
  cfg["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}}, {"activation_scheme", "dynamic"}};
  test::write_file(dir + "/config.json", cfg.dump());
  SafetensorsFile f(src + "/model.safetensors");
  std::vector<test::RawTensor> out;
  for (const auto& [name, t] : f.tensors()) {
    const bool fp8 = t.shape.size() == 2 && name.find("embed") == std::string::npos && name.find("mlp.gate.") == std::string::npos &&
                     name.find("shared_expert_gate") == std::string::npos;
    if (!fp8) {
      out.push_back({name, dtype_name(t.dtype), t.shape, std::string(reinterpret_cast<const char*>(t.data), t.nbytes)});
      continue;
    }
    fp8_tensors(name, t, out);
  }
  test::write_file(dir + "/model.safetensors", test::safetensors_bytes(out));
}

}  // namespace

TEST(Fp8, LoadsDequantizesAndConverts) {
  test::TempDir d;
  std::filesystem::create_directory(d / "fp8");
  make_fp8_checkpoint(d / "fp8");
  auto m = Model::load(d / "fp8");
  const Matrix& q = m->layer(3).attn.q_proj;
  ASSERT_EQ(q.format, QuantFormat::FP8_E4M3_B128);
  // A weight decodes to code * scale_inv of its block.
  SafetensorsFile f(d / "fp8/model.safetensors");
  const TensorView* codes = f.find("model.layers.3.self_attn.q_proj.weight");
  const TensorView* scales = f.find("model.layers.3.self_attn.q_proj.weight_scale_inv");
  ASSERT_TRUE(codes && scales);
  std::vector<float> row(q.cols);
  q.row_f32(200, row.data());  // row block 1
  const float* s = reinterpret_cast<const float*>(scales->data);
  for (int c = 0; c < q.cols; ++c) ASSERT_EQ(row[c], fp8_e4m3_to_f32(codes->data[200 * q.cols + c]) * s[1 * 1 + 0]);
  // It runs close to the bf16 model, and converts to a container.
  auto ref = Model::load(test::data_dir() + "/tiny-qwen35moe-text");
  cpu::CpuBackend ba(*ref), bb(*m);
  Engine ea(ref->spec(), ba), eb(m->spec(), bb);
  const auto r = compare_outputs(ea, eb, random_sequences(4, 32, ref->spec().vocab_size, 1));
  std::printf("[ info     ] fp8 checkpoint vs bf16: mean KL %.3g, top-1 %.1f %%\n", r.mean_kl, 100 * r.top1_agree);
  EXPECT_GT(r.top1_agree, 0.8);
  ConvertOptions o;
  o.threads = 2;
  convert_checkpoint(d / "fp8", d / "fp8.coli", o);
  EXPECT_NO_THROW(Model::load(d / "fp8.coli"));
  // An fp8 weight without its scales is named.
  std::vector<test::RawTensor> ts;
  for (const auto& [name, t] : f.tensors())
    if (name != "model.layers.3.self_attn.q_proj.weight_scale_inv") ts.push_back({name, dtype_name(t.dtype), t.shape, std::string(reinterpret_cast<const char*>(t.data), t.nbytes)});
  std::filesystem::create_directory(d / "bad");
  std::filesystem::copy_file(d / "fp8/config.json", d / "bad/config.json");
  test::write_file(d / "bad/model.safetensors", test::safetensors_bytes(ts));
  try {
    Model::load(d / "bad");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no 'model.layers.3.self_attn.q_proj.weight_scale_inv'"), std::string::npos) << e.what();
  }
}

// qwen3_next's fused DeltaNet projections in block-scaled fp8 (Qwen3-Next's
// FP8 release quantizes them): a synthetic qwen3_next checkpoint with 128-wide
// DeltaNet heads, its fused in_proj_qkvz / in_proj_ba stored as fp8, binds
// into the split projections with every row's codes and its block's scale
// (each split row decodes to its fused row, fused_row, bit for bit), runs,
// and converts. Heads of 16 rows do not align with the 128-row scale
// blocks: named.
TEST(Fp8, FusedDeltaNetProjectionsSplitWithTheirScales) {
  test::TempDir d;
  SynthOptions so = synth_shapes(SynthOptions{}, ModelFamily::kQwen3Next);
  so.layers = 1, so.vocab = 300, so.hidden = 256, so.experts = 8, so.top_k = 2, so.moe_inter = 32, so.shared_inter = 32;
  so.heads = 2, so.kv_heads = 1, so.head_dim = 32, so.lin_k_heads = 2, so.lin_v_heads = 4, so.lin_k_dim = 128, so.lin_v_dim = 128;
  write_synthetic_checkpoint(d / "ck", so);
  auto quantize_fused = [&](const std::string& in, const std::string& out) {
    SafetensorsArchive f(in);  // the synthetic checkpoint's shards
    std::vector<test::RawTensor> ts;
    for (const std::string& name : f.names()) {
      const TensorView& t = *f.find(name);
      if (name.find("in_proj_qkvz") == std::string::npos && name.find("in_proj_ba") == std::string::npos) {
        ts.push_back({name, dtype_name(t.dtype), t.shape, std::string(reinterpret_cast<const char*>(t.data), t.nbytes)});
        continue;
      }
      fp8_tensors(name, t, ts);
    }
    std::filesystem::create_directory(out);
    std::filesystem::copy_file(in + "/config.json", out + "/config.json");
    test::write_file(out + "/model.safetensors", test::safetensors_bytes(ts));
  };
  quantize_fused(d / "ck", d / "fp8");
  auto m = Model::load(d / "fp8");
  const ModelSpec& s = m->spec();
  const DeltaNetWeights& g = m->layer(0).gdn;
  SafetensorsFile f(d / "fp8/model.safetensors");
  for (const auto& [role, mat] : {std::pair{TensorRole::kInProjQkv, &g.in_proj_qkv}, {TensorRole::kInProjZ, &g.in_proj_z},
                                  {TensorRole::kInProjB, &g.in_proj_b}, {TensorRole::kInProjA, &g.in_proj_a}}) {
    ASSERT_EQ(mat->format, QuantFormat::FP8_E4M3_B128);
    const bool ba = fused_row(s, role, 0).ba;
    const TensorView* codes = f.find(std::string("model.layers.0.") + (ba ? kFusedBa : kFusedQkvz));
    const TensorView* sc = f.find(std::string("model.layers.0.") + (ba ? kFusedBa : kFusedQkvz) + "_scale_inv");
    ASSERT_TRUE(codes && sc);
    const float* scale = reinterpret_cast<const float*>(sc->data);
    const int64_t C = mat->cols, bc = (C + 127) / 128;
    std::vector<float> row(C);
    for (int64_t r = 0; r < mat->rows; ++r) {
      mat->row_f32(r, row.data());
      const int64_t fr = fused_row(s, role, r).row;
      for (int64_t c = 0; c < C; ++c)
        ASSERT_EQ(row[c], fp8_e4m3_to_f32(codes->data[fr * C + c]) * scale[(fr / 128) * bc + c / 128]) << "role " << static_cast<int>(role) << " row " << r;
    }
  }
  cpu::CpuBackend b(*m);
  Engine e(s, b);
  Session ss = e.new_session();
  const std::vector<float> l = e.forward(ss, std::vector<int>{1, 2, 3});
  EXPECT_TRUE(std::all_of(l.begin(), l.end(), [](float v) { return std::isfinite(v); }));
  ConvertOptions o;
  o.threads = 2;
  convert_checkpoint(d / "fp8", d / "fp8.coli", o);
  EXPECT_NO_THROW(Model::load(d / "fp8.coli"));
  // 16-row heads: a 128-row scale block spans several head groups.
  SynthOptions narrow = so;
  narrow.lin_k_dim = 16, narrow.lin_v_dim = 16;
  write_synthetic_checkpoint(d / "ck16", narrow);
  quantize_fused(d / "ck16", d / "fp8-16");
  try {
    Model::load(d / "fp8-16");
    FAIL();
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("scale blocks do not follow the DeltaNet head groups"), std::string::npos) << err.what();
  }
}
