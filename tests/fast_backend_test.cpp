// The fast CPU backend (SIMD kernels, threads, fused experts) against the
// reference backend and the transformers goldens.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "convert/convert.h"
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
