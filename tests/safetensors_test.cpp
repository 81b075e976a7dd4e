#include "formats/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>

#include "test_util.h"
#include "util/error.h"

using namespace coli;
using coli::test::RawTensor;
using coli::test::TempDir;

namespace {

std::string err_of(const std::string& path) {
  try {
    SafetensorsFile f(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(DType, Bf16AndF16DecodeExactly) {
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0xc040), -3.0f);
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc500), -5.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_TRUE(std::isinf(f16_to_f32(0x7c00)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7e00)));
  // bf16 round trip of every finite bf16 value is exact.
  for (uint32_t h = 0; h < 0x10000; h += 7) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    if (std::isfinite(f)) {
      ASSERT_EQ(f32_to_bf16(f), h);
    }
  }
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);  // halfway: rounds to even
}

TEST(Safetensors, ReadsTensorsAndShapes) {
  TempDir d;
  std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};
  std::vector<uint16_t> b = {0x3f80, 0x4000, 0xbf80};
  test::write_file(d / "x.safetensors", test::safetensors_bytes({{"a", "F32", {2, 3}, test::pod_bytes(a)},
                                                                 {"b.weight", "BF16", {3}, test::pod_bytes(b)}}));
  SafetensorsFile f(d / "x.safetensors");
  ASSERT_EQ(f.tensors().size(), 2u);
  const TensorView* ta = f.find("a");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ta->dtype, DType::F32);
  std::vector<float> got(6);
  to_f32(ta->dtype, ta->data, 6, got.data());
  EXPECT_EQ(got, a);
  const TensorView* tb = f.find("b.weight");
  ASSERT_NE(tb, nullptr);
  to_f32(tb->dtype, tb->data, 3, got.data());
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_EQ(got[1], 2.0f);
  EXPECT_EQ(got[2], -1.0f);
  EXPECT_EQ(f.find("c"), nullptr);
}

TEST(Safetensors, TruncatedFileNamesTheFile) {
  TempDir d;
  std::vector<float> a(100, 1.0f);
  std::string bytes = test::safetensors_bytes({{"big", "F32", {100}, test::pod_bytes(a)}});
  test::write_file(d / "t.safetensors", bytes.substr(0, bytes.size() - 10));
  const std::string e = err_of(d / "t.safetensors");
  EXPECT_NE(e.find("t.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  EXPECT_NE(e.find("big"), std::string::npos) << e;
  // Cut inside the header and before the length, too.
  test::write_file(d / "t2.safetensors", bytes.substr(0, 20));
  EXPECT_NE(err_of(d / "t2.safetensors").find("truncated"), std::string::npos);
  test::write_file(d / "t3.safetensors", bytes.substr(0, 5));
  EXPECT_NE(err_of(d / "t3.safetensors").find("truncated"), std::string::npos);
  test::write_file(d / "t4.safetensors", "");
  EXPECT_NE(err_of(d / "t4.safetensors").find("truncated"), std::string::npos);
}

TEST(Safetensors, CorruptHeaderIsRejected) {
  TempDir d;
  auto with_header = [&](const std::string& h, const std::string& data) {
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(uint64_t(h.size()) >> (8 * i));
    test::write_file(d / "c.safetensors", out + h + data);
    return err_of(d / "c.safetensors");
  };
  EXPECT_NE(with_header("{not json", "").find("corrupt safetensors header"), std::string::npos);
  EXPECT_NE(with_header("[1,2]", "").find("not a JSON object"), std::string::npos);
  EXPECT_NE(with_header(R"({"w":{"dtype":"Q9","shape":[1],"data_offsets":[0,4]}})", "abcd").find("unknown dtype"), std::string::npos);
  EXPECT_NE(with_header(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "abcd").find("needs 8"), std::string::npos);
  EXPECT_NE(with_header(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "abcd").find("negative"), std::string::npos);
  EXPECT_NE(with_header(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", "abcd").find("begin > end"), std::string::npos);
  EXPECT_NE(with_header(R"({"w":{"dtype":"F32","shape":[1]}})", "abcd").find("data_offsets"), std::string::npos);
  EXPECT_NE(with_header(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,4]}})", "abcd").find("overflow"),
            std::string::npos);
  // Header length larger than the file.
  std::string huge(8, '\0');
  huge[0] = '\x10';
  huge[1] = '\x27';
  test::write_file(d / "h.safetensors", huge + "{}");
  EXPECT_NE(err_of(d / "h.safetensors").find("exceeds file size"), std::string::npos);
}

TEST(Safetensors, ShardedArchiveFollowsTheIndex) {
  TempDir d;
  std::vector<float> a = {1, 2}, b = {3};
  test::write_file(d / "s1.safetensors", test::safetensors_bytes({{"a", "F32", {2}, test::pod_bytes(a)}}));
  test::write_file(d / "s2.safetensors", test::safetensors_bytes({{"b", "F32", {1}, test::pod_bytes(b)}}));
  test::write_file(d / "model.safetensors.index.json", R"({"metadata":{},"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})");
  SafetensorsArchive arc(d.path());
  ASSERT_NE(arc.find("a"), nullptr);
  ASSERT_NE(arc.find("b"), nullptr);
  EXPECT_EQ(arc.names(), (std::vector<std::string>{"a", "b"}));
  // An index entry whose shard lacks the tensor is an error naming it.
  test::write_file(d / "model.safetensors.index.json", R"({"weight_map":{"a":"s1.safetensors","zz":"s2.safetensors"}})");
  try {
    SafetensorsArchive bad(d.path());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'zz'"), std::string::npos) << e.what();
  }
  // A shard path leaving the directory is refused.
  test::write_file(d / "model.safetensors.index.json", R"({"weight_map":{"a":"../s1.safetensors"}})");
  EXPECT_THROW(SafetensorsArchive x(d.path()), Error);
}
