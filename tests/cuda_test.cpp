// CUDA kernels against the CPU reference. Skipped, with the reason, where
// no device is usable (CI has none).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <random>

#include "cuda_backend.h"
#include "cuda_device.h"
#include "ref_kernels.h"

TEST(Cuda, RmsNormMatchesCpuReference) {
  std::string why;
  if (coli::cuda::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  std::printf("[ info     ] device 0: %s\n", coli::cuda::describe_device(0).c_str());
  std::mt19937 rng(42);
  std::normal_distribution<float> nd;
  for (int n : {1, 7, 64, 1000, 2048}) {
    const int rows = 5;
    std::vector<float> x(rows * n), w(n), y(rows * n), ref(rows * n);
    for (auto& v : x) v = nd(rng) * 3;
    for (auto& v : w) v = nd(rng) * 0.2f;
    std::fill(y.begin(), y.end(), NAN);  // every element must be written
    coli::cuda::rms_norm_1p_rows(x.data(), w.data(), rows, n, 1e-6f, y.data());
    for (int r = 0; r < rows; ++r) coli::cpu::rms_norm_1p(x.data() + r * n, w.data(), n, 1e-6f, ref.data() + r * n);
    for (int i = 0; i < rows * n; ++i) ASSERT_NEAR(y[i], ref[i], 1e-5f * (1 + std::fabs(ref[i]))) << "n=" << n << " i=" << i;
  }
}

// The backend's greedy ids (Backend::greedy_only: each logits row's first
// largest, found on the device) against a scalar scan of the same rows:
// vocabularies of one id, a few, around a slice's 2,048 and the real
// 248,320; ties placed in different slices (the lower id wins); rows of
// -Inf alone (-1), and rows holding NaN or +Inf (-2 - the first such id).
TEST(Cuda, GreedyIdsMatchAScalarScan) {
  std::string why;
  if (coli::cuda::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  const float inf = std::numeric_limits<float>::infinity();
  for (int V : {1, 3, 1000, 2047, 2048, 2049, 248320}) {
    const int rows = V > 100000 ? 20 : 9;
    std::vector<float> l(std::size_t(rows) * V);
    for (auto& v : l) v = nd(rng) * 4;
    auto row = [&](int r) { return l.data() + std::size_t(r) * V; };
    std::uniform_int_distribution<int> pick(0, V - 1);
    // Row 1: the same largest at two ids, far apart; row 2: at every id.
    {
      const int a = pick(rng), b = pick(rng);
      row(1)[a] = row(1)[b] = 100;
    }
    std::fill(row(2), row(2) + V, -2.5f);
    std::fill(row(3), row(3) + V, -inf);      // -1
    row(4)[pick(rng)] = std::nanf("");        // -2 - that id
    row(5)[V - 1] = inf;                      // the last id
    for (int i = 0; i < V; i += 2) row(6)[i] = -inf;  // -Inf mixed with values
    {
      const int a = pick(rng), b = pick(rng);  // NaN and +Inf: the first of them
      row(7)[a] = std::nanf(""), row(7)[b] = inf;
    }
    row(8)[0] = 50, row(8)[V - 1] = 50;       // the ends
    const std::vector<int> got = coli::cuda::device_greedy_ids(l.data(), rows, V);
    ASSERT_EQ(got.size(), std::size_t(rows));
    for (int r = 0; r < rows; ++r) {
      const float* x = row(r);
      int bad = -1, best = -1;
      for (int i = 0; i < V; ++i) {
        if (std::isnan(x[i]) || x[i] == inf) {
          bad = i;
          break;
        }
        if (x[i] > -inf && (best < 0 || x[i] > x[best])) best = i;
      }
      const int want = bad >= 0 ? -2 - bad : best;
      EXPECT_EQ(got[r], want) << "V=" << V << " row " << r;
    }
  }
}

// The whole model on the GPU (CudaBackend) against the CPU reference
// backend on the same weights, and against the transformers goldens.
#include <nlohmann/json.hpp>

#include "convert/convert.h"
#include "convert/synth.h"
#include "cpu_backend.h"
#include "cpu_expert_host.h"
#include "cuda_backend.h"
#include "engine/engine.h"
#include "engine_util.h"
#include "model/weights.h"
#include "test_util.h"

namespace {

using namespace coli;

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float e = 0;
  for (std::size_t i = 0; i < a.size(); ++i) e = std::max(e, std::fabs(a[i] - b[i]));
  return e;
}

// GPU and CPU reference on one model: the last logits of every prompt
// (prefill in chunks of `chunk`: 7 keeps the dense matmuls on the dp4a
// row dots, 64 puts prompts of 8+ tokens on the tensor cores), three decode
// steps (graph replays), greedy tokens. tol bounds |dlogit|.
void expect_gpu_matches_cpu(const Model& m, float tol, bool same_tokens, const std::string& what_fmt, int chunk) {
  const std::string what_s = what_fmt + ", chunks of " + std::to_string(chunk);
  const char* what = what_s.c_str();
  cpu::CpuBackend ref(m);
  auto gpu = cuda::make_cuda_backend(m);
  Engine er(m.spec(), ref, chunk), eg(m.spec(), *gpu, chunk);
  for (const auto& p : test::tiny_goldens()["prompts"]) {
    const std::vector<int> ids = p["ids"];
    Session sr = er.new_session(), sg = eg.new_session();
    const auto lr = er.forward(sr, ids), lg = eg.forward(sg, ids);
    ASSERT_EQ(lr.size(), lg.size());
    const float err = max_abs_diff(lr, lg);
    std::printf("[ info     ] %s, prompt of %zu: max |dlogit| GPU vs CPU %.2e (bound %.2e)\n", what, ids.size(), err, tol);
    EXPECT_LT(err, tol) << what;
    for (int step = 0; step < 3; ++step) {
      const int next = static_cast<int>(std::max_element(lr.begin(), lr.end()) - lr.begin());
      const std::vector<int> one{next};
      EXPECT_LT(max_abs_diff(er.forward(sr, one), eg.forward(sg, one)), tol) << what << " decode step " << step;
    }
    const auto tg = test::greedy_tokens(eg, ids), tr = test::greedy_tokens(er, ids);
    int same = 0;
    while (same < static_cast<int>(tg.size()) && tg[same] == tr[same]) ++same;
    std::printf("[ info     ] %s, prompt of %zu: greedy tokens equal for %d of %zu\n", what, ids.size(), same, tg.size());
    if (same_tokens) {
      EXPECT_EQ(tg, tr) << what;
    }
  }
}

using test::cpu_quantization_error;

bool have_device(std::string* why) { return cuda::device_count(why) > 0; }

}  // namespace

TEST(CudaBackend, CheckpointMatchesTheGoldens) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  auto m = Model::load(test::data_dir() + "/tiny-qwen35moe-text");
  auto gpu = cuda::make_cuda_backend(*m);
  Engine e(m->spec(), *gpu, 7);
  test::expect_golden_prompts(e);
}

