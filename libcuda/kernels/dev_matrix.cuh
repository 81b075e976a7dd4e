// A weight matrix on the device in its container format (quant/format.h:
// codes row-major with 16-byte-padded rows, scales after them), and the
// warp-level row dot products every matmul kernel is built from: lane l
// takes 16-byte chunks l, l+32, ... of the row, unpacks them in registers
// and multiplies them with NT token rows of x; one shuffle reduction at the
// end. Memory-bound by design (decode): every weight byte is read once per
// NT tokens.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "quant/format.h"

namespace coli::cuda {

enum class Kind : int { kF32, kBF16, kF16, kI8, kI4 };

struct DevMatrix {
  Kind kind = Kind::kF32;
  const uint8_t* data = nullptr;
  int rows = 0, cols = 0;
  int row_stride = 0;        // bytes per row of codes / values
  long long scale_offset = 0;
  int scale_row_bytes = 0;
  int group = 0;             // int4: columns per scale (cols when one per row)
  int group_shift = -1;      // log2(group / 32) when a power of two: no division per block
  bool asym = false, f16_scales = false;
};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Scale s and additive constant mn of int4 row r at column c0 (weight =
// code * s + mn: mn = -8 s when symmetric). A 32-column chunk never spans
// two groups (groups of 32, 64, 128, or the whole row).
__device__ __forceinline__ void int4_scale(const DevMatrix& W, int r, int c0, float* s, float* mn) {
  const uint8_t* sc = W.data + W.scale_offset + static_cast<long long>(r) * W.scale_row_bytes;
  if (W.f16_scales) {
    const int g = W.group_shift >= 0 ? (c0 >> 5) >> W.group_shift : c0 / W.group;
    const __half* hs = reinterpret_cast<const __half*>(sc);
    if (W.asym) *s = __half2float(hs[2 * g]), *mn = __half2float(hs[2 * g + 1]);
    else *s = __half2float(hs[g]), *mn = -8.0f * *s;
  } else {
    *s = *reinterpret_cast<const float*>(sc);
    *mn = -8.0f * *s;
  }
}

__device__ __forceinline__ float bf16_bits_to_f32(uint32_t b) { return __uint_as_float(b << 16); }

// acc[t] += W[r, c0 + i] * x[t][c0 + i] for the n <= 32 values of one chunk.
template <int NT>
__device__ __forceinline__ void fma_chunk(const float* vals, int n, const float* x, int ldx, int c0, float (&acc)[NT]) {
  for (int t = 0; t < NT; ++t) {
    const float* xt = x + static_cast<long long>(t) * ldx + c0;
    float s = 0.0f;
    if (n == 32 || n == 16 || n == 8 || n == 4) {
      for (int i = 0; i < n; i += 4) {
        const float4 xv = *reinterpret_cast<const float4*>(xt + i);
        s += vals[i] * xv.x + vals[i + 1] * xv.y + vals[i + 2] * xv.z + vals[i + 3] * xv.w;
      }
    } else {
      for (int i = 0; i < n; ++i) s += vals[i] * xt[i];
    }
    acc[t] += s;
  }
}

// Dequantizes chunk `ch` of row r: up to 32 values at column *c0, count *n.
template <Kind K>
__device__ __forceinline__ void load_chunk(const DevMatrix& W, int r, int ch, float* vals, int* c0, int* n) {
  const uint8_t* row = W.data + static_cast<long long>(r) * W.row_stride;
  constexpr int per = K == Kind::kF32 ? 4 : K == Kind::kI8 ? 16 : K == Kind::kI4 ? 32 : 8;
  *c0 = ch * per;
  const int m = min(per, W.cols - *c0);
  *n = m;
  const bool full = m == per;
  if (K == Kind::kF32) {
    const float* p = reinterpret_cast<const float*>(row) + *c0;
    if (full && (W.row_stride & 15) == 0) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(p));
      vals[0] = v.x, vals[1] = v.y, vals[2] = v.z, vals[3] = v.w;
    } else {
      for (int i = 0; i < m; ++i) vals[i] = p[i];
    }
  } else if (K == Kind::kBF16 || K == Kind::kF16) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(row) + *c0;
    uint16_t h[8];
    if (full && (W.row_stride & 15) == 0) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
      for (int i = 0; i < 4; ++i) h[2 * i] = w[i] & 0xffff, h[2 * i + 1] = w[i] >> 16;
    } else {
      for (int i = 0; i < m; ++i) h[i] = p[i];
    }
    for (int i = 0; i < m; ++i)
      vals[i] = K == Kind::kBF16 ? bf16_bits_to_f32(h[i]) : __half2float(__ushort_as_half(h[i]));
  } else if (K == Kind::kI8) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(row + *c0));  // rows padded to 16 bytes
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    const float s = *reinterpret_cast<const float*>(W.data + W.scale_offset + static_cast<long long>(r) * W.scale_row_bytes);
    for (int i = 0; i < 16; ++i) vals[i] = static_cast<float>(static_cast<int8_t>((w[i / 4] >> (8 * (i % 4))) & 0xff)) * s;
  } else {  // int4: byte j holds column 2j (low nibble) and 2j+1 (high)
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(row + *c0 / 2));
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    float s, mn;
    int4_scale(W, r, *c0, &s, &mn);
    for (int i = 0; i < 32; ++i) vals[i] = static_cast<float>((w[i / 8] >> (4 * (i % 8))) & 0xf) * s + mn;
  }
}

