#include "kernels.h"

#include <vector>

#include "cpu_features.h"
#include "ref_kernels.h"

namespace coli::cpu {

void group_sums(const float* x, int T, int64_t cols, float* xsum) {
  const int64_t nb = (cols + 31) / 32;
  for (int t = 0; t < T; ++t)
    for (int64_t j = 0; j < nb; ++j) {
      float s = 0;
      for (int64_t c = j * 32; c < std::min(cols, (j + 1) * 32); ++c) s += x[t * cols + c];
      xsum[t * nb + j] = s;
    }
}

void matmul_rows_scalar(const Matrix& W, const float* x, const float*, int T, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  thread_local std::vector<float> row;
  row.resize(W.cols);
  for (int64_t r = r0; r < r1; ++r) {
    W.row_f32(r, row.data());
    for (int t = 0; t < T; ++t) y[t * ldy + r] = dot(row.data(), x + t * W.cols, static_cast<int>(W.cols));
  }
}

void matmul_rows(const Matrix& W, const float* x, const float* xsum, int T, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  switch (active_level()) {
    case CpuLevel::kAvx512: return matmul_rows_avx512(W, x, xsum, T, r0, r1, y, ldy);
    case CpuLevel::kAvx2: return matmul_rows_avx2(W, x, xsum, T, r0, r1, y, ldy);
    default: return matmul_rows_scalar(W, x, xsum, T, r0, r1, y, ldy);
  }
}

}  // namespace coli::cpu
