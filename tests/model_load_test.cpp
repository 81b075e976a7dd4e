// Checkpoints that are wrong in one way each: the error names the problem.
#include <gtest/gtest.h>

#include <filesystem>

#include "formats/safetensors.h"
#include "model/weights.h"
#include "test_util.h"
#include "util/error.h"

using namespace coli;

namespace {

// Copies the tiny text fixture into `dir`, passing each tensor through `edit`
// (which may drop it by returning false), then appending `extra`.
void write_variant(const std::string& dir, const std::function<bool(test::RawTensor&)>& edit,
                   const std::vector<test::RawTensor>& extra = {}) {
  const std::string src = test::data_dir() + "/tiny-qwen35moe-text";
  std::filesystem::copy_file(src + "/config.json", dir + "/config.json");
  SafetensorsFile f(src + "/model.safetensors");
  std::vector<test::RawTensor> ts;
  for (const auto& [name, t] : f.tensors()) {
    test::RawTensor r{name, dtype_name(t.dtype), t.shape, std::string(reinterpret_cast<const char*>(t.data), t.nbytes)};
    if (edit(r)) ts.push_back(r);
  }
  ts.insert(ts.end(), extra.begin(), extra.end());
  test::write_file(dir + "/model.safetensors", test::safetensors_bytes(ts));
}

std::string load_error(const std::string& dir) {
  try {
    Model::load(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(ModelLoad, UnchangedCopyLoads) {
  test::TempDir d;
  write_variant(d.path(), [](test::RawTensor&) { return true; });
  EXPECT_EQ(load_error(d.path()), "");
}

TEST(ModelLoad, MissingTensorIsNamed) {
  test::TempDir d;
  write_variant(d.path(), [](test::RawTensor& t) { return t.name != "model.layers.5.linear_attn.A_log"; });
  const std::string e = load_error(d.path());
  EXPECT_NE(e.find("missing tensor 'model.layers.5.linear_attn.A_log'"), std::string::npos) << e;
}

TEST(ModelLoad, MissingExpertIsNamed) {
  test::TempDir d;
  write_variant(d.path(), [](test::RawTensor& t) { return t.name != "model.layers.2.mlp.experts.9.up_proj.weight"; });
  EXPECT_NE(load_error(d.path()).find("'model.layers.2.mlp.experts.9.up_proj.weight'"), std::string::npos);
}

TEST(ModelLoad, WrongShapeIsNamed) {
  test::TempDir d;
  write_variant(d.path(), [](test::RawTensor& t) {
    if (t.name == "model.layers.3.self_attn.q_norm.weight") {
      t.shape = {16, 2};  // same bytes, wrong shape
    }
    return true;
  });
  const std::string e = load_error(d.path());
  EXPECT_NE(e.find("'model.layers.3.self_attn.q_norm.weight' has shape [16, 2], expected [32]"), std::string::npos) << e;
}

TEST(ModelLoad, UnknownTensorIsNamedButMtpAndVisualAreIgnored) {
  test::TempDir d;
  write_variant(d.path(), [](test::RawTensor&) { return true; },
                {{"model.layers.0.mlp.mystery.weight", "F32", {1}, std::string(4, '\0')}});
  EXPECT_NE(load_error(d.path()).find("unknown tensor 'model.layers.0.mlp.mystery.weight'"), std::string::npos);
  test::TempDir d2;
  write_variant(d2.path(), [](test::RawTensor&) { return true; },
                {{"mtp.fc.weight", "F32", {1}, std::string(4, '\0')}, {"model.visual.blocks.0.x", "F32", {1}, std::string(4, '\0')}});
  EXPECT_EQ(load_error(d2.path()), "");
}

TEST(ModelLoad, TruncatedCheckpointIsNamed) {
  test::TempDir d;
  write_variant(d.path(), [](test::RawTensor&) { return true; });
  const std::string path = d / "model.safetensors";
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 1000);
  const std::string e = load_error(d.path());
  EXPECT_NE(e.find("model.safetensors: truncated"), std::string::npos) << e;
}

TEST(ModelLoad, UnsupportedDtypeIsNamed) {
  test::TempDir d;
  write_variant(d.path(), [](test::RawTensor& t) {
    if (t.name == "model.layers.0.mlp.gate.weight") {
      t.dtype = "I16";
    }
    return true;
  });
  const std::string e = load_error(d.path());
  EXPECT_NE(e.find("'model.layers.0.mlp.gate.weight' has dtype I16"), std::string::npos) << e;
}