// Byte k of v (0..255) as the float 2^23 + byte: one byte permute, exact
// after subtracting 2^23 (no integer-to-float conversion).
__device__ __forceinline__ float magic_byte(uint32_t v, int k) { return __int_as_float(__byte_perm(v, 0x4B000000u, 0x7440 + k)); }
constexpr float kMagic = 8388608.0f;  // 2^23

// acc[t] += W[r, chunk ch] . x[t, chunk ch]: the integer formats multiply the
// codes (minus their offset) with x and scale the chunk's sum once.
template <Kind K, int NT>
__device__ __forceinline__ void chunk_dot(const DevMatrix& W, int r, int ch, const float* x, int ldx, float (&acc)[NT]) {
  if constexpr (K == Kind::kI4) {
    const int c0 = ch * 32;
    const uint8_t* row = W.data + static_cast<long long>(r) * W.row_stride;
    if (c0 + 32 > W.cols) {  // ragged last chunk: the generic path
      float vals[32];
      int cc, n;
      load_chunk<K>(W, r, ch, vals, &cc, &n);
      fma_chunk<NT>(vals, n, x, ldx, cc, acc);
      return;
    }
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(row + c0 / 2));
    float s, mn;
    int4_scale(W, r, c0, &s, &mn);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    // Symmetric: sum (code - 8) x, scaled. Asym: s sum code x + min sum x.
    auto dot = [&]<bool kAsym>() {
      const float off = kAsym ? kMagic : kMagic + 8.0f;
      for (int t = 0; t < NT; ++t) {
        const float* xt = x + static_cast<long long>(t) * ldx + c0;
        float dq = 0.0f, sx = 0.0f;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const uint32_t lo = w[q] & 0x0F0F0F0Fu, hi = (w[q] >> 4) & 0x0F0F0F0Fu;
          const float4 xa = *reinterpret_cast<const float4*>(xt + 8 * q), xb = *reinterpret_cast<const float4*>(xt + 8 * q + 4);
          const float xs[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            dq += (magic_byte(lo, j) - off) * xs[2 * j] + (magic_byte(hi, j) - off) * xs[2 * j + 1];
            if (kAsym) sx += xs[2 * j] + xs[2 * j + 1];
          }
        }
        acc[t] += kAsym ? s * dq + mn * sx : s * dq;
      }
    };
    if (W.asym) dot.template operator()<true>();
    else dot.template operator()<false>();
  } else if constexpr (K == Kind::kI8) {
    const int c0 = ch * 16;
    const uint8_t* row = W.data + static_cast<long long>(r) * W.row_stride;
    if (c0 + 16 > W.cols) {
      float vals[16];
      int cc, n;
      load_chunk<K>(W, r, ch, vals, &cc, &n);
      fma_chunk<NT>(vals, n, x, ldx, cc, acc);
      return;
    }
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(row + c0));
    const float s = *reinterpret_cast<const float*>(W.data + W.scale_offset + static_cast<long long>(r) * W.scale_row_bytes);
    // Codes with the sign bit flipped are code + 128, unsigned.
    const uint32_t w[4] = {v.x ^ 0x80808080u, v.y ^ 0x80808080u, v.z ^ 0x80808080u, v.w ^ 0x80808080u};
    for (int t = 0; t < NT; ++t) {
      const float* xt = x + static_cast<long long>(t) * ldx + c0;
      float dq = 0.0f;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float4 xa = *reinterpret_cast<const float4*>(xt + 4 * q);
        dq += (magic_byte(w[q], 0) - (kMagic + 128.0f)) * xa.x + (magic_byte(w[q], 1) - (kMagic + 128.0f)) * xa.y +
              (magic_byte(w[q], 2) - (kMagic + 128.0f)) * xa.z + (magic_byte(w[q], 3) - (kMagic + 128.0f)) * xa.w;
      }
      acc[t] += s * dq;
    }
  } else {
    float vals[K == Kind::kF32 ? 4 : 8];
    int c0, n;
    load_chunk<K>(W, r, ch, vals, &c0, &n);
    fma_chunk<NT>(vals, n, x, ldx, c0, acc);
  }
}

