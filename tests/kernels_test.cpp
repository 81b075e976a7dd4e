// The CPU kernels at every level this machine has, against the scalar
// reference (dequantize_row, then a dot product in double), on random
// inputs, odd sizes included.
#include "kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "cpu_features.h"
#include "thread_pool.h"

using namespace coli;
using namespace coli::cpu;

namespace {
const QuantFormat kFormats[] = {QuantFormat::F32, QuantFormat::BF16, QuantFormat::F16, QuantFormat::I8, QuantFormat::I4,
                                QuantFormat::I4_G32, QuantFormat::I4_G64, QuantFormat::I4_G128, QuantFormat::I4_G32_ASYM,
                                QuantFormat::I4_G64_ASYM, QuantFormat::I4_G128_ASYM};

struct LevelGuard {
  CpuLevel saved = active_level();
  ~LevelGuard() { set_active_level(saved); }
};

// A random [rows, cols] weight matrix quantized to f, and T random token vectors.
struct RandomProblem {
  std::vector<float> w, x;
  std::vector<uint8_t> q;
  Matrix m;
  RandomProblem(std::mt19937& rng, QuantFormat f, int64_t rows, int64_t cols, int T) : w(rows * cols), x(T * cols) {
    std::normal_distribution<float> nd;
    for (auto& v : w) v = nd(rng) * 0.05f;
    for (auto& v : x) v = nd(rng);
    q.resize(layout_of(f, rows, cols).total);
    quantize_matrix(f, w.data(), rows, cols, q.data());
    m = Matrix{f, q.data(), rows, cols, nullptr};
  }
};
}  // namespace

TEST(Kernels, EveryFormatEveryLevelMatchesReference) {
  LevelGuard guard;
  std::mt19937 rng(99);
  std::normal_distribution<float> nd;
  int checked_levels = 0;
  for (CpuLevel level : {CpuLevel::kScalar, CpuLevel::kAvx2, CpuLevel::kAvx512}) {
    if (level > detected_level()) continue;
    set_active_level(level);
    ++checked_levels;
    for (QuantFormat f : kFormats)
      for (int64_t cols : {32, 33, 64, 96, 130, 256, 2048})
        for (int T : {1, 2, 3, 4, 5, 9}) {
          const int64_t rows = 7;
          std::vector<float> w(rows * cols), x(T * cols);
          for (auto& v : w) v = nd(rng) * 0.05f;
          for (auto& v : x) v = nd(rng);
          std::vector<uint8_t> q(layout_of(f, rows, cols).total);
          quantize_matrix(f, w.data(), rows, cols, q.data());
          const Matrix m{f, q.data(), rows, cols, nullptr};
          std::vector<float> xsum(T * ((cols + 31) / 32)), y(T * rows, NAN);
          group_sums(x.data(), T, cols, xsum.data());
          matmul_rows(m, x.data(), xsum.data(), T, 1, rows, y.data(), rows);  // rows 1..6: r0 > 0 too
          std::vector<float> row(cols);
          for (int64_t r = 1; r < rows; ++r) {
            m.row_f32(r, row.data());
            for (int t = 0; t < T; ++t) {
              double ref = 0, mag = 0;
              for (int64_t c = 0; c < cols; ++c) ref += double(row[c]) * x[t * cols + c], mag += std::fabs(double(row[c]) * x[t * cols + c]);
              ASSERT_NEAR(y[t * rows + r], ref, 1e-5 * mag + 1e-6)
                  << level_name(level) << " " << format_name(f) << " cols=" << cols << " T=" << T << " r=" << r << " t=" << t;
            }
          }
          for (int t = 0; t < T; ++t) ASSERT_TRUE(std::isnan(y[t * rows]));  // row 0 untouched
        }
  }
  std::printf("[ info     ] kernel levels checked: %d (detected %s)\n", checked_levels, level_name(detected_level()));
}

TEST(ThreadPool, RunsEveryJobOnceAcrossManyRuns) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> hits(1000);
  for (int round = 0; round < 200; ++round) {
    const int n = 1 + round * 5 % 1000;
    pool.run(n, [&](int i) { hits[i].fetch_add(1); });
  }
  int total = 0;
  for (auto& h : hits) total += h.load();
  int expect = 0;
  for (int round = 0; round < 200; ++round) expect += 1 + round * 5 % 1000;
  EXPECT_EQ(total, expect);
  // Idle long enough for workers to sleep, then run again.
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::atomic<int> n{0};
  pool.run(64, [&](int) { n.fetch_add(1); });
  EXPECT_EQ(n.load(), 64);
}

// Hot (set_hot) keeps workers spinning past the sleep time and wakes
// sleeping ones; every run still does every job once, hot or cold, with
// the workers asleep or awake when it starts, and the pool stops cleanly
// while hot.
TEST(ThreadPool, HotAndColdRunsDoEveryJob) {
  auto pool = std::make_unique<ThreadPool>(4);
  std::atomic<int> n{0};
  int expect = 0;
  for (bool hot : {true, false, true, true, false}) {
    pool->set_hot(hot);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // past the 200 us spin
    for (int r = 0; r < 50; ++r) pool->run(37, [&](int) { n.fetch_add(1); }), expect += 37;
    EXPECT_EQ(n.load(), expect) << (hot ? "hot" : "cold");
  }
  pool->set_hot(true);
  pool.reset();  // joins hot workers
}

