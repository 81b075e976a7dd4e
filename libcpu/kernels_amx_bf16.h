// Prefill GEMM for bf16 weights (the router, bf16 containers) on AMX-BF16
// tiles (TDPBF16PS, Sapphire Rapids and later). A bf16 row needs no
// unpacking and has no per-block scale, so each 16x16 float accumulator
// stays in its tile over the whole row; the tile loads A straight from the
// matrix. x is split into bf16 hi + lo parts (x - hi - lo is within 2^-17
// of x) and both are multiplied: float-path accuracy at tile speed.
#pragma once
#include <cstdint>
#include <vector>

#include "model/weights.h"

namespace coli::cpu {

constexpr int kAmxBf16MinTokens = 16;  // a token tile's worth

bool amx_bf16_available();
bool amx_bf16_applies(const Matrix& W, int T);  // BF16, cols % 32 == 0, T >= kAmxBf16MinTokens, CPU

// x[T, cols] in the tiles' layout: per 16-token block and 32-column block,
// hi then lo, each 16 rows of (column pair) x 16 tokens x 2 bf16.
struct Bf16Acts {
  int T = 0;
  int64_t cols = 0;
  std::vector<uint16_t> B;  // [T/16][cols/32][2][512]
  void reset(int tokens, int64_t columns);
  int token_blocks() const { return (T + 15) / 16; }
};
void prepare_bf16_acts_blocks(const float* x, int tb0, int tb1, Bf16Acts* out);  // after reset
void prepare_bf16_acts(const float* x, int T, int64_t cols, Bf16Acts* out);
void matmul_rows_amx_bf16(const Matrix& W, const Bf16Acts& acts, int64_t r0, int64_t r1, float* y, int64_t ldy);

}  // namespace coli::cpu