// One token against a bf16 / f16 row of whole 16-byte chunks: each lane's
// chunks, 8 at a time, and their x are all loaded before the first multiply
// (the generic chunk loop's branches keep the compiler from hoisting them,
// which made a router row several round trips to memory).
template <Kind K>
__device__ __forceinline__ float warp_row_dot_half1(const DevMatrix& W, int r, const float* x) {
  const int lane = threadIdx.x & 31, chunks = W.cols / 8;
  const uint8_t* row = W.data + static_cast<long long>(r) * W.row_stride;
  auto val = [](uint32_t h) { return K == Kind::kBF16 ? bf16_bits_to_f32(h) : __half2float(__ushort_as_half(static_cast<unsigned short>(h))); };
  float a = 0.0f;
  for (int c0 = lane; c0 < chunks; c0 += 32 * 8) {
    uint4 v[8];
    float4 xa[8], xb[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int ch = c0 + 32 * j;
      const bool in = ch < chunks;
      v[j] = in ? __ldg(reinterpret_cast<const uint4*>(row + ch * 16)) : make_uint4(0, 0, 0, 0);
      xa[j] = in ? *reinterpret_cast<const float4*>(x + ch * 8) : make_float4(0, 0, 0, 0);
      xb[j] = in ? *reinterpret_cast<const float4*>(x + ch * 8 + 4) : make_float4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j)
      a += val(v[j].x & 0xffff) * xa[j].x + val(v[j].x >> 16) * xa[j].y + val(v[j].y & 0xffff) * xa[j].z + val(v[j].y >> 16) * xa[j].w +
           val(v[j].z & 0xffff) * xb[j].x + val(v[j].z >> 16) * xb[j].y + val(v[j].w & 0xffff) * xb[j].z + val(v[j].w >> 16) * xb[j].w;
  }
  return warp_sum(a);
}

