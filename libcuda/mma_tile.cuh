// Tensor-core tiles for prefill: int4 / int8 weights times int8 activations
// (QuantX, one scale per 32 columns) on mma.sync m16n8k32 (s8 x s8 -> s32,
// sm_80 and later). One mma covers one 32-column block, so every block's
// exact integer dot is scaled by its weight and activation scales before it
// joins the float accumulator: the same arithmetic as the dp4a row dots
// (dev_matrix.cuh), only many tokens at once.
//
// Fragment layout (PTX ISA, m16n8k32 .s8): lane = 4 g + i (g = lane / 4).
// A words: a0 (row g, k-word i), a1 (row g+8, k-word i), a2 (row g,
// k-word 4+i), a3 (row g+8, k-word 4+i); B words: b0 (k-word i, token g),
// b1 (k-word 4+i, token g); C: c0, c1 (row g, tokens 2i, 2i+1), c2, c3
// (row g+8, tokens 2i, 2i+1). The order of k inside a block is free as long
// as A and B agree: k-word i is the weights' word 2i of the block and
// k-word 4+i word 2i+1, so each lane reads one 4-byte word of an int4 row
// (its low nibbles are word 2i, its high nibbles word 2i+1, the quantizer's
// nibble order) or 8 bytes of an int8 row, and 8 bytes of each token's codes.
#pragma once
#include <cstdint>

#include "dev_matrix.cuh"

namespace coli::cuda {

__device__ __forceinline__ void mma_s8_16x8x32(int (&c)[4], const uint32_t (&a)[4], int b0, int b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();  // the host picks these kernels only on sm_80+ (mma_supported())
#endif
}

// Nibbles 0..15 in each byte as signed bytes code - 8 (no carries between
// bytes: code + 0x78 <= 0x87).
__device__ __forceinline__ uint32_t nibbles_minus_8(uint32_t v) { return (v + 0x78787878u) ^ 0x80808080u; }

// acc[j][*] += W[r0 .. r0+16) . x(tokens of n-tile j) over all columns, for
// the n-tiles j < ntiles (warp-uniform). brow[j]: the QuantX row this lane
// feeds as token g of tile j; crow[j][s]: the QuantX row of token 2i+s (its
// scale and code sum). Rows past W.rows are read clamped; the caller drops
// their results. W: int4 or int8, cols % 32 == 0.
template <Kind K, bool kAsym, int NT>
__device__ __forceinline__ void mma_rows_tokens(const DevMatrix& W, int r0, const QuantX& q, const int (&brow)[NT], const int (&crow)[NT][2],
                                                int ntiles, float (&acc)[NT][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, i = lane & 3, nb = W.cols / 32;
  const int ra = min(r0 + g, W.rows - 1), rb = min(r0 + g + 8, W.rows - 1);
  const uint8_t* pa = W.data + static_cast<long long>(ra) * W.row_stride;
  const uint8_t* pb = W.data + static_cast<long long>(rb) * W.row_stride;
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll 2
  for (int b = 0; b < nb; ++b) {
    uint32_t a[4];
    float sa = 1.0f, sb = 1.0f, ma = 0.0f, mb = 0.0f;
    if constexpr (K == Kind::kI4) {
      const uint32_t ua = __ldg(reinterpret_cast<const uint32_t*>(pa + b * 16 + i * 4));
      const uint32_t ub = __ldg(reinterpret_cast<const uint32_t*>(pb + b * 16 + i * 4));
      const uint32_t la = ua & 0x0F0F0F0Fu, ha = (ua >> 4) & 0x0F0F0F0Fu, lb = ub & 0x0F0F0F0Fu, hb = (ub >> 4) & 0x0F0F0F0Fu;
      if (kAsym) a[0] = la, a[1] = lb, a[2] = ha, a[3] = hb;
      else a[0] = nibbles_minus_8(la), a[1] = nibbles_minus_8(lb), a[2] = nibbles_minus_8(ha), a[3] = nibbles_minus_8(hb);
      int4_scale(W, ra, b * 32, &sa, &ma);
      int4_scale(W, rb, b * 32, &sb, &mb);
    } else {
      const uint2 ua = __ldg(reinterpret_cast<const uint2*>(pa + b * 32 + i * 8));
      const uint2 ub = __ldg(reinterpret_cast<const uint2*>(pb + b * 32 + i * 8));
      a[0] = ua.x, a[1] = ub.x, a[2] = ua.y, a[3] = ub.y;
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      if (j >= ntiles) break;
      const int2 xb = *reinterpret_cast<const int2*>(q.codes + (static_cast<long long>(brow[j]) * nb + b) * 32 + i * 8);
      int c[4] = {0, 0, 0, 0};
      mma_s8_16x8x32(c, a, xb.x, xb.y);
      const long long q0 = static_cast<long long>(crow[j][0]) * nb + b, q1 = static_cast<long long>(crow[j][1]) * nb + b;
      const float x0 = q.scale[q0], x1 = q.scale[q1];
      if constexpr (K == Kind::kI8) {
        acc[j][0] += x0 * static_cast<float>(c[0]), acc[j][1] += x1 * static_cast<float>(c[1]);
        acc[j][2] += x0 * static_cast<float>(c[2]), acc[j][3] += x1 * static_cast<float>(c[3]);
      } else if constexpr (kAsym) {
        const float s0 = static_cast<float>(q.sum[q0]), s1 = static_cast<float>(q.sum[q1]);
        acc[j][0] += x0 * (sa * static_cast<float>(c[0]) + ma * s0), acc[j][1] += x1 * (sa * static_cast<float>(c[1]) + ma * s1);
        acc[j][2] += x0 * (sb * static_cast<float>(c[2]) + mb * s0), acc[j][3] += x1 * (sb * static_cast<float>(c[3]) + mb * s1);
      } else {
        acc[j][0] += (x0 * sa) * static_cast<float>(c[0]), acc[j][1] += (x1 * sa) * static_cast<float>(c[1]);
        acc[j][2] += (x0 * sb) * static_cast<float>(c[2]), acc[j][3] += (x1 * sb) * static_cast<float>(c[3]);
      }
    }
  }
  if constexpr (K == Kind::kI8) {
    const float sa = *reinterpret_cast<const float*>(W.data + W.scale_offset + static_cast<long long>(ra) * W.scale_row_bytes);
    const float sb = *reinterpret_cast<const float*>(W.data + W.scale_offset + static_cast<long long>(rb) * W.scale_row_bytes);
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[j][0] *= sa, acc[j][1] *= sa, acc[j][2] *= sb, acc[j][3] *= sb;
  }
}

// Calls f.template operator()<K, kAsym>() for an int4 / int8 matrix (host).
template <typename F>
inline void dispatch_mma(const DevMatrix& W, F&& f) {
  if (W.kind == Kind::kI8) f.template operator()<Kind::kI8, false>();
  else if (W.asym) f.template operator()<Kind::kI4, true>();
  else f.template operator()<Kind::kI4, false>();
}

// Whether device `dev`'s tensor cores take the int8 mma (sm_80+), cached.
bool mma_supported();

}  // namespace coli::cuda