// One test per container format, so that each runs (and each sanitizer
// run over it finishes) on its own: racecheck takes minutes per format.
class ContainerFormat : public ::testing::TestWithParam<QuantFormat> {};

TEST_P(ContainerFormat, MatchesTheCpuReference) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  // bf16: float activations on both sides, only the summation order differs.
  // int8 / int4: the GPU quantizes activations to int8 per 32 columns
  // (dp4a) as finely as the container quantizes the weights, so its logits
  // may move by up to twice what the container's own quantization moves
  // the CPU reference's (measured on the H200: int8 0.16-0.25 against a
  // container error of 0.19); greedy tokens stay identical for int8.
  const QuantFormat f = GetParam();
  test::TempDir d;
  auto m = test::convert_all(test::data_dir() + "/tiny-qwen35moe-text", d / "m.coli", f);
  const bool exact = f == QuantFormat::BF16;
  const float tol = exact ? 1e-3f : std::max(1e-3f, 2 * cpu_quantization_error(*m));
  for (int chunk : {7, 64}) expect_gpu_matches_cpu(*m, tol, f == QuantFormat::BF16 || f == QuantFormat::I8, format_name(f), chunk);
}

INSTANTIATE_TEST_SUITE_P(CudaBackend, ContainerFormat,
                         ::testing::Values(QuantFormat::BF16, QuantFormat::I8, QuantFormat::I4_G32, QuantFormat::I4_G64_ASYM, QuantFormat::I4),
                         [](const ::testing::TestParamInfo<QuantFormat>& i) {
                           std::string n = format_name(i.param);
                           for (char& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return n;
                         });

// Long enough to grow the KV cache (256 positions, then doubled) in the
// middle of decoding, which re-captures the decode graph; prefill in
// chunks of 64 (the 8-token passes and their tails). GPU against the CPU
// reference on a bf16 container after every step.
namespace {

void expect_long_context_matches_cpu(const cuda::CudaOptions& opt, int chunk = 64) {
  test::TempDir d;
  auto m = test::convert_all(test::data_dir() + "/tiny-qwen35moe-text", d / "m.coli", QuantFormat::BF16);
  cpu::CpuBackend ref(*m);
  auto gpu = cuda::make_cuda_backend(*m, opt);
  Engine er(m->spec(), ref, chunk), eg(m->spec(), *gpu, chunk);
  std::vector<int> prompt(230);
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int>((i * 7919 + 13) % m->spec().vocab_size);
  Session sr = er.new_session(), sg = eg.new_session();
  auto lr = er.forward(sr, prompt), lg = eg.forward(sg, prompt);
  EXPECT_LT(max_abs_diff(lr, lg), 1e-3f) << "prefill";
  for (int step = 0; step < 40; ++step) {  // positions 230 .. 269: the cache grows at 256
    const std::vector<int> one{static_cast<int>(std::max_element(lr.begin(), lr.end()) - lr.begin())};
    lr = er.forward(sr, one);
    lg = eg.forward(sg, one);
    ASSERT_LT(max_abs_diff(lr, lg), 1e-3f) << "decode step " << step << " (position " << 230 + step << ")";
  }
}

}  // namespace

TEST(CudaBackend, KvCacheGrowthAndLongChunksMatchTheCpu) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  expect_long_context_matches_cpu({});
}