// acc[t] = sum_c W[r, c] x[t][c] for NT tokens, on one warp (result in every
// lane). Two chunks per lane per step so two loads are in flight.
template <Kind K, int NT>
__device__ __forceinline__ void warp_row_dot(const DevMatrix& W, int r, const float* x, int ldx, float (&acc)[NT]) {
  constexpr int per = K == Kind::kF32 ? 4 : K == Kind::kI8 ? 16 : K == Kind::kI4 ? 32 : 8;
  const int lane = threadIdx.x & 31;
  if constexpr (NT == 1 && (K == Kind::kBF16 || K == Kind::kF16)) {
    if (W.cols % 8 == 0 && (W.row_stride & 15) == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0) {
      acc[0] = warp_row_dot_half1<K>(W, r, x);
      return;
    }
  }
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
  const int chunks = (W.cols + per - 1) / per;
  // One token: 8 chunks per lane in flight (a decode step's row is one
  // round trip to memory, not four); more tokens keep registers for x.
#pragma unroll(NT == 1 ? 8 : 2)
  for (int ch = lane; ch < chunks; ch += 32) chunk_dot<K, NT>(W, r, ch, x, ldx, acc);
  for (int t = 0; t < NT; ++t) acc[t] = warp_sum(acc[t]);
}

// x quantized to int8 per 32-column block (see quantize_x in kernels.cuh).
struct QuantX {
  int8_t* codes = nullptr;
  float* scale = nullptr;
  int* sum = nullptr;
};

// One 32-column block of x, value v in each lane (lane = column), into
// block qb of q: scale absmax / 127, codes rounded, their sum; codes in the
// order the weights' words meet them (nibble: int4's per 8 columns the 4
// even ones, then the 4 odd ones, so a word of low / high nibbles meets one
// word of x; otherwise natural). Every quantizer of activations calls this.
__device__ __forceinline__ void warp_quantize_block(float v, bool nibble, const QuantX& q, long long qb) {
  const int lane = threadIdx.x & 31;
  float amax = fabsf(v);
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float s = amax / 127.0f, inv = s > 0 ? 1.0f / s : 0.0f;
  const int c = __float2int_rn(v * inv);
  int sum = c;
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const int pos = nibble ? (lane / 8) * 8 + (lane & 1) * 4 + (lane % 8) / 2 : lane;
  q.codes[qb * 32 + pos] = static_cast<int8_t>(c);
  if (lane == 0) q.scale[qb] = s, q.sum[qb] = sum;
}

// One 32-column block of a row as loaded, not yet unpacked, so that a
// kernel can load the next rows' blocks (load_raw_block) while it
// multiplies this row's (raw_block_dot): int4 its 16 bytes of codes and its
// scale's bits (an f16, an f16 scale + offset pair, or the row's f32); int8
// its 32 bytes of codes.
template <Kind K>
struct RawBlock;
template <>
struct RawBlock<Kind::kI4> {
  uint4 v;
  uint32_t s;
};
template <>
struct RawBlock<Kind::kI8> {
  uint4 v0, v1;
};

template <Kind K>
__device__ __forceinline__ void load_raw_block(const DevMatrix& W, int r, int b, RawBlock<K>& out) {
  const uint8_t* row = W.data + static_cast<long long>(r) * W.row_stride;
  if constexpr (K == Kind::kI4) {
    out.v = __ldg(reinterpret_cast<const uint4*>(row + b * 16));
    const uint8_t* sc = W.data + W.scale_offset + static_cast<long long>(r) * W.scale_row_bytes;
    if (W.f16_scales) {
      const int g = W.group_shift >= 0 ? b >> W.group_shift : b * 32 / W.group;
      out.s = W.asym ? __ldg(reinterpret_cast<const uint32_t*>(sc) + g) : __ldg(reinterpret_cast<const unsigned short*>(sc) + g);
    } else {
      out.s = __ldg(reinterpret_cast<const uint32_t*>(sc));
    }
  } else {
    out.v0 = __ldg(reinterpret_cast<const uint4*>(row + b * 32));
    out.v1 = __ldg(reinterpret_cast<const uint4*>(row + b * 32 + 16));
  }
}

