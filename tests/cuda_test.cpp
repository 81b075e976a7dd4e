// CUDA kernels against the CPU reference. Skipped, with the reason, where
// no device is usable (CI has none).
#include <gtest/gtest.h>

#include <random>

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