namespace {

// A path chosen by opt: the goldens in engine chunks of
// golden_chunk, then the long-context run in each of long_chunks.
void expect_path_matches(const cuda::CudaOptions& opt, int golden_chunk, std::initializer_list<int> long_chunks) {
  auto m = Model::load(test::data_dir() + "/tiny-qwen35moe-text");
  auto gpu = cuda::make_cuda_backend(*m, opt);
  Engine e(m->spec(), *gpu, golden_chunk);
  test::expect_golden_prompts(e);
  for (int chunk : long_chunks) expect_long_context_matches_cpu(opt, chunk);
}

}  // namespace

// Split-KV attention is the default where the head size allows it; the
// score-buffer kernel (other head sizes): the goldens, and the
// long-context run above.
TEST(CudaBackend, ScoreBufferAttentionMatchesTheCpu) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  cuda::CudaOptions opt;
  opt.split_kv = false;
  expect_path_matches(opt, 7, {64});
}

// Gated DeltaNet prompt chunks in the chunked WY form (the default): the
// goldens (prompts of 1-60 tokens, one partial chunk of 64), the
// long-context run in engine chunks of 64 (one WY chunk per call) and of
// 256 (a 230-token call: three full chunks and a partial one, the state
// carried between them).
TEST(CudaBackend, ChunkedDeltaNetMatchesTheCpu) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  cuda::CudaOptions opt;
  opt.chunked_gdn = true;
  expect_path_matches(opt, 64, {64, 256});
}

// The token-by-token DeltaNet prefill (head shapes the chunked kernels do
// not take): the goldens and the long-context run.
TEST(CudaBackend, TokenLoopDeltaNetMatchesTheCpu) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  cuda::CudaOptions opt;
  opt.chunked_gdn = false;
  expect_path_matches(opt, 7, {64});
}

// A decode graph captured while the buffers were small must not be
// replayed after a longer prompt moved them (an interactive chat's second
// turn): decode, then a longer chunk, then decode again.
TEST(CudaBackend, DecodeAfterALongerChunkMatchesTheCpu) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  auto m = Model::load(test::data_dir() + "/tiny-qwen35moe-text");
  cpu::CpuBackend ref(*m);
  auto gpu = cuda::make_cuda_backend(*m);
  Engine er(m->spec(), ref, 64), eg(m->spec(), *gpu, 64);
  Session sr = er.new_session(), sg = eg.new_session();
  const std::vector<int> one{5}, three{7, 8, 9};
  std::vector<int> forty(40);
  for (int i = 0; i < 40; ++i) forty[i] = (i * 31 + 3) % m->spec().vocab_size;
  for (const std::vector<int>* ids : {&one, &one, static_cast<const std::vector<int>*>(&forty), &one, &three, &one}) {
    const auto lr = er.forward(sr, *ids), lg = eg.forward(sg, *ids);
    ASSERT_LT(max_abs_diff(lr, lg), 1e-3f) << "after a chunk of " << ids->size();
  }
}

namespace {

// The tiny fixture's shapes skip several decode paths that the real shapes
// take: the shared expert run as pair K of the routed experts (it needs the
// shared and routed experts' shapes equal), norms split over a thread-block
// cluster (hidden >= 256), the recurrence step with its gated norm quantized
// for out_proj (value heads of 32+ columns), 128-wide key heads, 2-block
// down rows. A synthetic checkpoint at shrunk shapes with those layouts,
// a 70-token prompt (chunks of 64, then 6) and 8 decode steps fed the bf16
// CPU reference's greedy tokens; ref: that reference's logits.
struct RealLayouts {
  SynthOptions so;
  test::TempDir d;
  std::vector<int> prompt, feed;
  decltype(Model::load("")) ref_model;
  std::vector<std::vector<float>> ref;