// A raw block as 8 words for dp4a against x's codes (int4: word 2k the low
// nibbles of the block's word k, 2k + 1 its high nibbles) and, for int4,
// its scale s and offset mn (weight = code s + mn).
template <Kind K>
__device__ __forceinline__ void unpack_raw_block(const DevMatrix& W, const RawBlock<K>& rb, int (&w)[8], float* s, float* mn) {
  if constexpr (K == Kind::kI4) {
    const uint32_t u[4] = {rb.v.x, rb.v.y, rb.v.z, rb.v.w};
    for (int k = 0; k < 4; ++k) w[2 * k] = static_cast<int>(u[k] & 0x0F0F0F0Fu), w[2 * k + 1] = static_cast<int>((u[k] >> 4) & 0x0F0F0F0Fu);
    if (!W.f16_scales) *s = __uint_as_float(rb.s), *mn = -8.0f * *s;
    else if (W.asym) *s = __half2float(__ushort_as_half(static_cast<unsigned short>(rb.s & 0xffffu))), *mn = __half2float(__ushort_as_half(static_cast<unsigned short>(rb.s >> 16)));
    else *s = __half2float(__ushort_as_half(static_cast<unsigned short>(rb.s))), *mn = -8.0f * *s;
  } else {
    w[0] = int(rb.v0.x), w[1] = int(rb.v0.y), w[2] = int(rb.v0.z), w[3] = int(rb.v0.w), w[4] = int(rb.v1.x), w[5] = int(rb.v1.y), w[6] = int(rb.v1.z),
    w[7] = int(rb.v1.w);
  }
}

// Block b (32 columns) of row r, loaded and unpacked (unpack_raw_block).
template <Kind K>
__device__ __forceinline__ void load_q_block(const DevMatrix& W, int r, int b, int (&w)[8], float* s, float* mn) {
  RawBlock<K> rb;
  load_raw_block<K>(W, r, b, rb);
  unpack_raw_block<K>(W, rb, w, s, mn);
}

// acc + the block's dot with one token's block of x (codes xw, scale xs,
// code sum xsum); int8: before the row scale. Symmetric int4 (weight =
// (code - 8) s) starts the dot at -8 sum(x codes).
template <Kind K>
__device__ __forceinline__ float raw_block_dot(const DevMatrix& W, const RawBlock<K>& rb, const int (&xw)[8], float xs, int xsum, float acc) {
  int w[8];
  float s = 0.0f, mn = 0.0f;
  unpack_raw_block<K>(W, rb, w, &s, &mn);
  const bool asym = W.asym;
  int d = K == Kind::kI4 && !asym ? -8 * xsum : 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) d = __dp4a(w[k], xw[k], d);
  if (K == Kind::kI4 && asym) return acc + xs * (s * static_cast<float>(d) + mn * static_cast<float>(xsum));
  return acc + (K == Kind::kI4 ? xs * s : xs) * static_cast<float>(d);
}

// W[r, :] . x for up to NT tokens, x in int8 (rows qrows[0..n) of q), int4
// or int8 weights with cols % 32 == 0, against one load of the weight row,
// on one warp: out[t] in every lane.
template <Kind K, int NT>
__device__ __forceinline__ void warp_row_dot_q_n(const DevMatrix& W, int r, const QuantX& q, const int* qrows, int n, float (&out)[NT]) {
  const int lane = threadIdx.x & 31, nb = W.cols / 32;
  const float row_scale = K == Kind::kI8 ? *reinterpret_cast<const float*>(W.data + W.scale_offset + static_cast<long long>(r) * W.scale_row_bytes) : 0.0f;
  for (int t = 0; t < NT; ++t) out[t] = 0.0f;
#pragma unroll 2
  for (int b = lane; b < nb; b += 32) {
    int w[8];
    float s = 0.0f, mn = 0.0f;
    load_q_block<K>(W, r, b, w, &s, &mn);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t >= n) break;
      const long long qb = static_cast<long long>(qrows[t]) * nb + b;
      const int4* xp = reinterpret_cast<const int4*>(q.codes + qb * 32);
      const int4 xa = xp[0], xb = xp[1];
      const int xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
      int d = 0;
#pragma unroll
      for (int k = 0; k < 8; ++k) d = __dp4a(w[k], xw[k], d);
      if (K == Kind::kI4) out[t] += q.scale[qb] * (s * static_cast<float>(d) + mn * static_cast<float>(q.sum[qb]));
      else out[t] += q.scale[qb] * static_cast<float>(d);
    }
  }
  for (int t = 0; t < NT; ++t) {
    out[t] = warp_sum(out[t]);
    if (K == Kind::kI8) out[t] *= row_scale;
  }
}

