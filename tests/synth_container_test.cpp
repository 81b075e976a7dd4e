// coli-convert synth straight into a container (issue 16 item 7): the file
// must be byte for byte the one 'synth -o DIR' then 'coli-convert DIR'
// gives with the same options: fingerprint, config, embedded files and
// every blob. Compared at shrunk shapes (SynthOptions' test-only shape
// fields; the real shapes are 1.8 GB of bf16 a layer) for several option
// sets, plus the command line's flag checks, which fail before any work.
#include <gtest/gtest.h>

#include <filesystem>

#include "convert/convert.h"
#include "convert/synth.h"
#include "formats/container.h"
#include "test_util.h"
#include "util/error.h"

namespace {

namespace fs = std::filesystem;
using coli::test::run_command;
using coli::test::TempDir;

coli::SynthOptions small_synth(int layers) {
  coli::SynthOptions o;
  o.layers = layers;
  o.vocab = 300, o.hidden = 128, o.experts = 8, o.top_k = 2, o.moe_inter = 32, o.shared_inter = 48;
  o.heads = 2, o.kv_heads = 1, o.head_dim = 32, o.lin_k_heads = 2, o.lin_v_heads = 4, o.lin_k_dim = 16, o.lin_v_dim = 16;
  o.shard_bytes = 1 << 20;  // several shards
  return o;
}

// synth to a checkpoint then convert, and synth straight to a container:
// the two files (with different thread counts, so the order work is done
// in cannot matter either).
void expect_same_container(const coli::SynthOptions& so, coli::ConvertOptions co) {
  TempDir d;
  coli::SynthOptions so1 = so;
  so1.threads = 3;
  coli::write_synthetic_checkpoint(d / "ck", so1);
  co.threads = 3;
  const auto a = coli::convert_checkpoint(d / "ck", d / "a.coli", co);
  co.threads = 2;
  const auto b = coli::write_synthetic_container(d / "b.coli", so, co);
  EXPECT_EQ(a.fingerprint, b.fingerprint);
  EXPECT_EQ(a.bytes_in, b.bytes_in);
  EXPECT_EQ(a.bytes_out, b.bytes_out);
  EXPECT_EQ(a.blobs, b.blobs);
  const std::string fa = coli::test::read_file(d / "a.coli"), fb = coli::test::read_file(d / "b.coli");
  ASSERT_EQ(fa.size(), fb.size());
  std::size_t first = 0;
  while (first < fa.size() && fa[first] == fb[first]) ++first;
  EXPECT_EQ(first, fa.size()) << "first difference at byte " << first << " of " << fa.size();
  // It is a model, not only a file: it verifies and binds.
  coli::Container c(d / "b.coli", a.fingerprint);
  EXPECT_NO_THROW(c.verify_checksums());
}

coli::ConvertOptions formats(coli::QuantFormat experts, coli::QuantFormat trunk) {
  coli::ConvertOptions o;
  o.experts = o.down = experts;
  o.trunk = o.shared = trunk;
  return o;
}

}  // namespace

TEST(SynthContainer, SameBytesAsSynthThenConvertDefaults) { expect_same_container(small_synth(4), coli::ConvertOptions{}); }

TEST(SynthContainer, SameBytesWithSkewSeedTokenizerAndOtherFormats) {
  coli::SynthOptions so = small_synth(5);
  so.seed = 7;
  so.routing_skew = 1.0;
  so.tokenizer_dir = coli::test::data_dir() + "/qwen3-tokenizer";
  coli::ConvertOptions co = formats(coli::QuantFormat::I8, coli::QuantFormat::BF16);
  co.down = coli::QuantFormat::I4_G32;
  co.lm_head = coli::QuantFormat::I4_G64;
  co.embed = coli::QuantFormat::I8;
  co.router = coli::QuantFormat::F32;
  expect_same_container(so, co);
}