  RealLayouts() {
    so.layers = 4, so.seed = 5, so.threads = 2;
    so.vocab = 512, so.hidden = 256, so.experts = 16, so.top_k = 4, so.moe_inter = 64, so.shared_inter = 64;
    so.heads = 4, so.kv_heads = 2, so.head_dim = 64, so.lin_k_heads = 2, so.lin_v_heads = 4, so.lin_k_dim = 128, so.lin_v_dim = 128;
    write_synthetic_checkpoint(d / "synth", so);
    ref_model = convert(QuantFormat::BF16);
    prompt.resize(70);
    for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int>((i * 37 + 11) % so.vocab);
    cpu::CpuBackend ref_be(*ref_model);
    {
      Engine e(ref_model->spec(), ref_be, 64);
      Session s = e.new_session();
      auto l = e.forward(s, prompt);
      for (int i = 0; i < 8; ++i) {
        feed.push_back(static_cast<int>(std::max_element(l.begin(), l.end()) - l.begin()));
        l = e.forward(s, std::vector<int>{feed.back()});
      }
    }
    ref = run(ref_be, *ref_model);
  }
  decltype(Model::load("")) convert(QuantFormat f) { return test::convert_all(d / "synth", d / (std::string(format_name(f)) + ".coli"), f); }
  // Logits after the prompt and after each decode step.
  std::vector<std::vector<float>> run(Backend& be, const Model& m, int chunk = 64) const {
    Engine e(m.spec(), be, chunk);
    Session s = e.new_session();
    std::vector<std::vector<float>> out{e.forward(s, prompt)};
    for (int tok : feed) out.push_back(e.forward(s, std::vector<int>{tok}));
    return out;
  }
};

float max_step_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  float e = 0;
  for (std::size_t i = 0; i < a.size(); ++i) e = std::max(e, max_abs_diff(a[i], b[i]));
  return e;
}

}  // namespace

// The GPU on int8 and int4 containers against the CPU reference on the same
// containers, within twice what each container's quantization moves the
// CPU's logits from the bf16 container's (the same bound as above, with the
// CPU on bf16 as the reference instead of transformers).
TEST(CudaBackend, RealLayoutsMatchTheCpu) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  RealLayouts r;
  for (QuantFormat f : {QuantFormat::I8, QuantFormat::I4_G32}) {
    auto m = r.convert(f);
    cpu::CpuBackend cpu_be(*m);
    auto gpu_be = cuda::make_cuda_backend(*m);
    const auto c = r.run(cpu_be, *m), g = r.run(*gpu_be, *m);
    const float e_quant = max_step_diff(c, r.ref), e_gpu = max_step_diff(g, c);
    std::printf("[ info     ] %s, real layouts: max |dlogit| GPU vs CPU %.2e, CPU container vs bf16 %.2e\n", format_name(f), e_gpu, e_quant);
    EXPECT_LT(e_gpu, std::max(1e-3f, 2 * e_quant)) << format_name(f);
    // Prompt chunks of 12 (decode rows' sizes): the few-token tensor-core
    // tiles (CudaTuning::mma_small); of 5, the dp4a row dots. Both group
    // their experts (CudaTuning::grouped_min_tokens, 4).
    for (int chunk : {12, 5}) {
      const float e_small = max_step_diff(r.run(*gpu_be, *m, chunk), c);
      std::printf("[ info     ] %s, real layouts, chunks of %d: max |dlogit| GPU vs CPU %.2e\n", format_name(f), chunk, e_small);
      EXPECT_LT(e_small, std::max(1e-3f, 2 * e_quant)) << format_name(f) << " chunks of " << chunk;
    }
  }
}

// An int4 model at hidden and value width 1,024 (a 2,048-wide checkpoint's
// lane and tile shapes at a test's size): a prompt of 40 tokens, then three
// steps of 3 tokens (the experts pair by pair, below grouped_min_tokens).
struct WideLayouts {
  test::TempDir d;
  SynthOptions so;
  decltype(Model::load("")) m;
  std::vector<int> prompt;
  WideLayouts() {
    so.layers = 4, so.seed = 7, so.threads = 2;
    so.vocab = 512, so.hidden = 1024, so.experts = 16, so.top_k = 4, so.moe_inter = 64, so.shared_inter = 128;
    so.heads = 8, so.kv_heads = 2, so.head_dim = 128, so.lin_k_heads = 4, so.lin_v_heads = 8, so.lin_k_dim = 128, so.lin_v_dim = 128;
    write_synthetic_checkpoint(d / "synth", so);
    m = test::convert_all(d / "synth", d / "m.coli", QuantFormat::I4_G32);
    prompt.resize(40);
    for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int>((i * 37 + 11) % so.vocab);
  }
  std::vector<std::vector<float>> run(Backend& be, int chunk = 12) const {
    Engine e(m->spec(), be, chunk);
    Session s = e.new_session();
    std::vector<std::vector<float>> out{e.forward(s, prompt)};
    for (int i = 0; i < 3; ++i) out.push_back(e.forward(s, std::vector<int>{static_cast<int>((i * 131 + 7) % so.vocab), 3, 5}));
    return out;
  }
};