// Decode's row dots: rows[0..R) of the NM matrices M (one kind and width,
// int4 / int8, cols % 32 == 0) against one token (row qrow of q), on a
// group of L lanes (L = 8, 16 or 32; the warp's 32 / L groups take rows of
// their own). Each 32-column block of x is read once for all NM x R rows,
// and all their weight loads are issued before the first dp4a, so a group
// has NM x R x 16-32 bytes per lane in flight instead of one row's. Every
// lane of the group gets out[m][i]; every lane of the warp must call.
// blocks_used < cols / 32: only the first blocks_used 32-column blocks
// (the rest of x is 0: a split expert's columns, moe_down).
template <Kind K, int NM, int R, int L>
__device__ __forceinline__ void group_rows_dot_q(const DevMatrix (&M)[NM], const int (&rows)[R], const QuantX& q, long long qrow, float (&out)[NM][R],
                                                 int blocks_used = 1 << 30) {
  static_assert(L == 8 || L == 16 || L == 32, "lanes per row group");
  const int sub = threadIdx.x & (L - 1), nb = M[0].cols / 32, nbu = min(nb, blocks_used);
#pragma unroll
  for (int m = 0; m < NM; ++m)
#pragma unroll
    for (int i = 0; i < R; ++i) out[m][i] = 0.0f;
#pragma unroll 2
  for (int b = sub; b < nbu; b += L) {
    const long long qb = qrow * nb + b;
    const int4* xp = reinterpret_cast<const int4*>(q.codes + qb * 32);
    const int4 xa = xp[0], xb = xp[1];
    const int xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
    const float xs = q.scale[qb];
    const int xsum = K == Kind::kI4 ? q.sum[qb] : 0;
    RawBlock<K> rb[NM][R];
#pragma unroll
    for (int m = 0; m < NM; ++m)
#pragma unroll
      for (int i = 0; i < R; ++i) load_raw_block<K>(M[m], rows[i], b, rb[m][i]);
#pragma unroll
    for (int m = 0; m < NM; ++m)
#pragma unroll
      for (int i = 0; i < R; ++i) out[m][i] = raw_block_dot<K>(M[m], rb[m][i], xw, xs, xsum, out[m][i]);
  }
#pragma unroll
  for (int m = 0; m < NM; ++m)
#pragma unroll
    for (int i = 0; i < R; ++i) {
#pragma unroll
      for (int o = L / 2; o > 0; o >>= 1) out[m][i] += __shfl_xor_sync(0xffffffffu, out[m][i], o);
      if (K == Kind::kI8) out[m][i] *= *reinterpret_cast<const float*>(M[m].data + M[m].scale_offset + static_cast<long long>(rows[i]) * M[m].scale_row_bytes);
    }
}

// Lanes per row group for a width of cols (group_rows_dot_q): the fewest
// that leave no lane without a 32-column block, at least 8.
__host__ inline int lanes_per_row(int cols, int max_lanes = 32) {
  const int nb = cols / 32;
  return nb >= 32 && max_lanes >= 32 ? 32 : nb >= 16 && max_lanes >= 16 ? 16 : 8;
}

// Calls f.template operator()<L>() with lanes_per_row(cols, max_lanes) as a constant (host).
template <typename F>
inline void dispatch_lanes(int cols, F&& f, int max_lanes = 32) {
  switch (lanes_per_row(cols, max_lanes)) {
    case 32: f.template operator()<32>(); break;
    case 16: f.template operator()<16>(); break;
    default: f.template operator()<8>(); break;
  }
}

