// Prefill GEMM speed of the VNNI and AMX kernels: y[T, rows] = x[T, cols] W^T on
// one thread, W int4-g32 or int8 [rows, 2048]. items_per_second counts multiply-adds.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "kernels_amx.h"
#include "kernels_vnni.h"

namespace {

template <bool kAmx, coli::QuantFormat kF>
void gemm(benchmark::State& st) {
  if (kAmx ? !coli::cpu::amx_available() : !coli::cpu::vnni_available()) {
    st.SkipWithError(kAmx ? "no AMX-INT8" : "no AVX512-VNNI");
    return;
  }
  const int64_t rows = st.range(0), cols = 2048;
  const int T = static_cast<int>(st.range(1));
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> w(rows * cols), x(T * cols), y(T * rows);
  for (auto& v : w) v = nd(rng) * 0.02f;
  for (auto& v : x) v = nd(rng);
  std::vector<uint8_t> q(coli::layout_of(kF, rows, cols).total);
  coli::quantize_matrix(kF, w.data(), rows, cols, q.data());
  const coli::Matrix m{kF, q.data(), rows, cols, nullptr};
  coli::cpu::QuantizedActs qa;
  coli::cpu::quantize_acts(x.data(), T, cols, &qa);
  coli::cpu::AmxActs aa;
  if (kAmx) coli::cpu::prepare_amx_acts(qa, &aa);
  for (auto _ : st) {
    if (kAmx) coli::cpu::matmul_rows_amx(m, aa, 0, rows, y.data(), rows);
    else coli::cpu::matmul_rows_vnni(m, qa, 0, rows, y.data(), rows);
    benchmark::DoNotOptimize(y.data());
  }
  st.SetItemsProcessed(static_cast<int64_t>(rows * cols * T) * st.iterations());
}
void BM_GemmVnni(benchmark::State& st) { gemm<false, coli::QuantFormat::I4_G32>(st); }
void BM_GemmAmx(benchmark::State& st) { gemm<true, coli::QuantFormat::I4_G32>(st); }
void BM_GemmVnniI8(benchmark::State& st) { gemm<false, coli::QuantFormat::I8>(st); }
void BM_GemmAmxI8(benchmark::State& st) { gemm<true, coli::QuantFormat::I8>(st); }
BENCHMARK(BM_GemmVnni)->ArgsProduct({{512, 2048}, {1, 2, 3, 4, 8, 16, 64, 256}})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GemmAmx)->ArgsProduct({{512, 2048}, {4, 8, 16, 64, 256}})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GemmVnniI8)->ArgsProduct({{2048}, {1, 2, 3, 4, 16, 256}})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GemmAmxI8)->ArgsProduct({{2048}, {4, 16, 256}})->Unit(benchmark::kMillisecond);

}  // namespace
