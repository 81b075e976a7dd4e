// Prefill GEMM for the int4 formats and int8 on AMX tiles (Intel Sapphire
// Rapids and later): per 32-column block, 16 weight rows x 16 tokens x 32
// codes per tile product (TDPBUSD: weight codes unsigned, int4 as they are
// and int8 with the sign bit flipped; activations as the int8 codes of
// QuantizedActs). Per-block scales cannot be accumulated in int32, so each
// block's product is stored and scaled in AVX-512, the code offset taken
// off there with the block's sum of x. Same arithmetic as the VNNI kernel.
// Used for prefill where the CPU and the kernel (tile data permission)
// allow it.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels_vnni.h"
#include "model/weights.h"

namespace coli::cpu {

// The tile kernel beats VNNI from this many tokens on (a tile holds 16,
// fewer are padded): single core, int4-g32 2048 columns, see docs/perf/cpu.md.
constexpr int kAmxMinTokens = 8;

bool amx_available();
bool amx_applies(const Matrix& W, int T);  // format, T >= kAmxMinTokens, CPU

// Activations in the tiles' layout, prepared once per matmul and shared by
// every row block: per 16-token block and 32-column block, 8 rows of 16
// tokens x 4 codes, the tokens' scales and scaled sums of codes.
struct AmxActs {
  int T = 0;
  int64_t cols = 0;
  std::vector<int8_t> B;     // [T/16][cols/32][512]
  std::vector<float> sx;     // [T/16][cols/32][16]
  std::vector<float> bsum;   // [T/16][cols/32][16]: scale x sum of codes
  // Sizes the arrays for qa (its T and cols); then fill token blocks with
  // prepare_amx_acts_blocks, in parallel if wanted.
  void reset(const QuantizedActs& qa);
  int token_blocks() const { return (T + 15) / 16; }
};
void prepare_amx_acts_blocks(const QuantizedActs& qa, int tb0, int tb1, AmxActs* out);
void prepare_amx_acts(const QuantizedActs& qa, AmxActs* out);  // reset + all blocks
void matmul_rows_amx(const Matrix& W, const AmxActs& acts, int64_t r0, int64_t r1, float* y, int64_t ldy);

}  // namespace coli::cpu