// Asks L2 for rows[0..R) of W (codes and scales), spread over a group of L
// lanes, one 128-byte line per lane per step.
template <int R, int L>
__device__ __forceinline__ void prefetch_rows_l2(const DevMatrix& W, const int (&rows)[R]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const int sub = threadIdx.x & (L - 1);
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const uint8_t* row = W.data + static_cast<long long>(rows[i]) * W.row_stride;
    for (int off = sub * 128; off < W.row_stride; off += L * 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(row + off));
    if (W.scale_row_bytes && sub == 0)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(W.data + W.scale_offset + static_cast<long long>(rows[i]) * W.scale_row_bytes));
  }
#endif
}

// Asks L2 for part `part` of `parts` of W's bytes (codes, then scales), a
// 128-byte line per thread per step: a matrix that a later kernel reads,
// fetched while this one runs.
__device__ __forceinline__ void prefetch_matrix_part_l2(const DevMatrix& W, int part, int parts) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  auto range = [&](const uint8_t* base, long long bytes) {
    const long long lines = (bytes + 127) / 128, per = (lines + parts - 1) / parts;
    const long long l0 = part * per, l1 = min(lines, l0 + per);
    for (long long l = l0 + threadIdx.x; l < l1; l += blockDim.x) asm volatile("prefetch.global.L2 [%0];" ::"l"(base + l * 128));
  };
  range(W.data, static_cast<long long>(W.rows) * W.row_stride);
  if (W.scale_row_bytes) range(W.data + W.scale_offset, static_cast<long long>(W.rows) * W.scale_row_bytes);
#endif
}

// prefetch_matrix_part_l2 for the first cols_used columns of every row
// (int4 / int8 codes; other kinds whole rows) and the scale rows: a split
// expert's down matrix, of which moe_down reads only those columns.
__device__ __forceinline__ void prefetch_matrix_cols_l2(const DevMatrix& W, int part, int parts, int cols_used) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const long long used = W.kind == Kind::kI4 ? cols_used / 2 : W.kind == Kind::kI8 ? cols_used : W.row_stride;
  const long long lines = (min(used, static_cast<long long>(W.row_stride)) + 127) / 128;
  const long long per = (W.rows + parts - 1) / parts, r0 = part * per, r1 = min(static_cast<long long>(W.rows), r0 + per);
  for (long long i = threadIdx.x; i < (r1 - r0) * lines; i += blockDim.x)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(W.data + (r0 + i / lines) * W.row_stride + (i % lines) * 128));
  if (W.scale_row_bytes) {
    const uint8_t* base = W.data + W.scale_offset + r0 * W.scale_row_bytes;
    for (long long l = threadIdx.x; l < ((r1 - r0) * W.scale_row_bytes + 127) / 128; l += blockDim.x) asm volatile("prefetch.global.L2 [%0];" ::"l"(base + l * 128));
  }
#endif
}

// One token (row qrow of q).
template <Kind K>
__device__ __forceinline__ float warp_row_dot_q(const DevMatrix& W, int r, const QuantX& q, int qrow) {
  float out[1];
  warp_row_dot_q_n<K, 1>(W, r, q, &qrow, 1, out);
  return out[0];
}

// Asks L2 for row r of W over the whole warp (prefetch_rows_l2): issued
// before griddep_wait(), the weight reads of a decode matmul overlap the
// kernel it waits for.
__device__ __forceinline__ void prefetch_row_l2(const DevMatrix& W, int r) {
  const int rows[1] = {r};
  prefetch_rows_l2<1, 32>(W, rows);
}

__host__ inline bool takes_int8_x(const DevMatrix& W) { return (W.kind == Kind::kI4 || W.kind == Kind::kI8) && W.cols % 32 == 0; }

// Calls f.template operator()<K>() with the matrix's kind as a constant (host).
template <typename F>
inline void dispatch_kind(Kind k, F&& f) {
  switch (k) {
    case Kind::kF32: f.template operator()<Kind::kF32>(); break;
    case Kind::kBF16: f.template operator()<Kind::kBF16>(); break;
    case Kind::kF16: f.template operator()<Kind::kF16>(); break;
    case Kind::kI8: f.template operator()<Kind::kI8>(); break;
    case Kind::kI4: f.template operator()<Kind::kI4>(); break;
  }
}

}  // namespace coli::cuda
