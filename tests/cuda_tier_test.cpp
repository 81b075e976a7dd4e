// The expert tier on the GPU (hybrid decode): placement changes speed,
// never results. The same greedy tokens with every expert resident, none,
// and budgets between, for the int8 and int4 containers of the fixture; the
// budget is never exceeded. Skipped, with the reason, without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <future>
#include <thread>
#include <limits>
#include <tuple>
#include <nlohmann/json.hpp>

#include "convert/synth.h"
#include "cpu_backend.h"
#include "common/run_options.h"
#include "cpu_expert_host.h"
#include "cuda_backend.h"
#include "cuda_device.h"
#include "engine/engine.h"
#include "engine_util.h"
#include "mirror/mirror.h"
#include "mirror/mirror_load.h"
#include "model/weights.h"
#include "test_util.h"

namespace {

using namespace coli;
namespace cli = coli::cli;

bool have_device(std::string* why) { return cuda::device_count(why) > 0; }

// Other processes allocate on the device meanwhile (scripts/cuda-sanitize.sh
// runs the tests in parallel and says so): its free memory then says
// nothing of this process's use, and only the budget's own ledger is held
// against the budget.
bool device_shared() {
  const char* v = std::getenv("COLI_TEST_SHARED_DEVICE");
  return v && std::string(v) == "1";
}

cuda::CudaOptions tier_options(const Model& m, long long slots) {
  cuda::CudaOptions o;
  o.expert_slots = slots;
  o.expert_host = std::make_shared<cpu::CpuExpertHost>(m, 2);
  return o;
}

using test::cpu_quantization_error;

// The tiny model converted to format f, copied into a mirror of its own
// (named for the tag and this process) and loaded from it: its experts are
// in host memory a backend can register (CudaOptions::host_regions).
struct MirroredModel {
  test::TempDir dir;
  std::unique_ptr<Container> container;
  std::unique_ptr<MirrorBuilder> mirror;
  LoadedModel loaded;  // after mirror: detaches before the segment goes
  MirroredModel(QuantFormat f, const std::string& tag) {
    test::convert_all(test::data_dir() + "/tiny-qwen35moe-text", path(), f);
    mirror_it(tag);
  }
  // A synthetic container at so's shapes (int4-g32 experts) instead.
  MirroredModel(const SynthOptions& so, const std::string& tag) {
    ConvertOptions co;
    co.experts = co.down = QuantFormat::I4_G32, co.verify = false;
    write_synthetic_container(path(), so, co);
    mirror_it(tag);
  }
  void mirror_it(const std::string& tag) {
    container = std::make_unique<Container>(path());
    MirrorBuildOptions mo;
    mo.name = "coli-test-" + tag + "-" + std::to_string(::getpid());
    mirror = std::make_unique<MirrorBuilder>(*container, path(), mo);
    mirror->fill();
    loaded = load_model(path(), mo.name);
  }
  std::string path() const { return dir / "m.coli"; }
  const Model& model() const { return *loaded.model; }
  std::pair<const void*, std::size_t> region() const { return {loaded.mirror->base(), loaded.mirror->size()}; }
};

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float e = 0;
  for (std::size_t i = 0; i < a.size(); ++i) e = std::max(e, std::fabs(a[i] - b[i]));
  return e;
}

}  // namespace

TEST(CudaTier, SameGreedyTokensAtEveryPlacement) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  for (QuantFormat f : {QuantFormat::I8, QuantFormat::I4_G32}) {
    test::TempDir d;
    auto m = test::convert_all(test::data_dir() + "/tiny-qwen35moe-text", d / "m.coli", f);
    const long long all = static_cast<long long>(m->spec().num_layers) * m->spec().num_experts;
    auto whole = cuda::make_cuda_backend(*m);  // no tier: the reference placement
    Engine ew(m->spec(), *whole, 64);
    // Misses run on the CPU's kernels: logits move as far as the CPU's differ
    // from the GPU's (measured 0.07-0.21 at int8 and int4-g32); tokens do not.
    const float tol = 2 * cpu_quantization_error(*m);
    for (long long slots : {all, 0LL, all / 4, all / 2, 3 * all / 4}) {
      auto tier = cuda::make_cuda_backend(*m, tier_options(*m, slots));
      Engine et(m->spec(), *tier, 64);
      for (const auto& p : test::tiny_goldens()["prompts"]) {
        const std::vector<int> ids = p["ids"];
        Session sw = ew.new_session(), st = et.new_session();
        const float err = max_abs_diff(ew.forward(sw, ids), et.forward(st, ids));
        std::printf("[ info     ] %s, %lld of %lld experts resident, prompt of %zu: max |dlogit| vs all resident %.2e (bound %.2e)\n", format_name(f), slots,
                    all, ids.size(), err, tol);
        EXPECT_LT(err, tol) << format_name(f) << " slots " << slots;
        if (slots == all) {
          EXPECT_EQ(err, 0.0f) << "a tier that holds every expert runs the same kernels";
        }
        EXPECT_EQ(test::greedy_tokens(et, ids), test::greedy_tokens(ew, ids)) << format_name(f) << " slots " << slots << " prompt " << ids.size();
      }
      const TierStats ts = tier->tier_stats();
      EXPECT_TRUE(ts.tiered);
      EXPECT_EQ(ts.resident, slots);
      const ExpertWeights& x = m->layer(0).moe.experts[0];
      // A decode miss reads its expert; a prompt post reads each of its experts once for all their pairs.
      EXPECT_LE(ts.prompt_experts, ts.prompt_misses);
      EXPECT_EQ(ts.prompt_misses > 0, ts.misses > 0) << "the prompts of 10 and 60 tokens miss too";
      EXPECT_EQ(ts.host_expert_bytes, static_cast<uint64_t>(ts.misses - ts.prompt_misses + ts.prompt_experts) * (x.gate.bytes() + x.up.bytes() + x.down.bytes()));
      EXPECT_EQ(ts.pairs, ts.tokens * m->spec().num_layers * m->spec().num_experts_per_tok) << "every routed pair of every token counted once";
      if (ts.handoffs > 0) {
        EXPECT_GT(ts.device_experts_ms, 0.0) << "the device's expert kernels run between each post and its join";
      } else {
        EXPECT_EQ(ts.device_experts_ms, 0.0);
      }
      if (slots == all) {
        EXPECT_EQ(ts.misses, 0);
      } else if (slots == 0) {
        EXPECT_EQ(ts.misses, ts.pairs);
      } else {
        EXPECT_GT(ts.misses, 0);
        EXPECT_LT(ts.misses, ts.pairs);
      }
      std::printf("[ info     ] %lld slots: hit rate %.3f over %lld pairs, %lld handoffs, host %.1f ms, device waited %.1f ms\n", slots, ts.hit_rate(),
                  ts.pairs, ts.handoffs, ts.host_experts_ms, ts.device_wait_ms);
    }
  }
}

// The per-layer steps (an engine that observes the routing) on a tier: the
// host adds the misses there too.
TEST(CudaTier, LayerStepsAddTheHostsExperts) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  test::TempDir d;
  auto m = test::convert_all(test::data_dir() + "/tiny-qwen35moe-text", d / "m.coli", QuantFormat::I8);
  const long long all = static_cast<long long>(m->spec().num_layers) * m->spec().num_experts;
  auto whole = cuda::make_cuda_backend(*m);
  auto tier = cuda::make_cuda_backend(*m, tier_options(*m, all / 2));
  Engine ew(m->spec(), *whole, 64), et(m->spec(), *tier, 64);
  const std::vector<int> ids = test::tiny_goldens()["prompts"][1]["ids"];
  Session sw = ew.new_session(), st = et.new_session();
  int routes = 0;
  const auto lw = ew.forward(sw, ids, [&](int, int, const int*, const float*) {});
  const auto lt = et.forward(st, ids, [&](int, int, const int*, const float*) { ++routes; });
  EXPECT_EQ(routes, m->spec().num_layers) << "the per-layer path ran";
  const float err = max_abs_diff(lw, lt), tol = 2 * cpu_quantization_error(*m);
  std::printf("[ info     ] per-layer steps, half the experts resident: max |dlogit| %.2e (bound %.2e)\n", err, tol);
  EXPECT_LT(err, tol);
  EXPECT_GT(err, 0.0f) << "the host's experts were used (their kernels differ from the GPU's)";
}

