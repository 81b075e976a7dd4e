// Decode GEMV speed per weight format: y = W x for a [rows, 2048] matrix
// larger than the caches, on a thread pool; bytes_per_second counts the
// matrix's bytes (codes and scales), the roofline quantity for decode.
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels.h"
#include "thread_pool.h"

namespace {

using coli::QuantFormat;

void BM_Gemv(benchmark::State& st) {
  const auto f = static_cast<QuantFormat>(st.range(0));
  const int threads = static_cast<int>(st.range(1));
  const int64_t rows = 65536, cols = 2048;
  std::vector<float> w(static_cast<std::size_t>(cols) * 256), x(cols);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (auto& v : w) v = nd(rng) * 0.02f;
  for (auto& v : x) v = nd(rng);
  const auto l = coli::layout_of(f, rows, cols);
  std::vector<uint8_t> q(l.total);
  // Quantize 256 distinct rows and repeat them (values do not change the speed).
  std::vector<uint8_t> blk(coli::layout_of(f, 256, cols).total);
  coli::quantize_matrix(f, w.data(), 256, cols, blk.data());
  const auto bl = coli::layout_of(f, 256, cols);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(q.data() + r * l.row_stride, blk.data() + (r % 256) * bl.row_stride, l.row_stride);
    if (l.scale_row_bytes) std::memcpy(q.data() + l.scale_offset + r * l.scale_row_bytes, blk.data() + bl.scale_offset + (r % 256) * bl.scale_row_bytes, l.scale_row_bytes);
  }
  const coli::Matrix m{f, q.data(), rows, cols, nullptr};
  std::vector<float> xsum((cols + 31) / 32), y(rows);
  coli::cpu::group_sums(x.data(), 1, cols, xsum.data());
  coli::cpu::ThreadPool pool(threads);
  const int jobs = threads * 8;
  for (auto _ : st) {
    pool.run(jobs, [&](int j) {
      const int64_t r0 = rows * j / jobs, r1 = rows * (j + 1) / jobs;
      coli::cpu::matmul_rows(m, x.data(), xsum.data(), 1, r0, r1, y.data(), rows);
    });
    benchmark::DoNotOptimize(y.data());
  }
  st.SetBytesProcessed(static_cast<int64_t>(l.total) * st.iterations());
  st.SetLabel(coli::format_name(f));
}
BENCHMARK(BM_Gemv)
    ->ArgsProduct({{static_cast<int>(QuantFormat::BF16), static_cast<int>(QuantFormat::I8), static_cast<int>(QuantFormat::I4_G32),
                    static_cast<int>(QuantFormat::I4_G64)},
                   {1, 2, 16}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