#include "kernels_vnni.h"

TEST(Kernels, VnniInt4AndInt8MatchTheSameMathInFloat) {
  if (!coli::cpu::vnni_available()) GTEST_SKIP() << "no AVX512-VNNI on this CPU";
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (QuantFormat f : {QuantFormat::I4, QuantFormat::I4_G32, QuantFormat::I4_G64, QuantFormat::I4_G128, QuantFormat::I4_G32_ASYM,
                        QuantFormat::I4_G64_ASYM, QuantFormat::I4_G128_ASYM, QuantFormat::I8})
    for (int64_t cols : {128, 512, 2048})
      for (int T : {1, 2, 4}) {
        const int64_t rows = 9;
        RandomProblem p(rng, f, rows, cols, T);
        const Matrix& m = p.m;
        const std::vector<float>& x = p.x;
        if (f == QuantFormat::I8 && !vnni_applies(m, T)) continue;  // needs AVX512-VBMI too
        ASSERT_TRUE(vnni_applies(m, T));
        QuantizedActs qa;
        quantize_acts(x.data(), T, cols, &qa);
        std::vector<float> y(T * rows, NAN);
        matmul_rows_vnni(m, qa, 0, rows, y.data(), rows);
        // The activations the kernel saw, back in column order.
        std::vector<float> xq(T * cols);
        for (int t = 0; t < T; ++t)
          for (int64_t c = 0; c < cols; ++c) {
            const int64_t sb = c / 128, k = (c % 128) / 32, i = (c % 32) / 2;
            const int8_t code = qa.codes[(t * (cols / 128) + sb) * 128 + (c % 2 ? 64 : 0) + k * 16 + i];
            xq[t * cols + c] = code * qa.lanes[(t * (cols / 128) + sb) * 16 + k * 4];
          }
        std::vector<float> row(cols);
        for (int64_t r = 0; r < rows; ++r) {
          m.row_f32(r, row.data());
          for (int t = 0; t < T; ++t) {
            double same = 0, exact = 0, mag = 0;
            for (int64_t c = 0; c < cols; ++c) {
              same += double(row[c]) * xq[t * cols + c];
              exact += double(row[c]) * x[t * cols + c];
              mag += std::fabs(double(row[c]) * x[t * cols + c]);
            }
            ASSERT_NEAR(y[t * rows + r], same, 2e-5 * mag + 1e-6) << format_name(f) << " cols=" << cols << " T=" << T;
            ASSERT_NEAR(y[t * rows + r], exact, 1e-2 * mag) << format_name(f);  // activation rounding only
          }
        }
      }
}

#include "deltanet_step.h"

TEST(Kernels, DeltaNetStepMatchesReference) {
  std::mt19937 rng(17);
  std::normal_distribution<float> nd;
  for (int dv : {16, 128, 48})
    for (int dk : {8, 128}) {
      std::vector<float> S(dk * dv), S2, q(dk), k(dk), v(dv), o(dv), o2(dv);
      for (auto& x : S) x = nd(rng);
      for (auto& x : q) x = nd(rng);
      for (auto& x : k) x = nd(rng) * 0.1f;
      for (auto& x : v) x = nd(rng);
      S2 = S;
      for (int step = 0; step < 3; ++step) {
        gdn_head_step(S.data(), q.data(), k.data(), v.data(), 0.7f, 0.9f, dk, dv, o.data());
        gdn_head_step_ref(S2.data(), q.data(), k.data(), v.data(), 0.7f, 0.9f, dk, dv, o2.data());
        for (int j = 0; j < dv; ++j) ASSERT_NEAR(o[j], o2[j], 1e-4f * (1 + std::fabs(o2[j]))) << dk << "x" << dv;
        for (int i = 0; i < dk * dv; ++i) ASSERT_NEAR(S[i], S2[i], 1e-4f * (1 + std::fabs(S2[i])));
      }
    }
}

#include "deltanet_chunk.h"