// --vram-budget: the backend's own ledger and the device's free memory
// both stay within the budget at every budget from too small to all
// resident (the tiny fixture's experts are a few KiB: the sweep steps by
// 256 KiB across the range where the tier holds some of them), and a budget
// too small is an error that names what did not fit.
TEST(CudaTier, TheBudgetIsNeverExceeded) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  test::TempDir d;
  auto m = test::convert_all(test::data_dir() + "/tiny-qwen35moe-text", d / "m.coli", QuantFormat::I4_G32);
  int partial = 0, full = 0, refused = 0;
  // Coarse steps up to the first budget that works, then fine steps around it.
  std::vector<uint64_t> budgets;
  for (uint64_t b = 4 << 20; b <= (64u << 20); b += 1 << 20) budgets.push_back(b);
  for (std::size_t i = 0; i < budgets.size(); ++i) {
    const uint64_t budget = budgets[i];
    const std::size_t free0 = cuda::device_free_bytes();
    std::size_t free_min = SIZE_MAX;
    cuda::CudaOptions o = tier_options(*m, -1);
    o.vram_budget = budget;
    o.n_ctx = 512;
    std::unique_ptr<Backend> tier;
    try {
      tier = cuda::make_cuda_backend(*m, o);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--vram-budget"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(" exceeded: "), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(" in use"), std::string::npos) << e.what();
      ++refused;
      continue;
    }
    if (full + partial == 0) {  // the first that works: 32 KiB steps over the MiB on either side next
      budgets.resize(i + 1);
      for (uint64_t b = budget - (1 << 20) + (32 << 10); b < budget + (1 << 20); b += 32 << 10)
        if (b != budget) budgets.push_back(b);
    }
    Engine e(m->spec(), *tier, 64);
    for (const auto& p : test::tiny_goldens()["prompts"]) {
      test::greedy_tokens(e, p["ids"]);
      free_min = std::min(free_min, cuda::device_free_bytes());
    }
    const TierStats ts = tier->tier_stats();
    const double used = (double(free0) - double(free_min)) / (1 << 20);
    if (ts.resident < ts.experts) ++partial;
    else ++full;
    std::printf("[ info     ] budget %.2f MiB: ledger peak %.2f MiB, device memory used %.1f MiB, %lld of %lld experts resident\n", budget / 1048576.0,
                ts.vram_peak / 1048576.0, used, ts.resident, ts.experts);
    EXPECT_LE(ts.vram_peak, budget);
    if (!device_shared()) {
      EXPECT_LE(used, budget / 1048576.0 + 2.0) << "2 MiB: the driver's allocation granularity";
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(partial, 0);
  EXPECT_GT(full, 0);
}

// Background swaps (CudaOptions::swap): hot misses take cold residents'
// slots while the run decodes, and the tokens stay those of every expert
// resident. A window of 2 tokens and a low bar make the tiny fixture swap
// often; the counts the windows take off the device still reach read_heat.
TEST(CudaTier, SwapsDoNotChangeTokens) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  for (QuantFormat f : {QuantFormat::I8, QuantFormat::I4_G32}) {
    test::TempDir d;
    auto m = test::convert_all(test::data_dir() + "/tiny-qwen35moe-text", d / "m.coli", f);
    const ModelSpec& s = m->spec();
    const long long all = static_cast<long long>(s.num_layers) * s.num_experts;
    auto whole = cuda::make_cuda_backend(*m);
    Engine ew(s, *whole, 64);
    cuda::CudaOptions o = tier_options(*m, all / 4);
    o.swap = true;
    o.swap_window = 2;
    o.swap_policy.hysteresis = 0.25;
    o.swap_policy.min_gain = 0.5;
    auto tier = cuda::make_cuda_backend(*m, o);
    Engine et(s, *tier, 64);
    const float tol = 2 * cpu_quantization_error(*m);
    float worst = 0;
    for (const auto& p : test::tiny_goldens()["prompts"]) {
      const std::vector<int> ids = p["ids"];
      EXPECT_EQ(test::greedy_tokens(et, ids), test::greedy_tokens(ew, ids)) << format_name(f) << " prompt " << ids.size();
      // 48 steps of the all-resident run's greedy continuation, fed to both
      // one token at a time: every step's logits within the CPU kernels'
      // error, whatever the tier held at that step (a long greedy run can
      // meet a near-tie that this error flips).
      const std::vector<int> cont = test::greedy_tokens(ew, ids, 48);
      Session sw = ew.new_session(), st = et.new_session();
      float err = max_abs_diff(ew.forward(sw, ids), et.forward(st, ids));
      for (int tok : cont) err = std::max(err, max_abs_diff(ew.forward(sw, std::vector<int>{tok}), et.forward(st, std::vector<int>{tok})));
      EXPECT_LT(err, tol) << format_name(f) << " prompt " << ids.size();
      worst = std::max(worst, err);
    }
    const TierStats ts = tier->tier_stats();
    const ExpertWeights& x = m->layer(0).moe.experts[0];
    std::printf("[ info     ] %s, %lld of %lld resident: %lld swaps, hit rate %.3f over %lld tokens, max |dlogit| %.2e (bound %.2e)\n", format_name(f),
                ts.resident, ts.experts, ts.swaps, ts.hit_rate(), ts.tokens, worst, tol);
    EXPECT_GT(ts.swaps, 0) << "the low bar makes the tier swap";
    EXPECT_EQ(ts.swap_bytes, static_cast<uint64_t>(ts.swaps) * (x.gate.bytes() + x.up.bytes() + x.down.bytes()));
    EXPECT_EQ(ts.resident, all / 4) << "slot for slot";
    EXPECT_EQ(ts.pairs, ts.tokens * s.num_layers * s.num_experts_per_tok);
    std::vector<uint64_t> heat;
    ASSERT_TRUE(tier->read_heat(heat));
    uint64_t total = 0;
    for (uint64_t c : heat) total += c;
    EXPECT_EQ(total, static_cast<uint64_t>(ts.tokens) * s.num_layers * s.num_experts_per_tok) << "every routing counted once";
  }
}

// Decode misses over PCIe (CudaOptions::decode_upload_max): with the
// experts in a registered mirror, part of each decode layer's misses is
// uploaded and computed on the device; the tokens stay those of every
// expert resident and each step's logits within the CPU kernels' error.
TEST(CudaTier, DecodeMissesOverPcieKeepTokens) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  MirroredModel mm(QuantFormat::I4_G32, "pcie");
  ASSERT_NE(mm.loaded.mirror, nullptr);
  const Model& m = mm.model();
  const ModelSpec& s = m.spec();
  const long long all = static_cast<long long>(s.num_layers) * s.num_experts;
  auto whole = cuda::make_cuda_backend(m);
  Engine ew(s, *whole, 64);
  cuda::CudaOptions o = tier_options(m, all / 4);
  o.decode_upload_max = 4, o.decode_upload_share = 0.5;
  o.host_regions.push_back(mm.region());
  auto tier = cuda::make_cuda_backend(m, o);
  Engine et(s, *tier, 64);
  const float tol = 2 * cpu_quantization_error(m);
  float worst = 0;
  for (const auto& p : test::tiny_goldens()["prompts"]) {
    const std::vector<int> ids = p["ids"];
    EXPECT_EQ(test::greedy_tokens(et, ids), test::greedy_tokens(ew, ids)) << "prompt " << ids.size();
    const std::vector<int> cont = test::greedy_tokens(ew, ids, 24);
    Session sw = ew.new_session(), st = et.new_session();
    float err = max_abs_diff(ew.forward(sw, ids), et.forward(st, ids));
    for (int tok : cont) err = std::max(err, max_abs_diff(ew.forward(sw, std::vector<int>{tok}), et.forward(st, std::vector<int>{tok})));
    EXPECT_LT(err, tol) << "prompt " << ids.size();
    worst = std::max(worst, err);
  }
  const TierStats ts = tier->tier_stats();
  std::printf("[ info     ] %lld of %lld misses over PCIe, max |dlogit| %.2e (bound %.2e)\n", ts.device_misses, ts.misses, worst, tol);
  EXPECT_GT(ts.device_misses, 0);
  EXPECT_LT(ts.device_misses, ts.misses) << "the CPU keeps a share";
  // Every miss over PCIe (share 1, slots for all K): the device computes
  // them with the resident experts' kernels, so a decode step's logits are
  // those of every expert resident, up to float rounding of the row sums.
  // And one slot for several misses: never more than the slots are taken.
  for (int max : {s.num_experts_per_tok, 1}) {
    cuda::CudaOptions a = tier_options(m, 0);
    a.decode_upload_max = max, a.decode_upload_share = 1.0;
    a.host_regions.push_back(mm.region());
    auto b = cuda::make_cuda_backend(m, a);
    Engine eb(s, *b, 64);
    const std::vector<int> ids = test::tiny_goldens()["prompts"][0]["ids"];
    const std::vector<int> cont = test::greedy_tokens(ew, ids, 16);
    Session sw = ew.new_session(), sb = eb.new_session();
    ew.forward(sw, ids), eb.forward(sb, ids);
    const TierStats b0 = b->tier_stats();  // after the prompt, whose misses went to the host
    float e = 0;
    for (int tok : cont) e = std::max(e, max_abs_diff(ew.forward(sw, std::vector<int>{tok}), eb.forward(sb, std::vector<int>{tok})));
    const TierStats b1 = b->tier_stats();
    const long long misses = b1.misses - b0.misses, dev = b1.device_misses - b0.device_misses, steps = b1.handoffs - b0.handoffs;
    std::printf("[ info     ] decode_upload_max %d, share 1: %lld of %lld decode misses over PCIe, max |dlogit| over %zu steps %.2e\n", max, dev, misses,
                cont.size(), e);
    EXPECT_GT(misses, 0);
    if (max == s.num_experts_per_tok) {
      EXPECT_EQ(dev, misses) << "every decode miss on the device";
      EXPECT_LT(e, 1e-3f);
    } else {
      EXPECT_EQ(dev, steps) << "one per layer step, never more than the one slot";
      EXPECT_LT(e, tol);
    }
  }
}