TEST(SynthContainer, EmbedsConfigAndTokenizerAndRecordsSource) {
  TempDir d;
  coli::SynthOptions so = small_synth(1);
  so.tokenizer_dir = coli::test::data_dir() + "/tiny-tokenizer";
  coli::ConvertOptions co;
  co.verify = false;
  coli::write_synthetic_container(d / "m.coli", so, co);
  coli::Container c(d / "m.coli");
  EXPECT_TRUE(c.config_json().find("coli_synthetic") != std::string::npos);
  EXPECT_EQ(c.manifest().settings.at("source"), coli::kSyntheticSourceName);
  ASSERT_TRUE(c.file("tokenizer.json"));
  EXPECT_EQ(std::string(*c.file("tokenizer.json")), coli::test::read_file(so.tokenizer_dir + "/tokenizer.json"));
  EXPECT_TRUE(c.file("generation_config.json"));
  // An existing output is refused without overwrite, and kept.
  const std::string before = coli::test::read_file(d / "m.coli");
  so.seed = 1;
  EXPECT_THROW(coli::write_synthetic_container(d / "m.coli", so, co), coli::Error);
  EXPECT_EQ(coli::test::read_file(d / "m.coli"), before);
}

TEST(SynthContainer, BadOptionsNameTheFlag) {
  TempDir d;
  coli::SynthOptions so = small_synth(1);
  so.tokenizer_dir = d / "nowhere";
  try {
    coli::write_synthetic_container(d / "m.coli", so, coli::ConvertOptions{});
    FAIL() << "no error";
  } catch (const coli::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--tokenizer " + d / "nowhere"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(d / "m.coli"));
}

// The command line: a container by a .coli name or --container; format
// flags without one are a usage error (exit 2) naming the flag.
TEST(SynthContainer, CommandLineFlags) {
  TempDir d;
  const std::string cc = coli::test::bin_dir() + "/coli-convert";
  std::string out;
  EXPECT_EQ(run_command(cc + " synth -o " + d / "ck" + " --experts int8 2>&1", &out), 2) << out;
  EXPECT_NE(out.find("--experts applies to a container"), std::string::npos) << out;
  EXPECT_EQ(run_command(cc + " synth -o " + d / "m.coli" + " --experts int3 2>&1", &out), 2) << out;
  EXPECT_NE(out.find("--experts: unknown format 'int3'"), std::string::npos) << out;
  EXPECT_EQ(run_command(cc + " synth -o " + d / "m" + " --container --layers 0 2>&1", &out), 2) << out;
  EXPECT_NE(out.find("--layers"), std::string::npos) << out;
  EXPECT_EQ(run_command(cc + " synth -o " + d / "m.coli" + " --tokenizer " + d / "nowhere" + " 2>&1", &out), 1) << out;
  EXPECT_NE(out.find("--tokenizer " + d / "nowhere" + ": has no tokenizer.json"), std::string::npos) << out;
  EXPECT_EQ(run_command(cc + " synth --help", &out), 0);
  EXPECT_NE(out.find("--container"), std::string::npos) << out;
  EXPECT_NE(out.find("--lm-head"), std::string::npos) << out;
  EXPECT_EQ(coli::test::run_command("ls -A " + d.path(), &out), 0);
  EXPECT_EQ(out, "");  // nothing left behind
}

// The other families: qwen3_moe (no DeltaNet, no shared expert) and
// qwen3_next, whose checkpoint holds the fused DeltaNet projections the
// container stores split (the direct path fills split rows from the fused
// plan; the checkpoint path binds and permutes): still the same bytes.
TEST(SynthContainer, SameBytesForTheOtherFamilies) {
  for (const coli::ModelFamily f : {coli::ModelFamily::kQwen3Moe, coli::ModelFamily::kQwen3Next}) {
    SCOPED_TRACE(coli::family_name(f));
    coli::SynthOptions so = small_synth(4);
    so.family = f;
    if (f == coli::ModelFamily::kQwen3Moe) so.shared_inter = 0;
    expect_same_container(so, formats(coli::QuantFormat::I4_G32, coli::QuantFormat::I8));
  }
}
