// Prefill GEMM for the int4 formats on AMX tiles (Intel Sapphire Rapids
// and later): 16 weight rows x 16 tokens x 32 columns per tile multiply
// (TDPBUSD: the 4-bit codes as unsigned bytes, activations as the int8
// codes of QuantizedActs), scaled per 32-column block in AVX-512. Same
// arithmetic as the VNNI kernel, about an order of magnitude more
// multiply-adds per cycle. Used for 16 tokens or more where the CPU and the
// kernel (tile data permission) allow it.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels_vnni.h"
#include "model/weights.h"

namespace coli::cpu {

bool amx_available();
bool amx_applies(const Matrix& W, int T);

// Activations in the tiles' layout, prepared once per matmul and shared by
// every row block: per 16-token block and 32-column block, 8 rows of 16
// tokens x 4 bytes, and the tokens' scales for that block.
struct AmxActs {
  int T = 0;
  int64_t cols = 0;
  std::vector<int8_t> B;     // [T/16][cols/32][512]
  std::vector<float> sx;     // [T/16][cols/32][16]
  std::vector<float> bsum;   // [T/16][cols/32][16]: scale x sum of codes
};
void prepare_amx_acts(const QuantizedActs& qa, AmxActs* out);
void matmul_rows_amx(const Matrix& W, const AmxActs& acts, int64_t r0, int64_t r1, float* y, int64_t ldy);

}  // namespace coli::cpu
