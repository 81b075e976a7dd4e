// Fast matrix kernels for every weight format, dispatched on the CPU level.
//
// matmul_rows computes y[t * ldy + r] = W[r, :] . x[t, :] for rows r in
// [r0, r1) and tokens t < T (x rows are W.cols floats). Decode (T <= 4)
// takes dot products straight from the quantized codes; larger T dequantize
// a panel of rows once and reuse it for every token. Results equal the
// scalar reference (dequantize_row, then a float dot) up to float rounding.
#pragma once
#include <cstdint>

#include "model/weights.h"

namespace coli::cpu {

// Per-token sums of x over each group of 32 columns, which the int4 kernels
// fold in for the code offset (sym) or the minimum (asym). Layout:
// xsum[t * ceil(cols / 32) + j].
void group_sums(const float* x, int T, int64_t cols, float* xsum);

void matmul_rows(const Matrix& W, const float* x, const float* xsum, int T, int64_t r0, int64_t r1, float* y, int64_t ldy);

// Level-specific implementations (kernels_*.cpp).
void matmul_rows_scalar(const Matrix& W, const float* x, const float* xsum, int T, int64_t r0, int64_t r1, float* y, int64_t ldy);
void matmul_rows_avx512(const Matrix& W, const float* x, const float* xsum, int T, int64_t r0, int64_t r1, float* y, int64_t ldy);
void matmul_rows_avx2(const Matrix& W, const float* x, const float* xsum, int T, int64_t r0, int64_t r1, float* y, int64_t ldy);

}  // namespace coli::cpu