// Zero-copy decode reads (CudaOptions::pcie_read_share): in one-token
// steps a share of each layer's misses is computed by the device, its
// kernels reading the weights from the registered mirror over PCIe, the
// rest by the host. Tokens stay those of the whole model at a quarter of
// the experts resident. With no slots every routed pair is a miss, so the
// split is known by hand: share 1 gives the device all of them (the decode
// logits are the whole model's up to float rounding: the same kernels; the
// host computes none and is never posted to), share 0.5 round(0.5 (K + 2))
// of each layer's K (offset 2, the default).
TEST(CudaTier, PcieReadsKeepTokens) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  MirroredModel mm(QuantFormat::I4_G32, "zerocopy");
  ASSERT_NE(mm.loaded.mirror, nullptr);
  const Model& m = mm.model();
  const ModelSpec& s = m.spec();
  const long long all = static_cast<long long>(s.num_layers) * s.num_experts;
  auto whole = cuda::make_cuda_backend(m);
  Engine ew(s, *whole, 64);
  const float tol = 2 * cpu_quantization_error(m);
  {
    cuda::CudaOptions o = tier_options(m, all / 4);
    o.pcie_read_share = 0.5;
    o.host_regions.push_back(mm.region());
    auto tier = cuda::make_cuda_backend(m, o);
    Engine et(s, *tier, 64);
    for (const auto& p : test::tiny_goldens()["prompts"]) {
      const std::vector<int> ids = p["ids"];
      EXPECT_EQ(test::greedy_tokens(et, ids), test::greedy_tokens(ew, ids)) << "prompt " << ids.size();
    }
    const TierStats ts = tier->tier_stats();
    EXPECT_EQ(ts.pcie_read, all - ts.resident) << "every expert outside the tier lies in the mirror";
    EXPECT_GT(ts.misses, 0) << "the host keeps a share";
    EXPECT_GT(ts.pcie_misses, 0) << "the device reads a share";
  }
  const std::vector<int> ids = test::tiny_goldens()["prompts"][0]["ids"];
  const std::vector<int> cont = test::greedy_tokens(ew, ids, 16);
  const int K = s.num_experts_per_tok;
  for (const double share : {1.0, 0.5}) {  // with the default offset
    cuda::CudaOptions a = tier_options(m, 0);
    a.pcie_read_share = share;
    a.host_regions.push_back(mm.region());
    auto b = cuda::make_cuda_backend(m, a);
    Engine eb(s, *b, 64);
    EXPECT_EQ(b->tier_stats().pcie_read, all);
    Session sw = ew.new_session(), sb = eb.new_session();
    EXPECT_LT(max_abs_diff(ew.forward(sw, ids), eb.forward(sb, ids)), tol) << "the prompt's misses on the host";
    const TierStats b0 = b->tier_stats();
    float e = 0;
    for (int tok : cont) e = std::max(e, max_abs_diff(ew.forward(sw, std::vector<int>{tok}), eb.forward(sb, std::vector<int>{tok})));
    const TierStats b1 = b->tier_stats();
    const long long pairs = b1.pairs - b0.pairs, host = b1.misses - b0.misses, pcie = b1.pcie_misses - b0.pcie_misses;
    std::printf("[ info     ] pcie_read_share %.1f, no slots: %lld decode pairs, %lld over PCIe, %lld on the host in %lld posts, max |dlogit| %.2e\n",
                share, pairs, pcie, host, b1.handoffs - b0.handoffs, e);
    EXPECT_EQ(pairs, static_cast<long long>(cont.size()) * s.num_layers * K);
    const long long device_per_layer = std::min<long long>(K, static_cast<long long>(std::floor(share * (K + a.pcie_read_offset) + 0.5)));
    EXPECT_EQ(pcie, static_cast<long long>(cont.size()) * s.num_layers * device_per_layer) << "round(share x (misses + offset)) of every layer";
    EXPECT_EQ(host, pairs - pcie);
    const bool host_part = device_per_layer < K;
    EXPECT_EQ(b1.handoffs - b0.handoffs, host_part ? static_cast<long long>(cont.size()) * s.num_layers : 0) << "a layer with no host miss posts nothing";
    if (share == 1.0) EXPECT_LT(e, 1e-3f) << "every decode pair on the device: the whole model's kernels";
    else EXPECT_LT(e, tol);
  }
}

// The PCIe split in a rows step (coli-serve's slots stepped together, each
// expert pair by pair): of each layer's distinct missing experts the device
// reads round(share x (misses + offset)) over PCIe, with all their pairs,
// the host computes the rest. No slots, so every pair misses. Five
// sessions (prompts of 3 .. 50 ids) step together as five rows, then as
// three (the shared expert folded in), against the same rows steps of a
// tier whose rows hand every miss to the host (CudaTuning::pcie_rows_max
// 1; the prompts' misses the host's in both): within the quantization
// bound. The rows' share is CudaTuning::pcie_rows_share where set, else
// the one-token share: 100 % (the rows' 100, or the one-token 1.0 where
// the rows' is 0) gives the device every pair (the host never posted to),
// 50 % splits them (both places used).
TEST(CudaTier, PcieReadsInARowsStep) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  MirroredModel mm(QuantFormat::I4_G32, "rowspcie");
  const Model& m = mm.model();
  const ModelSpec& s = m.spec();
  const int V = s.vocab_size;
  const float tol = 2 * cpu_quantization_error(m);
  struct Case {
    double one_token;
    int rows_pct;
    double share;  // the rows' share these give
  };
  for (const Case c : {Case{0.35, 100, 1.0}, Case{0.35, 50, 0.5}, Case{1.0, 0, 1.0}}) {
    const double share = c.share;
    cuda::CudaOptions o = tier_options(m, 0);
    o.pcie_read_share = c.one_token;
    o.tuning.pcie_rows_share = c.rows_pct;
    o.host_regions.push_back(mm.region());
    auto tier = cuda::make_cuda_backend(m, o);
    o.tuning.pcie_rows_max = 1;
    auto whole = cuda::make_cuda_backend(m, o);  // the baseline: rows' misses on the host
    Engine ew(s, *whole, 64), et(s, *tier, 64);
    std::vector<Session> sw, st;
    std::vector<int> next;
    for (int p = 0; p < 5; ++p) {
      std::vector<int> ids(3 + p * 47 / 4);
      for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int>((i * 7919 + 131 * p + 13) % V);
      sw.push_back(ew.new_session()), st.push_back(et.new_session());
      const std::vector<float> a = ew.forward(sw.back(), ids);
      et.forward(st.back(), ids);
      next.push_back(static_cast<int>(std::max_element(a.begin(), a.end()) - a.begin()));
    }
    const TierStats t0 = tier->tier_stats();
    float e = 0;
    for (const std::vector<int>& which : std::vector<std::vector<int>>{{0, 1, 2, 3, 4}, {0, 1, 2, 3, 4}, {0, 2, 4}, {0, 1, 2, 3, 4}}) {
      std::vector<Session*> rw, rt;
      std::vector<int> ids;
      for (int i : which) rw.push_back(&sw[i]), rt.push_back(&st[i]), ids.push_back(next[i]);
      const std::vector<float> lw = ew.forward_rows(rw, ids), lt = et.forward_rows(rt, ids);
      ASSERT_EQ(lw.size(), lt.size());
      e = std::max(e, max_abs_diff(lw, lt));
      for (std::size_t r = 0; r < which.size(); ++r) {
        const float* row = lw.data() + r * V;
        next[which[r]] = static_cast<int>(std::max_element(row, row + V) - row);
      }
    }
    const TierStats t1 = tier->tier_stats();
    const long long host = t1.misses - t0.misses, pcie = t1.pcie_misses - t0.pcie_misses, posts = t1.handoffs - t0.handoffs;
    std::printf("[ info     ] rows steps, pcie_read_share %.2f, pcie_rows_share %d %%, no slots: %lld pairs over PCIe, %lld on the host in %lld posts, max |dlogit| vs every miss on the host %.2e (bound %.2e)\n",
                c.one_token, c.rows_pct, pcie, host, posts, e, tol);
    EXPECT_GT(pcie, 0) << "the device reads a share";
    EXPECT_LT(e, tol);
    if (share == 1.0) {
      EXPECT_EQ(host, 0) << "every pair on the device";
      EXPECT_EQ(posts, 0) << "nothing posted to the host";
    } else {
      EXPECT_GT(host, 0) << "the host keeps a share";
    }
  }
}

