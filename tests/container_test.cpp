// coli-convert's library: containers from the tiny fixtures, their outputs
// against the transformers goldens, and broken containers.
#include <gtest/gtest.h>

#include <xxhash.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "convert/convert.h"
#include "convert/synth.h"
#include "cpu_backend.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "formats/container.h"
#include "model/weights.h"
#include "engine_util.h"
#include "test_util.h"
#include "util/error.h"

using namespace coli;
namespace fs = std::filesystem;

namespace {

const nlohmann::json& goldens() { return test::tiny_goldens(); }
std::string fixture(const char* name) { return test::data_dir() + "/" + name; }

ConvertOptions all(QuantFormat experts, QuantFormat rest) {
  ConvertOptions o;
  o.experts = o.down = experts;
  o.trunk = o.shared = o.lm_head = rest;
  o.threads = 2;
  return o;
}

std::vector<int> greedy(const std::string& model_path, const std::vector<int>& ids) {
  auto m = Model::load(model_path);
  cpu::CpuBackend be(*m);
  Engine e(m->spec(), be);
  return test::greedy_tokens(e, ids);
}

std::string open_error(const std::string& path, std::optional<uint64_t> fp = std::nullopt) {
  try {
    Container c(path, fp);
    c.verify_checksums();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Container, Int8ContainerGivesTheGoldenGreedyTokens) {
  // Both naming layouts (per-expert text, fused multimodal) convert; the
  // int8 container reproduces transformers' 16 greedy tokens for every prompt.
  for (const char* src : {"tiny-qwen35moe-text", "tiny-qwen35moe-vl"}) {
    test::TempDir d;
    const auto rep = convert_checkpoint(fixture(src), d / "m.coli", all(QuantFormat::I8, QuantFormat::I8));
    EXPECT_GT(rep.bytes_out, 0u);
    for (const auto& p : goldens()["prompts"]) EXPECT_EQ(greedy(d / "m.coli", p["ids"]), p["greedy"].get<std::vector<int>>()) << src;
  }
}

TEST(Container, Bf16ContainerIsExact) {
  test::TempDir d;
  convert_checkpoint(fixture("tiny-qwen35moe-text"), d / "m.coli", all(QuantFormat::BF16, QuantFormat::BF16));
  auto a = Model::load(fixture("tiny-qwen35moe-text"));
  auto b = Model::load(d / "m.coli");
  cpu::CpuBackend ba(*a), bb(*b);
  Engine ea(a->spec(), ba), eb(b->spec(), bb);
  const std::vector<int> ids = goldens()["prompts"][2]["ids"];
  Session sa = ea.new_session(), sb = eb.new_session();
  EXPECT_EQ(ea.forward(sa, ids), eb.forward(sb, ids));
}

TEST(Container, ExpertsAreOneAlignedBlobEach) {
  test::TempDir d;
  convert_checkpoint(fixture("tiny-qwen35moe-text"), d / "m.coli", all(QuantFormat::I4_G64, QuantFormat::I8));
  Container c(d / "m.coli");
  int experts = 0;
  for (const auto& b : c.manifest().blobs) {
    EXPECT_EQ(b.offset % 4096, 0u);
    if (b.kind != "expert") continue;
    ++experts;
    ASSERT_EQ(b.parts.size(), 3u);
    EXPECT_EQ(b.parts[0].name, "model.layers." + std::to_string(b.layer) + ".mlp.experts." + std::to_string(b.expert) + ".gate_proj.weight");
    EXPECT_EQ(b.parts[2].format, QuantFormat::I4_G64);
    EXPECT_EQ(b.parts[0].offset, b.offset);
    EXPECT_EQ(b.parts[2].offset + b.parts[2].bytes, b.offset + b.bytes);  // the blob is exactly its parts
  }
  EXPECT_EQ(experts, 8 * 16);
}

TEST(Container, FingerprintNamesSourceAndSettings) {
  test::TempDir d;
  const auto a = convert_checkpoint(fixture("tiny-qwen35moe-text"), d / "a.coli", all(QuantFormat::I8, QuantFormat::I8));
  const auto b = convert_checkpoint(fixture("tiny-qwen35moe-text"), d / "b.coli", all(QuantFormat::I4_G64, QuantFormat::I8));
  const auto a2 = convert_checkpoint(fixture("tiny-qwen35moe-text"), d / "a2.coli", all(QuantFormat::I8, QuantFormat::I8));
  EXPECT_NE(a.fingerprint, b.fingerprint);
  EXPECT_EQ(a.fingerprint, a2.fingerprint);
  EXPECT_EQ(test::read_file(d / "a.coli"), test::read_file(d / "a2.coli"));  // deterministic output
  EXPECT_EQ(open_error(d / "a.coli", a.fingerprint), "");
  EXPECT_NE(open_error(d / "a.coli", b.fingerprint).find("does not match the expected"), std::string::npos);
}

TEST(Container, RefusesToOverwriteAndLeavesNothingOnFailure) {
  test::TempDir d;
  convert_checkpoint(fixture("tiny-qwen35moe-text"), d / "m.coli", all(QuantFormat::I8, QuantFormat::I8));
  const std::string before = test::read_file(d / "m.coli");
  try {
    convert_checkpoint(fixture("tiny-qwen35moe-text"), d / "m.coli", all(QuantFormat::I4_G32, QuantFormat::I8));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--force"), std::string::npos);
  }
  EXPECT_EQ(test::read_file(d / "m.coli"), before);
  // A source that fails to load: no output, no temporary file.
  test::TempDir bad;
  fs::copy_file(fixture("tiny-qwen35moe-text") + "/config.json", bad / "config.json");
  EXPECT_THROW(convert_checkpoint(bad.path(), d / "x.coli", all(QuantFormat::I8, QuantFormat::I8)), Error);
  int files = 0;
  for (const auto& e : fs::directory_iterator(d.path())) files += e.path().filename() != "m.coli";
  EXPECT_EQ(files, 0);
}

TEST(Container, BrokenContainersAreNamed) {
  test::TempDir d;
  convert_checkpoint(fixture("tiny-qwen35moe-text"), d / "m.coli", all(QuantFormat::I4_G32, QuantFormat::I8));
  const std::string good = test::read_file(d / "m.coli");
  ContainerHeader h;
  std::memcpy(&h, good.data(), sizeof h);
  // Truncated.
  test::write_file(d / "t.coli", good.substr(0, good.size() - 100));
  EXPECT_NE(open_error(d / "t.coli").find("truncated container"), std::string::npos);
  test::write_file(d / "t2.coli", good.substr(0, 100));
  EXPECT_NE(open_error(d / "t2.coli").find("truncated container"), std::string::npos);
  // Not a container.
  test::write_file(d / "n.coli", std::string(5000, 'x'));
  EXPECT_NE(open_error(d / "n.coli").find("bad magic"), std::string::npos);
  // A flipped byte in the manifest.
  std::string bad = good;
  bad[h.manifest_offset + 10] ^= 1;
  test::write_file(d / "c.coli", bad);
  EXPECT_NE(open_error(d / "c.coli").find("manifest checksum mismatch"), std::string::npos);
  // A flipped byte inside an expert's weights: found by the checksum pass.
  Container c(d / "m.coli");
  const Blob* ex = nullptr;
  for (const auto& b : c.manifest().blobs)
    if (b.kind == "expert" && b.layer == 5 && b.expert == 9) ex = &b;
  ASSERT_NE(ex, nullptr);
  bad = good;
  bad[ex->offset + 77] ^= 0x10;
  test::write_file(d / "e.coli", bad);
  EXPECT_NE(open_error(d / "e.coli").find("checksum mismatch in expert 9 of layer 5"), std::string::npos);
  // Another header layout version.
  bad = good;
  const uint32_t v2 = 2;
  std::memcpy(bad.data() + offsetof(ContainerHeader, version), &v2, 4);
  test::write_file(d / "v.coli", bad);
  EXPECT_NE(open_error(d / "v.coli").find("layout version 2; this build reads version 1"), std::string::npos);
  // A manifest of another version, with a valid checksum.
  auto m = nlohmann::json::parse(good.substr(h.manifest_offset));
  m["version"] = 2;
  const std::string mtext = m.dump();
  bad = good.substr(0, h.manifest_offset) + mtext;
  ContainerHeader h2 = h;
  h2.manifest_bytes = mtext.size();
  h2.file_bytes = bad.size();
  h2.manifest_xxh64 = XXH64(mtext.data(), mtext.size(), 0);
  std::memcpy(bad.data(), &h2, sizeof h2);
  test::write_file(d / "mv.coli", bad);
  EXPECT_NE(open_error(d / "mv.coli").find("manifest layout version 2"), std::string::npos);
}

TEST(Container, ManifestEntriesAreBoundsChecked) {
  const std::string base = R"({"version":1,"fingerprint":"0123456789abcdef","config":{},"blobs":[)";
  auto err = [&](const std::string& blobs) {
    try {
      parse_manifest(base + blobs + "]}", 1 << 20, "m");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string part = R"({"name":"w","format":"int8","shape":[2,3],"offset":4096,"bytes":72})";  // 2 rows of 16 code bytes, scales at 64
  EXPECT_EQ(err(R"({"kind":"tensor","offset":4096,"bytes":72,"xxh64":"0000000000000000","parts":[)" + part + "]}"), "");
  EXPECT_NE(err(R"({"kind":"tensor","offset":4095,"bytes":72,"xxh64":"0000000000000000","parts":[)" + part + "]}").find("aligned"), std::string::npos);
  EXPECT_NE(err(R"({"kind":"tensor","offset":1044480,"bytes":9000,"xxh64":"0000000000000000","parts":[]})").find("outside the data"), std::string::npos);
  EXPECT_NE(err(R"({"kind":"tensor","offset":4096,"bytes":50,"xxh64":"0000000000000000","parts":[)" + part + "]}").find("outside its blob"), std::string::npos);
  EXPECT_NE(err(R"({"kind":"tensor","offset":4096,"bytes":72,"xxh64":"0000000000000000","parts":[{"name":"w","format":"int8","shape":[2,3],"offset":4096,"bytes":99}]})")
                .find("do not match"),
            std::string::npos);
  EXPECT_NE(err(R"({"kind":"tensor","offset":4096,"bytes":72,"xxh64":"0000000000000000","parts":[{"name":"w","format":"int9","shape":[2,3],"offset":4096,"bytes":72}]})")
                .find("unknown format"),
            std::string::npos);
  EXPECT_NE(err(R"({"kind":"bogus","offset":4096,"bytes":1,"xxh64":"0000000000000000"})").find("unknown kind"), std::string::npos);
}

TEST(Synth, DeterministicLoadableAndSkewed) {
  SynthOptions o;
  o.layers = 4;
  o.seed = 3;
  o.routing_skew = 1.0;
  o.vocab = 300, o.hidden = 128, o.experts = 16, o.top_k = 2, o.moe_inter = 32, o.shared_inter = 32;
  o.heads = 2, o.kv_heads = 1, o.head_dim = 32, o.lin_k_heads = 2, o.lin_v_heads = 4, o.lin_k_dim = 16, o.lin_v_dim = 16;
  o.shard_bytes = 1 << 20;  // several shards
  test::TempDir d;
  o.threads = 1;
  const auto r1 = write_synthetic_checkpoint(d / "a", o);
  o.threads = 3;
  write_synthetic_checkpoint(d / "b", o);
  EXPECT_GT(r1.shards, 1);
  for (const auto& f : fs::directory_iterator(d / "a"))
    EXPECT_EQ(test::read_file(f.path().string()), test::read_file(d / "b/" + f.path().filename().string())) << f.path();
  // It loads, converts, and its routers favour experts by a Zipf-like law.
  auto m = Model::load(d / "a");
  cpu::CpuBackend be(*m);
  Engine e(m->spec(), be);
  std::vector<std::vector<int>> count(o.layers, std::vector<int>(o.experts));
  std::vector<int> ids(256);
  for (int i = 0; i < 256; ++i) ids[i] = (i * 37 + 11) % o.vocab;
  Session s = e.new_session();
  e.forward(s, ids, [&](int l, int T, const int* idx, const float*) {
    for (int i = 0; i < T * o.top_k; ++i) ++count[l][idx[i]];
  });
  for (int l = 0; l < o.layers; ++l) {
    std::vector<int> c = count[l];
    std::sort(c.rbegin(), c.rend());
    // Zipf(1): the most popular expert is picked far more than the median one.
    EXPECT_GT(c[0], 3 * std::max(1, c[o.experts / 2])) << "layer " << l;
  }
  convert_checkpoint(d / "a", d / "a.coli", all(QuantFormat::I4_G64, QuantFormat::I8));
  EXPECT_NO_THROW(Model::load(d / "a.coli"));
}
