// The tensor table (model/layer_tensors.h) against what walks it: real
// checkpoints, bound models, containers, the synthetic writer, compare.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <map>

#include "convert/convert.h"
#include "convert/synth.h"
#include "eval/compare.h"
#include "formats/container.h"
#include "formats/safetensors.h"
#include "model/checkpoint_source.h"
#include "model/layer_tensors.h"
#include "model/weights.h"
#include "test_util.h"

using namespace coli;

namespace {

using Shapes = std::map<std::string, std::vector<int64_t>>;

// The table for spec, by name; a name listed twice fails the test.
Shapes table_of(const ModelSpec& spec, ExpertLayout layout) {
  std::vector<TensorDesc> all = model_tensors(spec, true);
  for (int l = 0; l < spec.num_layers; ++l) {
    const auto layer = layer_tensors(spec, l, layout);
    all.insert(all.end(), layer.begin(), layer.end());
  }
  Shapes out;
  for (const TensorDesc& t : all) EXPECT_TRUE(out.emplace(t.name, t.shape).second) << t.name << " is listed twice";
  return out;
}

// The checkpoint's tensors the model reads (canonical names), with shapes.
Shapes checkpoint_of(const std::string& dir) {
  const ModelSpec spec = load_model_spec(dir);
  CheckpointSource src(dir, spec.tensor_prefix);
  Shapes out;
  for (const std::string& n : src.names())
    if (!is_ignored_tensor(n)) out.emplace(n, src.find(n)->shape);
  return out;
}

void expect_table_is_checkpoint(const std::string& dir, ExpertLayout layout) {
  const Shapes table = table_of(load_model_spec(dir), layout), ckpt = checkpoint_of(dir);
  for (const auto& [name, shape] : ckpt) {
    const auto it = table.find(name);
    if (it == table.end()) ADD_FAILURE() << name << " is in the checkpoint, not in the table";
    else EXPECT_EQ(it->second, shape) << name;
  }
  for (const auto& [name, shape] : table) EXPECT_TRUE(ckpt.count(name)) << name << " is in the table, not in the checkpoint";
}

// Copies the tiny text fixture into dir with element 0 of tensor `name`
// set to 10 (the fixture's weights are ~0.06).
void write_perturbed_copy(const std::string& dir, const std::string& name) {
  const std::string src = test::data_dir() + "/tiny-qwen35moe-text";
  std::filesystem::copy_file(src + "/config.json", dir + "/config.json");
  SafetensorsFile f(src + "/model.safetensors");
  ASSERT_NE(f.find(name), nullptr) << name;
  std::vector<test::RawTensor> ts;
  for (const auto& [n, t] : f.tensors()) {
    test::RawTensor r{n, dtype_name(t.dtype), t.shape, std::string(reinterpret_cast<const char*>(t.data), t.nbytes)};
    ASSERT_EQ(r.dtype, "BF16");
    if (n == name) r.bytes[0] = '\x20', r.bytes[1] = '\x41';  // bf16 0x4120 = 10.0
    ts.push_back(r);
  }
  test::write_file(dir + "/model.safetensors", test::safetensors_bytes(ts));
}

}  // namespace

TEST(LayerTensors, TableIsTheTextFixturesTensors) {
  expect_table_is_checkpoint(test::data_dir() + "/tiny-qwen35moe-text", ExpertLayout::kPerExpert);
}

TEST(LayerTensors, TableIsTheMultimodalFixturesTextTensors) {
  expect_table_is_checkpoint(test::data_dir() + "/tiny-qwen35moe-vl", ExpertLayout::kStacked);
}

TEST(LayerTensors, SyntheticCheckpointHoldsExactlyTheTable) {
  test::TempDir d;
  SynthOptions o;
  o.layers = 4, o.threads = 2;
  o.vocab = 256, o.hidden = 64, o.experts = 4, o.top_k = 2, o.moe_inter = 32, o.shared_inter = 48;
  o.heads = 2, o.kv_heads = 1, o.head_dim = 32, o.lin_k_heads = 2, o.lin_v_heads = 4, o.lin_k_dim = 16, o.lin_v_dim = 16;
  write_synthetic_checkpoint(d / "synth", o);
  expect_table_is_checkpoint(d / "synth", ExpertLayout::kPerExpert);
}