// The PCIe split with an expert split by rows (CudaOptions::split_experts):
// a synthetic model whose experts have 256 intermediate rows, no slots
// (every routed pair misses), share 0.375 and offset 0: of a layer's 4
// misses the device takes 1.5, one whole expert and rows [0, 128) of the
// next, whose rows [128, 256) the host computes. Decode logits stay as
// close to the whole model's as the rounded split's (both are the GPU's
// and the CPU's kernels on different parts of the same sums), and the
// counts are the hand-computed ones.
TEST(CudaTier, SplitExpertsKeepTheWholeModelsLogits) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  SynthOptions so;
  so.layers = 4, so.vocab = 300, so.hidden = 256, so.experts = 16, so.top_k = 4, so.moe_inter = 256, so.shared_inter = 64;
  so.heads = 2, so.kv_heads = 1, so.head_dim = 32, so.lin_k_heads = 2, so.lin_v_heads = 4, so.lin_k_dim = 16, so.lin_v_dim = 16;
  MirroredModel mm(so, "split");
  ASSERT_NE(mm.loaded.mirror, nullptr);
  const Model& m = mm.model();
  const ModelSpec& s = m.spec();
  auto whole = cuda::make_cuda_backend(m);
  Engine ew(s, *whole, 64);
  const std::vector<int> ids = {11, 57, 203, 4, 98};
  const std::vector<int> cont = test::greedy_tokens(ew, ids, 12);
  float err[2] = {};
  for (const bool split : {false, true}) {
    cuda::CudaOptions o = tier_options(m, 0);
    o.pcie_read_share = 0.375, o.pcie_read_offset = 0, o.split_experts = split;
    o.host_regions.push_back(mm.region());
    auto b = cuda::make_cuda_backend(m, o);
    Engine eb(s, *b, 64);
    Session sw = ew.new_session(), sb = eb.new_session();
    ew.forward(sw, ids), eb.forward(sb, ids);
    const TierStats b0 = b->tier_stats();
    float e = 0, range = 0;
    for (int tok : cont) {
      const std::vector<float> lw = ew.forward(sw, std::vector<int>{tok}), lb = eb.forward(sb, std::vector<int>{tok});
      e = std::max(e, max_abs_diff(lw, lb));
      for (float v : lw) range = std::max(range, std::fabs(v));
    }
    const TierStats b1 = b->tier_stats();
    const long long steps = static_cast<long long>(cont.size()) * s.num_layers;
    const long long pcie = b1.pcie_misses - b0.pcie_misses, host = b1.misses - b0.misses, parts = b1.split_misses - b0.split_misses;
    std::printf("[ info     ] split %d: %lld layer steps, %lld whole over PCIe, %lld on the host, %lld split, max |dlogit| %.2e of %.2e\n", split, steps,
                pcie, host, parts, e, range);
    // 0.375 x 4 = 1.5: rounded 2 whole on the device; split 1 whole and 0.5 x 256 = 128 rows of one more.
    EXPECT_EQ(pcie, steps * (split ? 1 : 2));
    EXPECT_EQ(host, steps * (split ? 3 : 2)) << "the split expert is a host miss too";
    EXPECT_EQ(parts, split ? steps : 0);
    EXPECT_GT(range, 0.0f);
    EXPECT_LT(e, 0.05f * range);
    err[split] = e;
  }
  EXPECT_LT(err[1], 2 * err[0] + 1e-6f) << "the split adds no error of its own";
}