// Few-token chunks (12: coli-serve's rows, verify windows) at widths where
// the tensor-core tiles split their columns over a thread block cluster
// (CudaTuning::mma_split: hidden and value width 1,024, 16 tiles of 64 rows
// a matrix, 4 parts of 256 columns): against the CPU on the same int4
// container within RealLayoutsMatchTheCpu's bound (twice the unsplit
// GPU's distance), and nearer the unsplit GPU than either is to the CPU.
// Split and unsplit add the same exact per-block integer dots in another
// order, but the next matmul's int8 codes of a sum that moved in its last
// bits move by one now and then (measured 1.6e-2 of logits up to 2.3,
// H100): a part of the columns lost or added twice is off by the
// logits' scale.
TEST(CudaBackend, SplitFewTokenTilesMatchUnsplit) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  WideLayouts w;
  cuda::CudaOptions off;
  off.tuning.mma_split = 0;
  cpu::CpuBackend cpu_be(*w.m);
  const auto split = w.run(*cuda::make_cuda_backend(*w.m)), unsplit = w.run(*cuda::make_cuda_backend(*w.m, off)), c = w.run(cpu_be);
  float top = 0;
  for (const auto& l : c)
    for (float v : l) top = std::max(top, std::fabs(v));
  const float e_split = max_step_diff(split, unsplit), e_cpu = max_step_diff(split, c), e_cpu_unsplit = max_step_diff(unsplit, c);
  std::printf("[ info     ] int4, hidden 1024, chunks of 12: split vs unsplit %.2e, split vs CPU %.2e, unsplit vs CPU %.2e (logits up to %.2e)\n", e_split,
              e_cpu, e_cpu_unsplit, top);
  EXPECT_LT(e_cpu, std::max(1e-3f, 2 * e_cpu_unsplit));
  EXPECT_LT(e_split, std::max(1e-3f, 0.5f * e_cpu_unsplit));
  // The prompt in one chunk of 40 tokens: three 16-token tiles, split
  // (CudaTuning::mma_small 64, the default), against the prompt chunks'
  // 64-token tiles (mma_small 16) and the CPU.
  cuda::CudaOptions wide;
  wide.tuning.mma_small = 16;
  const auto small40 = w.run(*cuda::make_cuda_backend(*w.m), 40), wide40 = w.run(*cuda::make_cuda_backend(*w.m, wide), 40), c40 = w.run(cpu_be, 40);
  const float e_small = max_step_diff(small40, c40), e_wide = max_step_diff(wide40, c40), e_tiles = max_step_diff(small40, wide40);
  std::printf("[ info     ] int4, hidden 1024, a chunk of 40: 16-token tiles vs CPU %.2e, 64-token tiles vs CPU %.2e, vs each other %.2e\n", e_small,
              e_wide, e_tiles);
  EXPECT_LT(e_small, std::max(1e-3f, 2 * e_wide));
  EXPECT_LT(e_tiles, std::max(1e-3f, 0.5f * e_wide));
}

// The experts' pair kernels (decode steps and chunks of up to 3 tokens) at
// each launch shape CudaTuning offers them: 1, 2 and 4 rows per lane group
// of gate+up, 32, 16 and 8 lanes per weight row (hidden 1,024: 32 blocks
// of 32 columns, so each is taken). The shapes change the order of a dot's
// partial sums only: every one against the CPU on the same int4 container
// within twice the default shape's distance.
TEST(CudaBackend, ExpertLaunchShapesMatchTheCpu) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  WideLayouts w;
  cpu::CpuBackend cpu_be(*w.m);
  const auto c = w.run(cpu_be);
  const float e_default = max_step_diff(w.run(*cuda::make_cuda_backend(*w.m)), c);
  const std::pair<int, int> shapes[] = {{1, 32}, {4, 32}, {2, 16}, {4, 16}, {2, 8}, {4, 8}};
  for (const auto& [up_rows, lanes] : shapes) {
    cuda::CudaOptions o;
    o.tuning.up_rows = up_rows, o.tuning.moe_lanes = lanes;
    const float e = max_step_diff(w.run(*cuda::make_cuda_backend(*w.m, o)), c);
    std::printf("[ info     ] int4, hidden 1024, up_rows %d, moe_lanes %d: max |dlogit| GPU vs CPU %.2e (default shape %.2e)\n", up_rows, lanes, e, e_default);
    EXPECT_LT(e, std::max(1e-3f, 2 * e_default)) << "up_rows " << up_rows << ", moe_lanes " << lanes;
  }
}

