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

#include "async_copy.cuh"
#include "dev_matrix.cuh"

namespace coli::cuda {

__device__ __forceinline__ void mma_s8_16x8x32(int (&c)[4], const uint32_t (&a)[4], int b0, int b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm(
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

// A block of kMmaWarps warps multiplies up to NM matrices sharing one input
// (gate and up) with BN tokens: warp w owns rows r0 + 16 w .. + 16 of each.
// Per stage of KB 32-column blocks the block copies the weight rows, the
// tokens' codes and their scales into shared memory (cp.async into S
// buffers, S - 1 stages in flight while one computes), and the warps run
// their mma from there. Row strides are padded so that the fragment reads
// hit 32 distinct banks. S = 2 (double buffering) suits prompt chunks, whose
// grids fill the GPU many times over; a few tokens (decode rows) make grids
// of one block per 64 rows, where only the loads in flight per block keep
// the weights streaming: more stages, fewer tokens per tile.
constexpr int kMmaWarps = 4, kMmaRows = 16 * kMmaWarps;

template <Kind K, bool kAsym, int NM, int BN, int S = 2>
struct MmaTile {
  static_assert(S >= 2, "at least double buffering");
  static constexpr int kTokens = BN;
  static constexpr int KB = K == Kind::kI4 ? 4 : 2;              // 32-column blocks per stage
  static constexpr int kBlockBytes = K == Kind::kI4 ? 16 : 32;  // bytes of a row per block
  static constexpr int ASTR = K == Kind::kI4 ? 80 : 96;         // bytes per weight row in shared memory
  static constexpr int BSTR = 160;                              // bytes per token (KB * 32 codes + padding)
  static constexpr int NT = BN / 8;
  struct Smem {
    alignas(16) uint8_t a[S][NM][kMmaRows * ASTR];
    alignas(16) uint8_t b[S][BN * BSTR];
    float xs[S][KB * BN];
    int xsum[S][kAsym ? KB * BN : 1];
    int qrow[BN];
  };

  // f(j, c, tok, row) for each of this lane's results acc[.][j][c] that the
  // caller keeps: token slot tok < ntok, row < rows.
  template <typename F>
  __device__ static void for_each_result(int r0, int rows, int ntok, F&& f) {
    const int lane = threadIdx.x & 31, ra = r0 + (threadIdx.x >> 5) * 16 + (lane >> 2), i = lane & 3;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int tok = 8 * j + 2 * i + (c & 1), row = ra + 8 * (c >> 1);
        if (tok < ntok && row < rows) f(j, c, tok, row);
      }
  }

  // acc[m][j][c] = W[m] rows (r0 + 16 w + g, + 8) . tokens (8 j + 2 i, + 1)
  // for tokens < ntok, whose QuantX rows the caller put in sm.qrow; other
  // slots hold garbage (drop them). Over the 32-column blocks [kb_lo,
  // kb_hi) (kb_hi < 0: to the last; a split-K part starts at a multiple of
  // KB). Every thread of the block must call.
  __device__ static void run(const DevMatrix (&W)[NM], int r0, const QuantX& q, int ntok, Smem& sm, float (&acc)[NM][NT][4], int kb_lo = 0,
                             int kb_hi = -1) {
    const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, i = lane & 3, wr = (tid >> 5) * 16;
    const int nb = W[0].cols / 32, ntiles = min(NT, (ntok + 7) / 8);
    if (kb_hi < 0) kb_hi = nb;
    const int stages = (kb_hi - kb_lo + KB - 1) / KB;
#pragma unroll
    for (int m = 0; m < NM; ++m)
#pragma unroll
      for (int j = 0; j < NT; ++j) acc[m][j][0] = acc[m][j][1] = acc[m][j][2] = acc[m][j][3] = 0.0f;
    auto load = [&](int st, int kb0) {
      const int nbv = min(KB, kb_hi - kb0);
      constexpr int ach = KB * kBlockBytes / 16;  // 16-byte chunks of a row per stage
#pragma unroll
      for (int m = 0; m < NM; ++m)
        for (int x = tid; x < kMmaRows * ach; x += kMmaWarps * 32) {
          const int row = x / ach, ch = x % ach;
          if (ch * 16 >= nbv * kBlockBytes) continue;
          const int r = min(r0 + row, W[m].rows - 1);
          cp_async16(&sm.a[st][m][row * ASTR + ch * 16], W[m].data + static_cast<long long>(r) * W[m].row_stride + kb0 * kBlockBytes + ch * 16);
        }
      for (int x = tid; x < BN * KB * 2; x += kMmaWarps * 32) {
        const int tok = x / (KB * 2), ch = x % (KB * 2);
        if (tok >= ntok || ch * 16 >= nbv * 32) continue;
        cp_async16(&sm.b[st][tok * BSTR + ch * 16], q.codes + (static_cast<long long>(sm.qrow[tok]) * nb + kb0) * 32 + ch * 16);
      }
      for (int x = tid; x < KB * BN; x += kMmaWarps * 32) {
        const int kk = x / BN, tok = x % BN;
        if (tok >= ntok || kk >= nbv) continue;
        const long long qi = static_cast<long long>(sm.qrow[tok]) * nb + kb0 + kk;
        cp_async4(&sm.xs[st][x], q.scale + qi);
        if (kAsym) cp_async4(&sm.xsum[st][x], q.sum + qi);
      }
      cp_async_commit();
    };
    __syncthreads();  // sm.qrow is written
    // Stages 0 .. S - 2 ahead; each iteration issues stage s + S - 1 into
    // the buffer stage s - 1 computed from (freed by its closing barrier),
    // an empty group past the end so that the count of groups in flight is
    // always S - 1 when stage s is waited for.
    for (int p = 0; p + 1 < S; ++p) {
      if (p < stages) load(p, kb_lo + p * KB);
      else cp_async_commit();
    }
    // int4 scales: this lane's two rows' per block, read from global memory
    // one stage ahead into registers (sc[.][.][0..3]: s and mn of row g,
    // then of row g + 8), so that their latency hides behind a stage's
    // mma instead of stalling every block of it (a few tokens' grids have
    // one block per 64 rows: nothing else to switch to).
    constexpr int kScales = K == Kind::kI4 ? KB : 1;
    float sc[kScales][NM][4], sc_next[kScales][NM][4];
    auto read_scales = [&](int kb0, float (&out)[kScales][NM][4]) {
      if constexpr (K == Kind::kI4) {
#pragma unroll
        for (int kk = 0; kk < KB; ++kk)
#pragma unroll
          for (int m = 0; m < NM; ++m) {
            const int c = min(kb0 + kk, kb_hi - 1) * 32;
            const int ra = min(r0 + wr + g, W[m].rows - 1), rb = min(r0 + wr + g + 8, W[m].rows - 1);
            int4_scale(W[m], ra, c, &out[kk][m][0], &out[kk][m][1]);
            int4_scale(W[m], rb, c, &out[kk][m][2], &out[kk][m][3]);
          }
      }
    };
    read_scales(kb_lo, sc);
    for (int s = 0; s < stages; ++s) {
      const int st = s % S, kb0 = kb_lo + s * KB;
      if (s + S - 1 < stages) load((s + S - 1) % S, kb0 + (S - 1) * KB);
      else cp_async_commit();
      if (s + 1 < stages) read_scales(kb0 + KB, sc_next);
      cp_async_wait<S - 1>();
      __syncthreads();
      const int nbv = min(KB, kb_hi - kb0);
#pragma unroll
      for (int kk = 0; kk < KB; ++kk) {
        if (kk >= nbv) break;
        uint32_t a[NM][4];
        float sa[NM], sb[NM], ma[NM], mb[NM];
#pragma unroll
        for (int m = 0; m < NM; ++m) {
          const uint8_t* base = sm.a[st][m] + kk * kBlockBytes;
          if constexpr (K == Kind::kI4) {
            const uint32_t ua = *reinterpret_cast<const uint32_t*>(base + (wr + g) * ASTR + i * 4);
            const uint32_t ub = *reinterpret_cast<const uint32_t*>(base + (wr + g + 8) * ASTR + i * 4);
            const uint32_t la = ua & 0x0F0F0F0Fu, ha = (ua >> 4) & 0x0F0F0F0Fu, lb = ub & 0x0F0F0F0Fu, hb = (ub >> 4) & 0x0F0F0F0Fu;
            if (kAsym) a[m][0] = la, a[m][1] = lb, a[m][2] = ha, a[m][3] = hb;
            else a[m][0] = nibbles_minus_8(la), a[m][1] = nibbles_minus_8(lb), a[m][2] = nibbles_minus_8(ha), a[m][3] = nibbles_minus_8(hb);
            sa[m] = sc[kk][m][0], ma[m] = sc[kk][m][1], sb[m] = sc[kk][m][2], mb[m] = sc[kk][m][3];
          } else {
            const uint2 ua = *reinterpret_cast<const uint2*>(base + (wr + g) * ASTR + i * 8);
            const uint2 ub = *reinterpret_cast<const uint2*>(base + (wr + g + 8) * ASTR + i * 8);
            a[m][0] = ua.x, a[m][1] = ub.x, a[m][2] = ua.y, a[m][3] = ub.y;
          }
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          if (j >= ntiles) break;
          const int2 xb = *reinterpret_cast<const int2*>(sm.b[st] + (8 * j + g) * BSTR + kk * 32 + i * 8);
          const float2 xs = *reinterpret_cast<const float2*>(&sm.xs[st][kk * BN + 8 * j + 2 * i]);
          float2 xsum = {0.0f, 0.0f};
          if (kAsym) {
            const int2 v = *reinterpret_cast<const int2*>(&sm.xsum[st][kk * BN + 8 * j + 2 * i]);
            xsum = {static_cast<float>(v.x), static_cast<float>(v.y)};
          }
#pragma unroll
          for (int m = 0; m < NM; ++m) {
            int c[4] = {0, 0, 0, 0};
            mma_s8_16x8x32(c, a[m], xb.x, xb.y);
            float* o = acc[m][j];
            if constexpr (K == Kind::kI8) {
              o[0] += xs.x * static_cast<float>(c[0]), o[1] += xs.y * static_cast<float>(c[1]);
              o[2] += xs.x * static_cast<float>(c[2]), o[3] += xs.y * static_cast<float>(c[3]);
            } else if constexpr (kAsym) {
              o[0] += xs.x * (sa[m] * static_cast<float>(c[0]) + ma[m] * xsum.x), o[1] += xs.y * (sa[m] * static_cast<float>(c[1]) + ma[m] * xsum.y);
              o[2] += xs.x * (sb[m] * static_cast<float>(c[2]) + mb[m] * xsum.x), o[3] += xs.y * (sb[m] * static_cast<float>(c[3]) + mb[m] * xsum.y);
            } else {
              o[0] += (xs.x * sa[m]) * static_cast<float>(c[0]), o[1] += (xs.y * sa[m]) * static_cast<float>(c[1]);
              o[2] += (xs.x * sb[m]) * static_cast<float>(c[2]), o[3] += (xs.y * sb[m]) * static_cast<float>(c[3]);
            }
          }
        }
      }
      __syncthreads();  // this stage's buffers are free for the load S - 1 stages on
      if (K == Kind::kI4 && s + 1 < stages)
#pragma unroll
        for (int kk = 0; kk < KB; ++kk)
#pragma unroll
          for (int m = 0; m < NM; ++m)
#pragma unroll
            for (int c = 0; c < 4; ++c) sc[kk][m][c] = sc_next[kk][m][c];
    }
    if constexpr (K == Kind::kI8) {
#pragma unroll
      for (int m = 0; m < NM; ++m) {
        const int ra = min(r0 + wr + g, W[m].rows - 1), rb = min(r0 + wr + g + 8, W[m].rows - 1);
        const uint8_t* sc = W[m].data + W[m].scale_offset;
        const float sa = *reinterpret_cast<const float*>(sc + static_cast<long long>(ra) * W[m].scale_row_bytes);
        const float sb = *reinterpret_cast<const float*>(sc + static_cast<long long>(rb) * W[m].scale_row_bytes);
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[m][j][0] *= sa, acc[m][j][1] *= sa, acc[m][j][2] *= sb, acc[m][j][3] *= sb;
      }
    }
  }
};

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