// Hybrid prefill (CudaOptions::prefill_upload): a prompt chunk's experts
// outside the tier are uploaded (from a registered mirror) and run with the
// same kernels as resident ones, so a chunk's logits are bit for bit those
// of every expert resident; each chunk uploads every non-resident expert
// once; decode steps still hand misses to the host (greedy tokens as at
// every placement); a budget holds the staging areas too; and from
// pageable memory (the container) the staged copies give the same.
TEST(CudaTier, PrefillUploadsMatchTheWholeModel) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  for (QuantFormat f : {QuantFormat::I8, QuantFormat::I4_G32}) {
    MirroredModel mm(f, "prefill");
    ASSERT_NE(mm.loaded.mirror, nullptr);
    const Model& m = mm.model();
    const ModelSpec& s = m.spec();
    const long long all = static_cast<long long>(s.num_layers) * s.num_experts;
    auto whole = cuda::make_cuda_backend(m);
    Engine ew(s, *whole, 64);
    // ring 0: the default ring (16 slots, more than the tiny model's 16
    // experts leave out: one group per layer); 3: a layer's misses stream
    // through in groups of 3 (up to 6 groups a layer).
    for (const auto& [slots, ring] : std::vector<std::pair<long long, int>>{{0, 0}, {all / 4, 0}, {all / 2, 0}, {0, 3}, {all / 4, 3}}) {
      cuda::CudaOptions o = tier_options(m, slots);
      o.prefill_upload = true, o.prefill_ring_slots = ring;
      o.prefill_cpu_experts = 0;  // every non-resident uploads: the whole model's kernels, bit for bit
      o.host_regions.push_back(mm.region());
      auto tier = cuda::make_cuda_backend(m, o);
      Engine et(s, *tier, 64);
      long long chunks = 0;
      for (const auto& p : test::tiny_goldens()["prompts"]) {
        const std::vector<int> ids = p["ids"];
        if (ids.size() < 4) continue;  // shorter prompts run as decode steps do
        ++chunks;
        Session sw = ew.new_session(), st = et.new_session();
        EXPECT_EQ(max_abs_diff(ew.forward(sw, ids), et.forward(st, ids)), 0.0f)
            << format_name(f) << " slots " << slots << " ring " << ring << " prompt " << ids.size();
      }
      ASSERT_GT(chunks, 0);
      const ExpertWeights& x = m.layer(0).moe.experts[0];
      const uint64_t expert = x.gate.bytes() + x.up.bytes() + x.down.bytes();
      const TierStats ts = tier->tier_stats();
      EXPECT_EQ(ts.prefill_upload_bytes, static_cast<uint64_t>(chunks) * static_cast<uint64_t>(all - slots) * expert)
          << "each chunk: every non-resident once (ring " << ring << ")";
      EXPECT_EQ(ts.misses, 0) << "no miss went to the host";
      EXPECT_EQ(ts.pairs, ts.tokens * s.num_layers * s.num_experts_per_tok);
      for (const auto& p : test::tiny_goldens()["prompts"])
        EXPECT_EQ(test::greedy_tokens(et, p["ids"]), test::greedy_tokens(ew, p["ids"])) << format_name(f) << " slots " << slots << " ring " << ring;
    }
    // The container's pageable mapping: the copies are staged through
    // pinned memory on host threads, with the same results.
    auto plain = Model::load(mm.path());
    for (long long slots : {0LL, all / 4}) {
      cuda::CudaOptions o = tier_options(*plain, slots);
      o.prefill_upload = true, o.prefill_ring_slots = 5;  // groups of 5 from pageable memory
      o.prefill_cpu_experts = 0;
      auto tier = cuda::make_cuda_backend(*plain, o);
      Engine et(s, *tier, 64);
      long long chunks = 0;
      for (const auto& p : test::tiny_goldens()["prompts"]) {
        const std::vector<int> ids = p["ids"];
        if (ids.size() < 4) continue;
        ++chunks;
        Session sw = ew.new_session(), st = et.new_session();
        EXPECT_EQ(max_abs_diff(ew.forward(sw, ids), et.forward(st, ids)), 0.0f) << "pageable, slots " << slots << " prompt " << ids.size();
      }
      const ExpertWeights& x = plain->layer(0).moe.experts[0];
      const uint64_t expert = x.gate.bytes() + x.up.bytes() + x.down.bytes();
      EXPECT_EQ(tier->tier_stats().prefill_upload_bytes, static_cast<uint64_t>(chunks) * static_cast<uint64_t>(all - slots) * expert);
      EXPECT_EQ(tier->tier_stats().misses, 0);
    }
  }
  // Under budgets (coarse steps to the first that works, then 32 KiB steps
  // around it): the ledger's peak and the device's free memory stay within
  // each, and some budget holds part of the tier and uploads.
  MirroredModel mm(QuantFormat::I4_G32, "prefill-b");
  const Model& m = mm.model();
  int uploading = 0, ran = 0;
  std::size_t fine_end = 0;
  std::vector<uint64_t> budgets;
  for (uint64_t b = 4 << 20; b <= (256u << 20); b += 1 << 20) budgets.push_back(b);
  for (std::size_t i = 0; i < budgets.size(); ++i) {
    const uint64_t budget = budgets[i];
    cuda::CudaOptions o = tier_options(m, -1);
    o.vram_budget = budget, o.n_ctx = 512, o.prefill_upload = true;
    o.host_regions.push_back(mm.region());
    const std::size_t free0 = cuda::device_free_bytes();
    std::size_t free_min = SIZE_MAX;
    std::unique_ptr<Backend> tier;
    try {
      tier = cuda::make_cuda_backend(m, o);
    } catch (const Error&) {
      continue;
    }
    if (ran++ == 0) {  // the fine steps next, then the coarse ones on until a budget uploads
      std::vector<uint64_t> fine;
      for (uint64_t b = budget - (1 << 20) + (32 << 10); b < budget + (2 << 20); b += 32 << 10)
        if (b != budget) fine.push_back(b);
      budgets.insert(budgets.begin() + static_cast<std::ptrdiff_t>(i + 1), fine.begin(), fine.end());
      fine_end = i + fine.size();
    }
    Engine e(m.spec(), *tier, 64);
    for (const auto& p : test::tiny_goldens()["prompts"]) {
      test::greedy_tokens(e, p["ids"]);
      free_min = std::min(free_min, cuda::device_free_bytes());
    }
    const TierStats ts = tier->tier_stats();
    uploading += ts.prefill_upload_bytes > 0 && ts.resident < ts.experts;
    EXPECT_LE(ts.vram_peak, budget);
    if (!device_shared()) {
      EXPECT_LE((double(free0) - double(free_min)) / (1 << 20), budget / 1048576.0 + 2.0) << "2 MiB: the driver's allocation granularity";
    }
    if (uploading > 0 && i >= fine_end) break;
  }
  EXPECT_GT(uploading, 0) << "some budget held part of the tier and uploaded the rest";
}

// The CPU as third place (CudaOptions::prefill_cpu_experts): an uploading
// layer's last n non-residents by id go to the host instead, in rings
// whose groups then cover the null entries too; greedy tokens as the whole
// model's and logits within the host kernels' error; every other
// non-resident uploads once per chunk; the stats say where each ran. The
// cost model's own count (-1) from a pinned mirror stays within the misses.
// By routing (prefill_cpu_by_routing: from the second prompt on the least
// routed, a choice that changes between chunks) the same.
TEST(CudaTier, TheCpuTakesPartOfAPromptsUploads) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  MirroredModel mm(QuantFormat::I4_G32, "third");
  ASSERT_NE(mm.loaded.mirror, nullptr);
  const Model& m = mm.model();
  const ModelSpec& s = m.spec();
  const int L = s.num_layers, E = s.num_experts;
  const long long all = static_cast<long long>(L) * E;
  auto whole = cuda::make_cuda_backend(m);
  Engine ew(s, *whole, 64);
  const float tol = std::max(1e-3f, 2 * cpu_quantization_error(m));
  const ExpertWeights& x = m.layer(0).moe.experts[0];
  const uint64_t expert = x.gate.bytes() + x.up.bytes() + x.down.bytes();
  for (const auto& [host, ring, routed] : std::vector<std::tuple<int, int, bool>>{{1, 0, false}, {3, 3, false}, {E, 4, false}, {-1, 3, false}, {3, 3, true}, {-1, 3, true}}) {
    cuda::CudaOptions o = tier_options(m, all / 4);
    o.prefill_upload = true, o.prefill_ring_slots = ring, o.prefill_cpu_experts = host, o.prefill_cpu_by_routing = routed;
    o.prefill_hot_pairs = std::numeric_limits<int>::max();  // the host keeps what it was given (HotHostExpertsAreReadOverPcie...)
    o.host_regions.push_back(mm.region());
    auto tier = cuda::make_cuda_backend(m, o);
    Engine et(s, *tier, 64);
    long long chunks = 0;
    for (const auto& p : test::tiny_goldens()["prompts"]) {
      const std::vector<int> ids = p["ids"];
      if (ids.size() < 4) continue;
      ++chunks;
      Session sw = ew.new_session(), st = et.new_session();
      EXPECT_LT(max_abs_diff(ew.forward(sw, ids), et.forward(st, ids)), tol) << "host " << host << " ring " << ring << " routed " << routed << " prompt " << ids.size();
    }
    ASSERT_GT(chunks, 0);
    const TierStats ts = tier->tier_stats();
    const long long missing = all - ts.resident;
    EXPECT_EQ(ts.prefill_placed_resident + ts.prefill_placed_uploaded + ts.prefill_placed_host, chunks * all) << "every layer uploads";
    EXPECT_EQ(ts.prefill_placed_resident, chunks * ts.resident);
    if (host >= 0) EXPECT_EQ(ts.prefill_placed_host, chunks * std::min<long long>(all, static_cast<long long>(host) * L) - (host >= E ? chunks * ts.resident : 0));
    else EXPECT_LE(ts.prefill_placed_host, chunks * missing);
    EXPECT_EQ(ts.prefill_upload_bytes, static_cast<uint64_t>(ts.prefill_placed_uploaded) * expert) << "the others upload, once per chunk";
    if (ts.prefill_placed_host > 0) {
      EXPECT_GT(ts.misses, 0) << "the host's experts' pairs";
      EXPECT_GT(ts.prefill_host_ms, 0.0);
    }
    EXPECT_EQ(ts.pairs, ts.tokens * L * s.num_experts_per_tok) << "each pair counted once";
    for (const auto& p : test::tiny_goldens()["prompts"])
      EXPECT_EQ(test::greedy_tokens(et, p["ids"]), test::greedy_tokens(ew, p["ids"])) << "host " << host << " ring " << ring << " routed " << routed;
  }
}