// The non-default paths at the real layouts (the score-buffer attention
// kernel, the token-by-token DeltaNet prefill; the defaults, split-KV and
// the WY chunks over 4 column parts of 128-wide heads, are
// RealLayoutsMatchTheCpu's): bf16 on the GPU against the bf16 CPU reference.
TEST(CudaBackend, RealLayoutsOtherPathsMatchTheCpu) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  RealLayouts r;
  cuda::CudaOptions opt;
  opt.split_kv = opt.chunked_gdn = false;
  auto gpu_be = cuda::make_cuda_backend(*r.ref_model, opt);
  const float e = max_step_diff(r.run(*gpu_be, *r.ref_model), r.ref);
  std::printf("[ info     ] bf16, score-buffer attention + token-loop DeltaNet, real layouts: max |dlogit| GPU vs CPU %.2e\n", e);
  EXPECT_LT(e, 1e-3f);
}

// Every one-token int8-activation matmul through the resident-grid kernel
// (gemv_q_stream_kernel, by default only the lm_head's ranges at the real
// vocabulary) with 1 and 2 rows per lane group, against the default kernels
// on the same container: the same arithmetic in the same order, so the
// logits agree to float rounding (and both match the CPU reference, above).
TEST(CudaBackend, StreamedMatmulsMatchTheDefaultKernels) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  RealLayouts r;
  for (QuantFormat f : {QuantFormat::I8, QuantFormat::I4_G32}) {
    auto m = r.convert(f);
    const auto base = r.run(*cuda::make_cuda_backend(*m), *m);
    for (int rows : {1, 2}) {
      cuda::CudaOptions opt;
      opt.gemv_stream_min_rows = 1, opt.gemv_stream_rows = rows;
      const float e = max_step_diff(r.run(*cuda::make_cuda_backend(*m, opt), *m), base);
      std::printf("[ info     ] %s, every decode matmul streamed, %d row(s) per group: max |dlogit| vs the default kernels %.2e\n", format_name(f), rows, e);
      EXPECT_LT(e, 1e-5f) << format_name(f) << ", " << rows << " row(s) per group";
    }
  }
}

namespace {

// The per-layer steps path (the engine takes it when it observes the
// routing): logits after the prompt and each decode step, and the top-k
// experts of every layer for every token.
struct ObservedRun {
  std::vector<std::vector<float>> logits;
  std::vector<int> experts;
};

ObservedRun run_observed(const RealLayouts& r, Backend& be, const Model& m) {
  Engine e(m.spec(), be, 64);
  Session s = e.new_session();
  ObservedRun out;
  auto observe = [&](int, int T, const int* idx, const float*) { out.experts.insert(out.experts.end(), idx, idx + T * m.spec().num_experts_per_tok); };
  out.logits.push_back(e.forward(s, r.prompt, observe));
  for (int tok : r.feed) out.logits.push_back(e.forward(s, std::vector<int>{tok}, observe));
  return out;
}

}  // namespace

// The GPU's per-layer steps against the CPU reference's at the real
// layouts: bf16 within float tolerance and the same experts chosen for every
// token of every layer; int4 within the bound of RealLayoutsMatchTheCpu.
TEST(CudaBackend, LayerStepsMatchTheCpu) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  RealLayouts r;
  {
    cpu::CpuBackend cpu_be(*r.ref_model);
    auto gpu_be = cuda::make_cuda_backend(*r.ref_model);
    const ObservedRun c = run_observed(r, cpu_be, *r.ref_model), g = run_observed(r, *gpu_be, *r.ref_model);
    const float e = max_step_diff(g.logits, c.logits);
    std::printf("[ info     ] bf16, per-layer steps: max |dlogit| GPU vs CPU %.2e, %zu routing choices\n", e, c.experts.size());
    EXPECT_LT(e, 1e-3f);
    EXPECT_EQ(g.experts, c.experts);
    // The same GPU backend's whole-chunk path agrees with its steps.
    EXPECT_LT(max_step_diff(r.run(*gpu_be, *r.ref_model), g.logits), 1e-3f);
  }
  auto m = r.convert(QuantFormat::I4_G32);
  cpu::CpuBackend cpu_be(*m);
  auto gpu_be = cuda::make_cuda_backend(*m);
  const float e_quant = max_step_diff(r.run(cpu_be, *m), r.ref);
  const float e = max_step_diff(run_observed(r, *gpu_be, *m).logits, run_observed(r, cpu_be, *m).logits);
  std::printf("[ info     ] int4-g32, per-layer steps: max |dlogit| GPU vs CPU %.2e (bound %.2e)\n", e, std::max(1e-3f, 2 * e_quant));
  EXPECT_LT(e, std::max(1e-3f, 2 * e_quant));
}