// The chunked form against token steps of the reference, with mild and
// strong decays (log decay down to -8 per token) and ragged chunk sizes.
TEST(Kernels, DeltaNetChunkEqualsTokenSteps) {
  std::mt19937 rng(23);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  for (float max_decay : {0.1f, 8.0f})
    for (int n : {1, 17, kGdnChunk})
      for (int dv : {128, 48}) {
        const int dk = 32, ld = 2 * dk + dv + 5;  // q | k | v rows with padding, as in the conv output
        std::vector<float> S(dk * dv), S2, rows(n * ld), beta(n), g(n), o(n * dv), o2(dv);
        for (auto& x : S) x = nd(rng);
        for (auto& x : rows) x = nd(rng);
        for (int t = 0; t < n; ++t) {  // L2-normalised q (scaled) and k, as the layer feeds them
          for (float* p : {rows.data() + t * ld, rows.data() + t * ld + dk}) {
            float ss = 0;
            for (int i = 0; i < dk; ++i) ss += p[i] * p[i];
            for (int i = 0; i < dk; ++i) p[i] /= std::sqrt(ss);
          }
          beta[t] = ud(rng);
          g[t] = -max_decay * ud(rng);
        }
        S2 = S;
        gdn_head_chunk(S.data(), rows.data(), rows.data() + dk, ld, rows.data() + 2 * dk, ld, beta.data(), g.data(), n, dk, dv, o.data());
        for (int t = 0; t < n; ++t) {
          const float* r = rows.data() + t * ld;
          gdn_head_step_ref(S2.data(), r, r + dk, r + 2 * dk, beta[t], std::exp(g[t]), dk, dv, o2.data());
          for (int j = 0; j < dv; ++j) ASSERT_NEAR(o[t * dv + j], o2[j], 1e-4f * (1 + std::fabs(o2[j]))) << "n=" << n << " t=" << t << " dv=" << dv;
        }
        for (int i = 0; i < dk * dv; ++i) ASSERT_NEAR(S[i], S2[i], 1e-4f * (1 + std::fabs(S2[i]))) << "n=" << n;
      }
}

TEST(ThreadPool, StaticRunsKeepJobsOnTheirThread) {
  ThreadPool pool(3);
  std::vector<std::thread::id> first(12), again(12);
  pool.run_static(12, [&](int i) { first[i] = std::this_thread::get_id(); });
  pool.run_static(12, [&](int i) { again[i] = std::this_thread::get_id(); });
  EXPECT_EQ(first, again);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(first[i], first[i % 3]);  // job i on thread i % 3
}

#include "kernels_amx.h"

TEST(Kernels, AmxMatchesTheVnniKernel) {
  if (!coli::cpu::amx_available()) GTEST_SKIP() << "no AMX-INT8 (or no tile permission) on this CPU";
  std::mt19937 rng(8);
  std::normal_distribution<float> nd;
  for (QuantFormat f : {QuantFormat::I4, QuantFormat::I4_G32, QuantFormat::I4_G64, QuantFormat::I4_G128_ASYM, QuantFormat::I4_G32_ASYM, QuantFormat::I8})
    for (int64_t rows : {16, 37})
      for (int T : {1, 16, 21, 48}) {
        const int64_t cols = 512;
        RandomProblem p(rng, f, rows, cols, T);
        const Matrix& m = p.m;
        const std::vector<float>& x = p.x;
        QuantizedActs qa;
        quantize_acts(x.data(), T, cols, &qa);
        std::vector<float> ya(T * rows, NAN), yv(T * rows, NAN);
        AmxActs aa;
        prepare_amx_acts(qa, &aa);
        matmul_rows_amx(m, aa, 3, rows, ya.data(), rows);
        matmul_rows_vnni(m, qa, 3, rows, yv.data(), rows);
        for (int t = 0; t < T; ++t)
          for (int64_t r = 3; r < rows; ++r) ASSERT_NEAR(ya[t * rows + r], yv[t * rows + r], 1e-4f * (1 + std::fabs(yv[t * rows + r]))) << format_name(f) << " T=" << T;
        for (int t = 0; t < T; ++t) ASSERT_TRUE(std::isnan(ya[t * rows + 2]));
      }
}

#include "kernels_amx_bf16.h"
#include "ref_kernels.h"

// bf16 weights on AMX-BF16 tiles (x split into bf16 hi + lo) against the
// scalar reference matmul: rows not a multiple of 16 or 32, a row range
// starting at 3, token counts not a multiple of 16.
TEST(Kernels, AmxBf16MatchesTheReference) {
  if (!coli::cpu::amx_bf16_available()) GTEST_SKIP() << "no AMX-BF16 (or no tile permission) on this CPU";
  std::mt19937 rng(5);
  for (int64_t rows : {16, 37, 64})
    for (int64_t cols : {64, 512})
      for (int T : {16, 21, 48}) {
        RandomProblem p(rng, QuantFormat::BF16, rows, cols, T);
        std::vector<float> ya(T * rows, NAN), yr(T * rows);
        coli::cpu::Bf16Acts acts;
        coli::cpu::prepare_bf16_acts(p.x.data(), T, cols, &acts);
        coli::cpu::matmul_rows_amx_bf16(p.m, acts, 3, rows, ya.data(), rows);
        coli::cpu::matmul(p.m, p.x.data(), T, yr.data());
        for (int t = 0; t < T; ++t) {
          ASSERT_TRUE(std::isnan(ya[t * rows + 2])) << "row outside the range written";
          for (int64_t r = 3; r < rows; ++r)
            ASSERT_NEAR(ya[t * rows + r], yr[t * rows + r], 2e-5f * (1 + std::fabs(yr[t * rows + r]))) << rows << "x" << cols << " T=" << T << " r=" << r;
        }
      }
}