// Hot host experts (CudaOptions::prefill_hot_pairs): with a threshold of
// 0 every host expert a token comes to is read over PCIe by the GPU after
// the router, with the uploaded experts' kernels, so the prompt's logits
// are those of every non-resident uploaded bit for bit and nothing goes to
// the host; with the auto threshold the results are any placement's
// (within the host kernels' error, the same greedy tokens).
TEST(CudaTier, HotHostExpertsAreReadOverPcieWithTheGpusKernels) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  MirroredModel mm(QuantFormat::I4_G32, "hot");
  ASSERT_NE(mm.loaded.mirror, nullptr);
  const Model& m = mm.model();
  const ModelSpec& s = m.spec();
  const long long all = static_cast<long long>(s.num_layers) * s.num_experts;
  auto whole = cuda::make_cuda_backend(m);
  Engine ew(s, *whole, 64);
  const float tol = std::max(1e-3f, 2 * cpu_quantization_error(m));
  auto make = [&](int host, int hot) {
    cuda::CudaOptions o = tier_options(m, all / 4);
    o.prefill_upload = true, o.prefill_ring_slots = 3, o.prefill_cpu_experts = host, o.prefill_hot_pairs = hot;
    o.host_regions.push_back(mm.region());
    return cuda::make_cuda_backend(m, o);
  };
  auto uploaded = make(0, -1), read = make(3, 0), automatic = make(3, -1);
  Engine eu(s, *uploaded, 64), er(s, *read, 64), ea(s, *automatic, 64);
  long long chunks = 0;
  for (const auto& p : test::tiny_goldens()["prompts"]) {
    const std::vector<int> ids = p["ids"];
    if (ids.size() < 4) continue;
    ++chunks;
    Session su = eu.new_session(), sr = er.new_session(), sa = ea.new_session(), sw = ew.new_session();
    const std::vector<float> lu = eu.forward(su, ids);
    EXPECT_EQ(max_abs_diff(lu, er.forward(sr, ids)), 0.0f) << "prompt " << ids.size();
    EXPECT_LT(max_abs_diff(ew.forward(sw, ids), ea.forward(sa, ids)), tol) << "prompt " << ids.size();
  }
  ASSERT_GT(chunks, 0);
  const TierStats tr = read->tier_stats(), ta = automatic->tier_stats();
  EXPECT_GT(tr.prefill_placed_host, 0) << "the host was given experts";
  EXPECT_GT(tr.prefill_hot_pcie, 0) << "and the GPU read them over PCIe";
  EXPECT_LE(tr.prefill_hot_pcie, tr.prefill_placed_host);
  EXPECT_EQ(tr.misses, 0) << "nothing went to the host";
  EXPECT_EQ(uploaded->tier_stats().prefill_hot_pcie, 0);
  EXPECT_LE(ta.prefill_hot_pcie, ta.prefill_placed_host);
  for (const auto& p : test::tiny_goldens()["prompts"]) EXPECT_EQ(test::greedy_tokens(ea, p["ids"]), test::greedy_tokens(ew, p["ids"]));
}

// A background pin (CudaOptions::pending_pin): the run starts pageable
// (no PCIe reads, prompts' misses on the host), switches between two
// chunks once the pin is there (PCIe reads in decode, prompt uploads
// straight from the pinned container), waits for it before a long prompt
// chunk that would upload, and stays pageable, uploads off, when it was
// refused. Logits within the host kernels' error of the whole model's
// throughout and the same greedy tokens; nothing stays registered.
TEST(CudaTier, ABackgroundPinSwitchesOverBetweenChunks) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  test::TempDir dir;
  const std::string path = dir / "m.coli";
  test::convert_all(test::data_dir() + "/tiny-qwen35moe-text", path, QuantFormat::I4_G32);
  auto m = Model::load(path);  // the container's read-only mapping
  const ModelSpec& s = m->spec();
  const long long all = static_cast<long long>(s.num_layers) * s.num_experts;
  const auto span = cli::host_span(*m);
  ASSERT_NE(span.first, nullptr);
  const std::size_t ranges = cuda::registered_host_ranges();
  auto whole = cuda::make_cuda_backend(*m);
  Engine ew(s, *whole, 256);
  const float tol = 2 * cpu_quantization_error(*m);
  const ExpertWeights& x = m->layer(0).moe.experts[0];
  const uint64_t expert = x.gate.bytes() + x.up.bytes() + x.down.bytes();
  auto options = [&](std::shared_future<cuda::HostPin> pin) {
    cuda::CudaOptions o = tier_options(*m, all / 4);
    o.max_chunk = 256;
    o.pcie_read_share = 0.5, o.prefill_upload = true;
    o.prefill_cpu_experts = 0;  // a prompt chunk after the switch uploads every non-resident
    o.read_only_host_regions.push_back(span);
    o.pending_pin = std::move(pin);
    return o;
  };
  const std::vector<int> ids = test::tiny_goldens()["prompts"][1]["ids"];
  ASSERT_GE(ids.size(), 4u);
  ASSERT_LT(ids.size(), static_cast<std::size_t>(cuda::CudaOptions::kPinWaitTokens));
  const std::vector<int> cont = test::greedy_tokens(ew, ids, 12);
  {
    std::promise<cuda::HostPin> promise;
    auto tier = cuda::make_cuda_backend(*m, options(promise.get_future().share()));
    Engine et(s, *tier, 256);
    Session sw = ew.new_session(), st = et.new_session();
    EXPECT_LT(max_abs_diff(ew.forward(sw, ids), et.forward(st, ids)), tol) << "the prompt on the pageable path";
    TierStats t0 = tier->tier_stats();
    EXPECT_TRUE(t0.pin_pending);
    EXPECT_EQ(t0.pinned_host_bytes, 0u);
    EXPECT_EQ(t0.pcie_read, 0) << "nothing readable over PCIe before the pin";
    EXPECT_EQ(t0.prefill_upload_bytes, 0u) << "a short prompt does not wait: its misses on the host";
    EXPECT_GT(t0.misses, 0);
    float e = 0;
    for (std::size_t i = 0; i < cont.size(); ++i) {
      if (i == 4) promise.set_value(cuda::HostPin(span.first, span.second, true));
      const std::vector<float> a = ew.forward(sw, std::vector<int>{cont[i]}), b = et.forward(st, std::vector<int>{cont[i]});
      e = std::max(e, max_abs_diff(a, b));
      EXPECT_EQ(std::max_element(b.begin(), b.end()) - b.begin(), std::max_element(a.begin(), a.end()) - a.begin()) << "step " << i;
    }
    EXPECT_LT(e, tol);
    const TierStats t1 = tier->tier_stats();
    EXPECT_FALSE(t1.pin_pending);
    EXPECT_EQ(t1.pin_switch_tokens, static_cast<long long>(ids.size() + 4)) << "taken over before the fifth decode step";
    EXPECT_GE(t1.pinned_host_bytes, span.second);
    EXPECT_EQ(t1.pcie_read, all - t1.resident) << "every expert outside the tier lies in the pinned container";
    EXPECT_GT(t1.pcie_misses, 0) << "decode steps read over PCIe after the switch";
    EXPECT_DOUBLE_EQ(t1.pin_wait_ms, 0.0);
    Session sw2 = ew.new_session(), st2 = et.new_session();
    EXPECT_EQ(max_abs_diff(ew.forward(sw2, ids), et.forward(st2, ids)), 0.0f) << "a prompt chunk now uploads: the whole model's kernels";
    EXPECT_EQ(tier->tier_stats().prefill_upload_bytes, static_cast<uint64_t>(all - t1.resident) * expert);
    EXPECT_EQ(test::greedy_tokens(et, ids), test::greedy_tokens(ew, ids));
  }
  {  // refused: pageable to the end, uploads off
    std::promise<cuda::HostPin> promise;
    promise.set_value(cuda::HostPin());
    auto tier = cuda::make_cuda_backend(*m, options(promise.get_future().share()));
    Engine et(s, *tier, 256);
    EXPECT_EQ(test::greedy_tokens(et, ids), test::greedy_tokens(ew, ids));
    const TierStats t = tier->tier_stats();
    EXPECT_FALSE(t.pin_pending);
    EXPECT_EQ(t.pin_switch_tokens, 0);
    EXPECT_FALSE(t.prefill_upload);
    EXPECT_EQ(t.pinned_host_bytes, 0u);
    EXPECT_EQ(t.pcie_read, 0);
    EXPECT_EQ(t.prefill_upload_bytes, 0u);
  }
  {  // a long prompt chunk waits for the pin, then uploads
    std::promise<void> go;  // the pin starts once the backend is made, and lasts at least 200 ms
    auto pin = std::async(std::launch::async, [&, started = go.get_future()] {
                 started.wait();
                 std::this_thread::sleep_for(std::chrono::milliseconds(200));
                 return cuda::HostPin(span.first, span.second, true);
               }).share();
    auto tier = cuda::make_cuda_backend(*m, options(pin));
    go.set_value();
    Engine et(s, *tier, 256);
    std::vector<int> longer;
    for (int i = 0; i < cuda::CudaOptions::kPinWaitTokens; ++i) longer.push_back(ids[i % ids.size()]);
    Session sw = ew.new_session(), st = et.new_session();
    EXPECT_EQ(max_abs_diff(ew.forward(sw, longer), et.forward(st, longer)), 0.0f);
    const TierStats t = tier->tier_stats();
    EXPECT_FALSE(t.pin_pending);
    EXPECT_EQ(t.pin_switch_tokens, 0);
    EXPECT_GT(t.pin_wait_ms, 0.0);
    EXPECT_EQ(t.prefill_upload_bytes, static_cast<uint64_t>(all - t.resident) * expert);
  }
  EXPECT_EQ(cuda::registered_host_ranges(), ranges) << "every registration released";
}