// routed_experts on a subset of (token, expert) pairs in any order, as a
// hybrid placement hands the GPU its resident experts' pairs: rows of
// tokens without pairs are 0. 5 pairs (the per-pair kernels) and 40 (the
// expert-grouped ones), bf16 weights, against the CPU reference.
TEST(CudaBackend, RoutedExpertSubsetsMatchTheCpu) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  RealLayouts r;
  const ModelSpec& sp = r.ref_model->spec();
  cpu::CpuBackend cpu_be(*r.ref_model);
  auto gpu_be = cuda::make_cuda_backend(*r.ref_model);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  const int T = 7, H = sp.hidden_size;
  std::vector<float> hn(std::size_t(T) * H);
  for (auto& v : hn) v = nd(rng);
  for (int n : {5, 40}) {
    std::vector<ExpertPair> pairs;
    for (int i = 0; i < n; ++i) {  // tokens 0..4 out of order, token 2 without a pair; experts out of order
      const int t = (i * 3 + 1) % 5;
      pairs.push_back({t == 2 ? 0 : t, (i * 11 + 1) % sp.num_experts, 0.1f + 0.05f * (i % 7)});
    }
    std::vector<float> c(std::size_t(T) * H, NAN), g(c.size(), NAN);
    cpu_be.routed_experts(1, pairs.data(), n, hn.data(), c.data());
    gpu_be->routed_experts(1, pairs.data(), n, hn.data(), g.data());
    int rows = 0;
    for (const auto& p : pairs) rows = std::max(rows, p.token + 1);
    float scale = 0;
    for (int i = 0; i < rows * H; ++i) scale = std::max(scale, std::fabs(c[i]));
    for (int i = 0; i < rows * H; ++i) ASSERT_NEAR(g[i], c[i], 1e-4f * (1 + scale)) << n << " pairs, element " << i;
    for (int i = 0; i < H; ++i) ASSERT_EQ(g[2 * H + i], 0.0f) << "token 2 has no pair";
    ASSERT_EQ(rows, 5);
    for (int i = rows * H; i < T * H; ++i) ASSERT_TRUE(std::isnan(g[i])) << "rows after the last pair's token are left alone";
  }
}

// A hot expert's pairs in several chunks (moe.cu: kChunkPairs pairs, a
// block each, so that skewed routing keeps the GPU busy): 150 of 200 pairs
// on one expert of an int8 container, through the grouped kernels, against
// the CPU reference on the same container. The GPU's int8 activations move
// a row by well under 1 % of the rows' scale; a chunk lost or run twice
// moves it by a whole expert's output.
TEST(CudaBackend, AHotExpertsPairsMatchTheCpu) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  RealLayouts r;
  auto m = r.convert(QuantFormat::I8);
  const ModelSpec& sp = m->spec();
  cpu::CpuBackend cpu_be(*m);
  auto gpu_be = cuda::make_cuda_backend(*m);
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  const int T = 64, H = sp.hidden_size, n = 200;
  std::vector<float> hn(std::size_t(T) * H);
  for (auto& v : hn) v = nd(rng);
  std::vector<ExpertPair> pairs;
  for (int i = 0; i < n; ++i) {  // pairs 0..149 on expert 3 (tokens repeat: their outputs add), the rest spread
    const bool hot = i < 150;
    pairs.push_back({hot ? i % T : (i * 3 + 1) % T, hot ? 3 : (i * 11 + 1) % sp.num_experts, 0.1f + 0.05f * (i % 7)});
  }
  std::vector<float> c(std::size_t(T) * H), g(c.size());
  cpu_be.routed_experts(1, pairs.data(), n, hn.data(), c.data());
  gpu_be->routed_experts(1, pairs.data(), n, hn.data(), g.data());
  float scale = 0, err = 0;
  for (std::size_t i = 0; i < c.size(); ++i) scale = std::max(scale, std::fabs(c[i])), err = std::max(err, std::fabs(g[i] - c[i]));
  std::printf("[ info     ] 150 of 200 pairs on one expert: max |d| GPU vs CPU %.2e of a scale %.2e\n", err, scale);
  ASSERT_GT(scale, 0.0f);
  EXPECT_LT(err, 1e-2f * scale);
}

