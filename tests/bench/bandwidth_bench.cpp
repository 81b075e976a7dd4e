// STREAM-like read bandwidth: the roofline for decode. Each thread sums its
// slice of a 2 GiB buffer (touched first, so it is resident) with 64-byte
// vector loads; bytes_per_second is the whole buffer over the wall time.
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <thread>
#include <vector>

#include "thread_pool.h"

namespace {

__attribute__((target("avx2"))) double sum_avx2(const float* p, std::size_t n) {
  __m256 a = _mm256_setzero_ps(), b = a, c = a, d = a;
  for (std::size_t i = 0; i + 32 <= n; i += 32) {
    a = _mm256_add_ps(a, _mm256_loadu_ps(p + i));
    b = _mm256_add_ps(b, _mm256_loadu_ps(p + i + 8));
    c = _mm256_add_ps(c, _mm256_loadu_ps(p + i + 16));
    d = _mm256_add_ps(d, _mm256_loadu_ps(p + i + 24));
  }
  float out[8];
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)));
  return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}

void BM_ReadBandwidth(benchmark::State& st) {
  const int threads = static_cast<int>(st.range(0));
  const std::size_t n = (std::size_t(2) << 30) / sizeof(float);
  static std::vector<float> buf(n, 1.0f);
  coli::cpu::ThreadPool pool(threads);
  std::vector<double> sums(threads);
  for (auto _ : st) {
    pool.run(threads, [&](int t) {
      const std::size_t per = n / threads;
      sums[t] = sum_avx2(buf.data() + per * t, per);
    });
    benchmark::DoNotOptimize(sums.data());
  }
  st.SetBytesProcessed(static_cast<int64_t>(n * sizeof(float)) * st.iterations());
}
BENCHMARK(BM_ReadBandwidth)->Arg(1)->Arg(2)->Arg(8)->Arg(15)->Arg(16)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