// The handoff served inline (CudaOptions::serve_handoff_inline, for
// compute-sanitizer's racecheck): the host's part computed on the calling
// thread after the post, graphs off. The same post and join kernels and the
// same host kernels, so the same logits as the threaded handoff and the
// same greedy tokens, with the same counts.
TEST(CudaTier, InlineHandoffMatchesTheThreadedOne) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  test::TempDir d;
  auto m = test::convert_all(test::data_dir() + "/tiny-qwen35moe-text", d / "m.coli", QuantFormat::I4_G32);
  const long long all = static_cast<long long>(m->spec().num_layers) * m->spec().num_experts;
  for (long long slots : {0LL, all / 4}) {
    auto threaded = cuda::make_cuda_backend(*m, tier_options(*m, slots));
    cuda::CudaOptions o = tier_options(*m, slots);
    o.serve_handoff_inline = true;
    auto served = cuda::make_cuda_backend(*m, o);
    Engine et(m->spec(), *threaded, 64), ei(m->spec(), *served, 64);
    for (const auto& p : test::tiny_goldens()["prompts"]) {
      const std::vector<int> ids = p["ids"];
      Session st = et.new_session(), si = ei.new_session();
      EXPECT_LE(max_abs_diff(et.forward(st, ids), ei.forward(si, ids)), 1e-5f) << "slots " << slots << " prompt " << ids.size();
      EXPECT_EQ(test::greedy_tokens(ei, ids), test::greedy_tokens(et, ids)) << "slots " << slots << " prompt " << ids.size();
    }
    const TierStats a = threaded->tier_stats(), b = served->tier_stats();
    EXPECT_EQ(a.pairs, b.pairs);
    EXPECT_EQ(a.misses, b.misses);
    EXPECT_EQ(a.handoffs, b.handoffs);
    EXPECT_GT(b.handoffs, 0) << "the inline path served the misses";
  }
}

// CudaOptions::fuse_decode: a decode step's router, routing and post in one
// kernel and the join inside the norm after it compute what the separate
// kernels do: bit for bit the same decode logits on the whole model, the
// same tier counts and logits within 1e-5 of their range under budgets
// that hand misses to the host (slots for a quarter of the experts, none)
// and split them with PCIe reads (the hybrid path is not bit-reproducible
// from run to run: the same configuration twice moved the fixture's logits
// by 1e-6 on the H200; printed below), at 16 experts (the fixture: a
// router of two blocks) and at 256 (the real count: 32 blocks, the 8-wide
// routing).
TEST(CudaTier, FusedDecodeKernelsKeepEveryLogit) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  SynthOptions so;
  so.layers = 4, so.vocab = 300, so.hidden = 256, so.experts = 256, so.top_k = 8, so.moe_inter = 64, so.shared_inter = 64;
  so.heads = 2, so.kv_heads = 1, so.head_dim = 32, so.lin_k_heads = 2, so.lin_v_heads = 4, so.lin_k_dim = 16, so.lin_v_dim = 16;
  MirroredModel fixture(QuantFormat::I4_G32, "fuse"), wide(so, "fuse-wide");
  for (const MirroredModel* mm : {&fixture, &wide}) {
    const Model& m = mm->model();
    const ModelSpec& s = m.spec();
    const long long all = static_cast<long long>(s.num_layers) * s.num_experts;
    const std::vector<int> ids = {11, 57, 203, 4, 98};
    struct Case {
      long long slots;  // -1: the whole model
      double pcie;
    };
    for (const Case c : {Case{-1, 0}, Case{all / 4, 0}, Case{0, 0}, Case{all / 4, 0.5}}) {
      std::vector<std::vector<float>> logits[3];
      TierStats st[3];
      for (const int run : {0, 1, 2}) {  // separate, fused, separate again
        const bool fuse = run == 1;
        cuda::CudaOptions o = c.slots < 0 ? cuda::CudaOptions{} : tier_options(m, c.slots);
        o.fuse_decode = fuse;
        if (c.pcie > 0) o.pcie_read_share = c.pcie, o.host_regions.push_back(mm->region());
        auto b = cuda::make_cuda_backend(m, o);
        Engine e(s, *b, 64);
        Session ss = e.new_session();
        std::vector<float> l = e.forward(ss, ids);
        for (int i = 0; i < 10; ++i) {
          const int tok = static_cast<int>(std::max_element(l.begin(), l.end()) - l.begin());
          l = e.forward(ss, std::vector<int>{tok});
          logits[run].push_back(l);
        }
        st[run] = b->tier_stats();
      }
      SCOPED_TRACE("experts " + std::to_string(s.num_experts) + " slots " + std::to_string(c.slots) + " pcie " + std::to_string(c.pcie));
      ASSERT_EQ(logits[0].size(), logits[1].size());
      float fused = 0, again = 0, range = 0;
      for (std::size_t i = 0; i < logits[0].size(); ++i) {
        fused = std::max(fused, max_abs_diff(logits[0][i], logits[1][i])), again = std::max(again, max_abs_diff(logits[0][i], logits[2][i]));
        for (float v : logits[0][i]) range = std::max(range, std::fabs(v));
      }
      std::printf("[ info     ] experts %d slots %lld pcie %.1f: max |dlogit| fused %.2e, separate again %.2e, of %.2e\n", s.num_experts, c.slots,
                  c.pcie, fused, again, range);
      if (c.slots < 0) {
        for (std::size_t i = 0; i < logits[0].size(); ++i) EXPECT_EQ(logits[0][i], logits[1][i]) << "decode step " << i;
      } else {
        EXPECT_LE(fused, 1e-5f * range);
      }
      EXPECT_EQ(st[0].pairs, st[1].pairs);
      EXPECT_EQ(st[0].misses, st[1].misses);
      EXPECT_EQ(st[0].handoffs, st[1].handoffs);
      EXPECT_EQ(st[0].pcie_misses, st[1].pcie_misses);
      if (c.slots >= 0) {
        EXPECT_GT(st[1].handoffs, 0) << "the host took misses";
      }
      if (c.pcie > 0) {
        EXPECT_GT(st[1].pcie_misses, 0) << "the device read misses over PCIe";
      }
    }
  }
}