// The weights' staged uploads (staged_upload.cuh): with 4 KiB pieces and
// every copy staged, the fixture's weights go through the ring of 8 pinned
// buffers hundreds of times (wrap-around, tensors split over pieces); the
// logits are bit for bit those of the default upload, whole and tiered.
TEST(CudaBackend, StagedUploadsMoveEveryByte) {
  std::string why;
  if (cuda::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  test::TempDir d;
  auto m = test::convert_all(test::data_dir() + "/tiny-qwen35moe-text", d / "m.coli", QuantFormat::I4_G32);
  const std::vector<int> ids = test::tiny_goldens()["prompts"][1]["ids"];
  for (long long slots : {-1LL, 16LL}) {
    cuda::CudaOptions base, tiny;
    tiny.tuning.upload_piece_bytes = 4096, tiny.tuning.upload_min_bytes = 0;
    for (cuda::CudaOptions* o : {&base, &tiny})
      if (slots >= 0) o->expert_slots = slots, o->expert_host = std::make_shared<cpu::CpuExpertHost>(*m, 2);
    auto a = cuda::make_cuda_backend(*m, base), b = cuda::make_cuda_backend(*m, tiny);
    Engine ea(m->spec(), *a, 64), eb(m->spec(), *b, 64);
    Session sa = ea.new_session(), sb = eb.new_session();
    EXPECT_EQ(ea.forward(sa, ids), eb.forward(sb, ids)) << "slots " << slots;
  }
}

// qwen3_moe and qwen3_next (issue 31) on the whole GPU against the CPU
// reference: synthetic bf16 containers of each family (float activations
// on both sides: only the summation order differs), qwen3_next at its real
// 512 experts top-10; a prompt in chunks of 7 and 64 (the dp4a and tensor
// core paths do not apply to bf16: the float and tiled router paths do),
// then decode steps through the graphs.
TEST(CudaBackend, OtherFamiliesMatchTheCpuReference) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  for (const ModelFamily f : {ModelFamily::kQwen3Moe, ModelFamily::kQwen3Next}) {
    SCOPED_TRACE(family_name(f));
    SynthOptions so = synth_shapes(SynthOptions{}, f);
    so.layers = 4, so.vocab = 300, so.hidden = 256, so.moe_inter = 64, so.seed = 5;
    so.experts = f == ModelFamily::kQwen3Next ? 512 : 32, so.top_k = f == ModelFamily::kQwen3Next ? 10 : 8;
    so.shared_inter = f == ModelFamily::kQwen3Next ? 64 : 0;
    so.heads = 4, so.kv_heads = 2, so.head_dim = 32, so.lin_k_heads = 2, so.lin_v_heads = 4, so.lin_k_dim = 32, so.lin_v_dim = 32;
    test::TempDir d;
    ConvertOptions co;
    co.experts = co.down = co.trunk = co.shared = co.lm_head = co.embed = co.router = QuantFormat::BF16;
    co.verify = false;
    write_synthetic_container(d / "m.coli", so, co);
    auto m = Model::load(d / "m.coli");
    std::vector<int> ids(70);
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int>((i * 53 + 3) % so.vocab);
    for (int chunk : {7, 64}) {
      cpu::CpuBackend ref(*m);
      auto gpu = cuda::make_cuda_backend(*m);
      Engine er(m->spec(), ref, chunk), eg(m->spec(), *gpu, chunk);
      Session sr = er.new_session(), sg = eg.new_session();
      std::vector<float> lr = er.forward(sr, ids), lg = eg.forward(sg, ids);
      float range = 0, err = max_abs_diff(lr, lg);
      for (int step = 0; step < 4; ++step) {
        for (float v : lr) range = std::max(range, std::fabs(v));
        const int next = static_cast<int>(std::max_element(lr.begin(), lr.end()) - lr.begin());
        lr = er.forward(sr, std::vector<int>{next}), lg = eg.forward(sg, std::vector<int>{next});
        err = std::max(err, max_abs_diff(lr, lg));
      }
      std::printf("[ info     ] %s, chunks of %d: max |dlogit| GPU vs CPU %.2e of %.2e\n", family_name(f), chunk, err, range);
      EXPECT_GT(range, 0.0f);
      EXPECT_LT(err, 1e-3f * range + 1e-6f);
    }
  }
}

// The transformers fixtures of the other families on the whole GPU: the
// checkpoints (bf16 weights, float activations) give each prompt's last
// logits within 1e-3 of transformers' and its greedy tokens, in chunks of 7
// and 64 (tiny-qwen3moe's dense layers run their MLP in the shared
// expert's place; tiny-qwen3next's fused DeltaNet projections were split
// at binding).
TEST(CudaBackend, OtherFamiliesFixturesMatchTheGoldens) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  for (const char* fixture : {"tiny-qwen3moe", "tiny-qwen3next"}) {
    if (!std::filesystem::exists(test::data_dir() + "/" + fixture)) continue;
    auto m = Model::load(test::data_dir() + "/" + fixture);
    for (int chunk : {7, 64}) {
      auto gpu = cuda::make_cuda_backend(*m);
      Engine e(m->spec(), *gpu, chunk);
      test::expect_golden_prompts(e, std::string(fixture) + " chunks of " + std::to_string(chunk) + ": ", test::goldens_of(fixture));
    }
  }
}
