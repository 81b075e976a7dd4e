// GEMV and GEMM for the int4 formats on AVX512-VNNI: activations quantized to
// int8 per block of 32 columns (scale absmax/127), weights' 4-bit codes used
// directly as the unsigned operand of vpdpbusd, four blocks per instruction.
// About 4x fewer instructions per weight than the float path; the price is
// the activation rounding (relative error ~1/254 of each block's largest
// value). Applies when the CPU has AVX512-VNNI and cols % 128 == 0.
#pragma once
#include <cstdint>
#include <vector>

#include "model/weights.h"

namespace coli::cpu {

// x quantized for the VNNI kernel: per token, per 128-column superblock, the
// 64 even-column and 64 odd-column codes of its four 32-column blocks, the
// four block scales spread over 16 lanes (4 each), and per block the sum of
// the quantized values times the scale (for the code offset / minimum term).
struct QuantizedActs {
  int T = 0;
  int64_t cols = 0;
  std::vector<int8_t> codes;   // [T][cols/128][128]: even 64, then odd 64
  std::vector<float> lanes;    // [T][cols/128][16]
  std::vector<float> bsum;     // [T][cols/32]
  void resize(int tokens, int64_t columns);
};

bool vnni_available();
// Whether the VNNI kernel serves W for T tokens (any T: decode, and prefill
// in groups of 4 tokens per weight load).
bool vnni_applies(const Matrix& W, int T);
bool vnni_applies_gemm(const Matrix& W);
void quantize_acts(const float* x, int T, int64_t cols, QuantizedActs* out);  // resize + all rows
// Rows [t0, t1) of x (x points at row 0) into qa, already sized; disjoint
// ranges may run in parallel.
void quantize_acts_rows(const float* x, int t0, int t1, QuantizedActs* qa);
// Tuning for benchmarks: software prefetch distance ahead of a row's codes
// (0: none; default 2048) and whether the scale rows are prefetched too.
void set_vnni_prefetch(int bytes, bool scales);
// col0 > 0: the activations' columns below col0 are all zero (a decode
// expert split with the device, ExpertPair::first_row); the 128-column
// superblocks wholly below it are skipped, which adds exactly the zeros
// the full product would (the same values, fewer weight bytes read).
void matmul_rows_vnni(const Matrix& W, const QuantizedActs& qa, int64_t r0, int64_t r1, float* y, int64_t ldy, int64_t col0 = 0);

}  // namespace coli::cpu