// qwen3_moe and qwen3_next (issue 31) under the tier: synthetic models of
// each family with int4 experts, qwen3_next at its real expert count and
// top-k (512, 10: the routing's 16-wide path, 11 pairs a decode step with
// the shared expert folded in) and qwen3_moe with no shared expert, plain-w
// norms and ungated attention. A prompt whose every non-resident expert is
// uploaded gives the whole model's logits bit for bit; decode with the
// host's experts (slots for a quarter, none with PCIe reads) stays within
// the tolerance the fixture's tier tests hold.
TEST(CudaTier, OtherFamiliesKeepTheWholeModelsLogits) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  for (const ModelFamily f : {ModelFamily::kQwen3Moe, ModelFamily::kQwen3Next}) {
    SCOPED_TRACE(family_name(f));
    SynthOptions so = synth_shapes(SynthOptions{}, f);
    so.layers = 4, so.vocab = 300, so.hidden = 256, so.moe_inter = 64;
    so.experts = f == ModelFamily::kQwen3Next ? 512 : 32, so.top_k = f == ModelFamily::kQwen3Next ? 10 : 8;
    so.shared_inter = f == ModelFamily::kQwen3Next ? 64 : 0;
    so.heads = 4, so.kv_heads = 2, so.head_dim = 32, so.lin_k_heads = 2, so.lin_v_heads = 4, so.lin_k_dim = 32, so.lin_v_dim = 32;
    MirroredModel mm(so, std::string("family-") + family_name(f));
    const Model& m = mm.model();
    const ModelSpec& s = m.spec();
    ASSERT_EQ(s.family, f);
    const long long all = static_cast<long long>(s.num_layers) * s.num_experts;
    auto whole = cuda::make_cuda_backend(m);
    Engine ew(s, *whole, 64);
    std::vector<int> ids(40);
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int>((i * 131 + 7) % s.vocab_size);
    Session sw0 = ew.new_session();
    const std::vector<float> prompt_whole = ew.forward(sw0, ids);
    {  // the prompt's experts uploaded
      cuda::CudaOptions o = tier_options(m, all / 4);
      o.host_regions.push_back(mm.region());
      o.prefill_upload = true, o.prefill_cpu_experts = 0;
      auto b = cuda::make_cuda_backend(m, o);
      Engine eb(s, *b, 64);
      Session sb = eb.new_session();
      EXPECT_EQ(max_abs_diff(prompt_whole, eb.forward(sb, ids)), 0.0f) << "uploaded experts run the whole model's kernels";
      EXPECT_GT(b->tier_stats().prefill_upload_bytes, 0u);
    }
    for (const double pcie : {0.0, 0.5}) {
      cuda::CudaOptions o = tier_options(m, pcie > 0 ? 0 : all / 4);
      if (pcie > 0) o.pcie_read_share = pcie, o.host_regions.push_back(mm.region());
      auto b = cuda::make_cuda_backend(m, o);
      Engine eb(s, *b, 64);
      Session sw = ew.new_session(), sb = eb.new_session();
      std::vector<float> lw = ew.forward(sw, ids), lb = eb.forward(sb, ids);
      float e = max_abs_diff(lw, lb), range = 0;
      for (int i = 0; i < 8; ++i) {
        const int tok = static_cast<int>(std::max_element(lw.begin(), lw.end()) - lw.begin());
        lw = ew.forward(sw, std::vector<int>{tok}), lb = eb.forward(sb, std::vector<int>{tok});
        e = std::max(e, max_abs_diff(lw, lb));
        for (float v : lw) range = std::max(range, std::fabs(v));
      }
      const TierStats ts = b->tier_stats();
      std::printf("[ info     ] %s pcie %.1f: max |dlogit| %.2e of %.2e, %lld misses, %lld over PCIe\n", family_name(f), pcie, e, range, ts.misses,
                  ts.pcie_misses);
      EXPECT_GT(range, 0.0f);
      EXPECT_LT(e, 0.05f * range);
      EXPECT_GT(ts.misses, 0) << "the host took misses";
      if (pcie > 0) {
        EXPECT_GT(ts.pcie_misses, 0);
      }
      EXPECT_EQ(ts.pairs, ts.tokens * s.num_layers * s.num_experts_per_tok);
    }
  }
}

// The transformers fixtures of the other families under budgets. From a
// bf16 container (float activations everywhere) tiny-qwen3next and
// tiny-qwen3moe (dense MLP layers 0, 2, 4, 5, 6: the tier places only the
// sparse layers' experts, and counts only their pairs) keep the
// transformers greedy tokens with every expert on the host or a quarter
// resident. From int8 and int4-g32 containers (int8 activations on both
// the GPU's and the CPU's kernels) its prompt logits stay within twice the
// CPU reference's own quantization error of the whole model's at every
// placement, prompts' experts on the host or uploaded; its greedy tokens
// are not held there: the fixture's routing has near-ties (a 0.036 gap
// between the k-th and next expert) that the int8 kernels' differences
// flip (measured: the whole GPU itself leaves the goldens on the int8
// container's 60-token prompt). The same bound for tiny-qwen3moe.
TEST(CudaTier, OtherFamiliesFixturesUnderBudgets) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  for (const char* fixture : {"tiny-qwen3next", "tiny-qwen3moe"}) {
    SCOPED_TRACE(fixture);
    const nlohmann::json& g = test::goldens_of(fixture);
    {
      test::TempDir d;
      auto m = test::convert_all(test::data_dir() + "/" + fixture, d / "m.coli", QuantFormat::BF16);
      const long long routed = static_cast<long long>(m->spec().num_sparse_layers()) * m->spec().num_experts;
      for (long long slots : {0LL, routed / 4}) {
        auto tier = cuda::make_cuda_backend(*m, tier_options(*m, slots));
        Engine et(m->spec(), *tier, 64);
        test::expect_golden_prompts(et, std::string(fixture) + " bf16 slots " + std::to_string(slots) + ": ", g);
        const TierStats ts = tier->tier_stats();
        EXPECT_GT(ts.misses, 0);
        EXPECT_EQ(ts.experts, routed) << "a dense layer has no experts to place";
        EXPECT_EQ(ts.pairs, ts.tokens * m->spec().num_sparse_layers() * m->spec().num_experts_per_tok) << "routed pairs of the sparse layers only";
      }
    }
    for (QuantFormat f : {QuantFormat::I8, QuantFormat::I4_G32}) {
      test::TempDir d;
      auto m = test::convert_all(test::data_dir() + "/" + fixture, d / "m.coli", f);
      const long long routed = static_cast<long long>(m->spec().num_sparse_layers()) * m->spec().num_experts;
      float qerr = 0;
      {
        cpu::CpuBackend ref(*m);
        Engine e(m->spec(), ref);
        for (const auto& p : g["prompts"]) qerr = std::max(qerr, test::golden_logit_error(e, p));
      }
      auto whole = cuda::make_cuda_backend(*m);
      Engine ew(m->spec(), *whole, 64);
      for (long long slots : {0LL, routed / 4, routed / 2}) {
        for (const bool upload : {false, true}) {
          cuda::CudaOptions o = tier_options(*m, slots);
          if (upload) o.prefill_upload = true, o.prefill_ring_slots = 5;  // pageable container: staged copies
          auto tier = cuda::make_cuda_backend(*m, o);
          Engine et(m->spec(), *tier, 64);
          for (const auto& p : g["prompts"]) {
            const std::vector<int> ids = p["ids"];
            Session sw = ew.new_session(), st = et.new_session();
            const float err = max_abs_diff(ew.forward(sw, ids), et.forward(st, ids));
            const std::vector<int> a = test::greedy_tokens(et, ids), b = test::greedy_tokens(ew, ids);
            int same = 0;
            while (same < static_cast<int>(a.size()) && a[same] == b[same]) ++same;
            std::printf("[ info     ] %s %s slots %lld upload %d prompt %zu: max |dlogit| vs whole %.2e (bound %.2e), greedy equal for %d of 16\n",
                        fixture, format_name(f), slots, upload, ids.size(), err, 2 * qerr, same);
            EXPECT_LT(err, 2 * qerr) << format_name(f) << " slots " << slots << " upload " << upload << " prompt " << ids.size();
          }
          const TierStats ts = tier->tier_stats();
          EXPECT_EQ(ts.resident, slots);
          EXPECT_GT(ts.misses, 0);
          if (upload) {
            EXPECT_GT(ts.prefill_upload_bytes, 0u);
          }
        }
      }
    }
  }
}

// Host registrations are the process's, counted: two backends over one
// mirror register its pages once (the driver refuses a second
// registration, and every sanitizer reports the refusal), the last one to
// go unregisters them, and a backend whose construction fails after
// registering (a budget too small) leaves nothing registered.
TEST(CudaTier, BackendsShareOneRegistrationOfAMirror) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  MirroredModel mm(QuantFormat::I4_G32, "registry");
  ASSERT_NE(mm.loaded.mirror, nullptr);
  const Model& m = mm.model();
  const std::size_t before = cuda::registered_host_ranges();
  auto options = [&] {
    cuda::CudaOptions o = tier_options(m, 0);
    o.prefill_upload = true;  // copies from the mirror during the run: registered
    o.host_regions.push_back(mm.region());
    return o;
  };
  auto a = cuda::make_cuda_backend(m, options());
  EXPECT_EQ(cuda::registered_host_ranges(), before + 1);
  auto b = cuda::make_cuda_backend(m, options());
  EXPECT_EQ(cuda::registered_host_ranges(), before + 1) << "the second backend takes a reference, not a second registration";
  Engine eb(m.spec(), *b, 64);
  const std::vector<int> ids = test::tiny_goldens()["prompts"][0]["ids"];
  const std::vector<int> with_both = test::greedy_tokens(eb, ids);
  a.reset();
  EXPECT_EQ(cuda::registered_host_ranges(), before + 1) << "b still uses the pages";
  EXPECT_EQ(test::greedy_tokens(eb, ids), with_both);
  b.reset();
  EXPECT_EQ(cuda::registered_host_ranges(), before);
  cuda::CudaOptions tight = options();
  tight.expert_slots = -1, tight.vram_budget = 64 << 10;  // the trunk alone does not fit
  EXPECT_THROW(cuda::make_cuda_backend(m, tight), Error);
  EXPECT_EQ(cuda::registered_host_ranges(), before) << "a failed construction releases its registration";
}