TEST(LayerTensors, TiedLmHeadIsNotListed) {
  ModelSpec spec = load_model_spec(test::data_dir() + "/tiny-qwen35moe-text");
  for (const TensorDesc& t : model_tensors(spec, false)) EXPECT_NE(t.role, TensorRole::kLmHead);
  EXPECT_EQ(model_tensors(spec, true).size(), model_tensors(spec, false).size() + 1);
}

TEST(LayerTensors, BoundModelsHoldEveryEntryAtItsShape) {
  for (const char* fixture : {"tiny-qwen35moe-text", "tiny-qwen35moe-vl"}) {
    const auto m = Model::load(test::data_dir() + "/" + fixture);
    const auto ts = tensors_of(*m);
    // outer; per layer 2 norms, router, shared expert (3) and its gate, 16 experts (3); 6 DeltaNet (9); 2 attention (6)
    EXPECT_EQ(ts.size(), 3u + 8u * (2u + 5u + 16u * 3u) + 6u * 9u + 2u * 6u) << fixture;
    for (const TensorDesc& t : ts) {
      if (t.form == TensorForm::kMatrix) {
        const Matrix& x = matrix_of(*m, t);
        EXPECT_EQ((std::vector<int64_t>{x.rows, x.cols}), t.shape) << fixture << " " << t.name;
        EXPECT_NE(x.data, nullptr) << t.name;
      } else {
        int64_t n = 1;
        for (int64_t s : t.shape) n *= s;
        EXPECT_EQ(int64_t(vector_of(*m, t).size()), n) << fixture << " " << t.name;
      }
    }
  }
}

// Every blob of a container is one table entry, in table order: a tensor
// blob per non-expert entry, an expert blob holding an expert's parts.
TEST(LayerTensors, ContainerBlobsAreTheTablesEntries) {
  test::TempDir d;
  ConvertOptions opt;
  opt.threads = 2, opt.verify = false;
  opt.experts = QuantFormat::I8, opt.trunk = QuantFormat::BF16, opt.shared = QuantFormat::F16;
  const std::string src = test::data_dir() + "/tiny-qwen35moe-text";
  convert_checkpoint(src, d / "m.coli", opt);
  const Container c(d / "m.coli");
  const auto ts = tensors_of(*Model::load(src));
  std::size_t next = 0;
  for (const Blob& b : c.manifest().blobs) {
    if (b.kind == "file") continue;
    ASSERT_LT(next, ts.size()) << "blob beyond the table";
    const TensorDesc& t = ts[next];
    EXPECT_EQ(b.kind, t.expert < 0 ? "tensor" : "expert") << t.name;
    for (const BlobPart& p : b.parts) {
      ASSERT_LT(next, ts.size());
      const TensorDesc& e = ts[next++];
      EXPECT_EQ(p.name, e.name);
      EXPECT_EQ(p.shape, e.shape) << e.name;
      EXPECT_EQ(p.format, opt.format_of(e.cls)) << e.name;
      if (b.kind == "expert") {
        EXPECT_EQ(std::make_pair(b.layer, b.expert), std::make_pair(e.layer, e.expert)) << e.name;
      }
    }
  }
  EXPECT_EQ(next, ts.size()) << "table entries without a blob";
}

// weights_rel_rmse covers every matrix: a change to any one of them shows.
class CompareCovers : public testing::TestWithParam<const char*> {};

TEST_P(CompareCovers, AChangeToThisMatrix) {
  test::TempDir d;
  write_perturbed_copy(d.path(), GetParam());
  const auto ref = Model::load(test::data_dir() + "/tiny-qwen35moe-text");
  const auto changed = Model::load(d.path());
  EXPECT_EQ(weights_rel_rmse(*ref, *ref), 0.0);
  EXPECT_GT(weights_rel_rmse(*ref, *changed), 0.0) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(LayerTensors, CompareCovers,
                         testing::Values("model.embed_tokens.weight", "lm_head.weight", "model.layers.0.mlp.gate.weight",
                                         "model.layers.3.mlp.shared_expert_gate.weight", "model.layers.3.mlp.shared_expert.gate_proj.weight",
                                         "model.layers.0.linear_attn.out_proj.weight", "model.layers.7.mlp.experts.15.down_proj.weight"));
