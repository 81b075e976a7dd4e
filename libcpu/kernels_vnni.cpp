#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,fma,f16c")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kernels_vnni.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu_features.h"
#include "formats/dtype.h"

namespace coli::cpu {

bool vnni_available() {
  static const bool ok = [] {
    __builtin_cpu_init();
    return detected_level() == CpuLevel::kAvx512 && __builtin_cpu_supports("avx512vnni");
  }();
  return ok && active_level() == CpuLevel::kAvx512;
}

namespace {
bool vbmi_available() {
  static const bool ok = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vbmi");
  }();
  return ok;
}
}  // namespace

bool vnni_applies(const Matrix& W, int T) {
  (void)T;  // any number of tokens: groups of 4 share each weight load
  const bool int4 = W.format >= QuantFormat::I4 && W.format <= QuantFormat::I4_G128_ASYM;
  const bool int8 = W.format == QuantFormat::I8 && vbmi_available();  // byte permutes need VBMI
  return (int4 || int8) && W.cols % 128 == 0 && vnni_available();
}

void QuantizedActs::resize(int tokens, int64_t columns) {
  T = tokens;
  cols = columns;
  codes.resize(static_cast<std::size_t>(T) * cols);
  lanes.resize(static_cast<std::size_t>(T) * (cols / 128) * 16);
  bsum.resize(static_cast<std::size_t>(T) * (cols / 32));
}

void quantize_acts(const float* x, int T, int64_t cols, QuantizedActs* qa) {
  qa->resize(T, cols);
  quantize_acts_rows(x, 0, T, qa);
}

void quantize_acts_rows(const float* x, int t0, int t1, QuantizedActs* qa) {
  const int64_t cols = qa->cols, nsb = cols / 128, nb = cols / 32;
  // Per 32-column block: scale absmax / 127, codes rounded to nearest even
  // (as nearbyint), split into even and odd columns.
  const __m512i even_idx = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd_idx = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  for (int t = t0; t < t1; ++t) {
    const float* xt = x + t * cols;
    for (int64_t b = 0; b < nb; ++b) {
      const __m512 lo = _mm512_loadu_ps(xt + b * 32), hi = _mm512_loadu_ps(xt + b * 32 + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
      const float s = amax / 127.0f, inv = s > 0 ? 1.0f / s : 0.0f;
      const __m512 vinv = _mm512_set1_ps(inv);
      const __m512i qe = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_permutex2var_ps(lo, even_idx, hi), vinv));
      const __m512i qo = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_permutex2var_ps(lo, odd_idx, hi), vinv));
      const int64_t sb = b / 4, k = b % 4;
      int8_t* even = qa->codes.data() + (t * nsb + sb) * 128 + k * 16;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(even), _mm512_cvtsepi32_epi8(qe));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(even + 64), _mm512_cvtsepi32_epi8(qo));
      const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qe, qo));
      _mm_storeu_ps(qa->lanes.data() + (t * nsb + sb) * 16 + k * 4, _mm_set1_ps(s));
      qa->bsum[t * nb + b] = s * static_cast<float>(sum);
    }
  }
}

namespace {
int g_prefetch_bytes = 2048;  // how far ahead of a row's codes (set_vnni_prefetch)
bool g_prefetch_scales = false;
}  // namespace

void set_vnni_prefetch(int bytes, bool scales) { g_prefetch_bytes = bytes, g_prefetch_scales = scales; }

namespace {

// Rows [r0, r1) for tokens t0 .. t0+T-1 of qa, R rows at a time: a decode
// step (T = 1) takes two rows per pass, so each core keeps two independent
// weight streams in flight and loads the activations once for both (the
// host experts of hybrid decode: 197-199 against 209-222 us per layer on
// the GPU machine, one A/B run; within that machine's run-to-run noise
// in another).
template <int T, int R>
void rows_vnni(const Matrix& W, const QuantizedActs& qa, int t0, int64_t r0, int64_t r1, float* y, int64_t ldy, int64_t sb0) {
  const MatrixLayout l = layout_of(W.format, W.rows, W.cols);
  const FormatInfo& fi = format_info(W.format);
  const int64_t cols = W.cols, nsb = cols / 128, nb = cols / 32;
  const int64_t G = fi.group ? fi.group : cols, ng = (cols + G - 1) / G;
  const __m512i mask = _mm512_set1_epi8(0x0f);
  // Lane -> scale index inside a superblock's scale vector.
  const __m512i idx_g32 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  const __m512i idx_g32a = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6);
  const __m512i idx_g64 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const __m512i idx_g64a = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
  // Per token, the sum of the (quantized) x over each weight group: the same
  // for every row.
  thread_local std::vector<float> xg;
  xg.assign(static_cast<std::size_t>(T) * ng, 0.0f);
  for (int t = 0; t < T; ++t)
    for (int64_t j = 0; j < nb; ++j) xg[t * ng + j * 32 / G] += qa.bsum[(t0 + t) * nb + j];
  // Weight scale of each lane's block in superblock sb: fixed-size loads, no calls.
  auto lane_scales = [&](const uint8_t* sc, float row_scale, int64_t sb) {
    const int64_t col0 = sb * 128;
    if (!fi.group) return _mm512_set1_ps(row_scale);
    if (G == 128) return _mm512_set1_ps(f16_to_f32(*reinterpret_cast<const uint16_t*>(sc + (fi.asym ? 4 : 2) * (col0 / 128))));
    const uint8_t* p = sc + (fi.asym ? 4 : 2) * (col0 / G);
    // g32: 4 scales (8 bytes) or 4 (scale, min) pairs (16); g64: 2 scales (4) or 2 pairs (8).
    const __m128i raw = G == 32 ? (fi.asym ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)) : _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))
                                : (fi.asym ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)) : _mm_cvtsi32_si128(*reinterpret_cast<const int*>(p)));
    const __m512 v = _mm512_castps256_ps512(_mm256_cvtph_ps(raw));
    return _mm512_permutexvar_ps(G == 32 ? (fi.asym ? idx_g32a : idx_g32) : (fi.asym ? idx_g64a : idx_g64), v);
  };
  // Offset (sym: -8 s) or minimum (asym: m) times the group's sum of x.
  auto correction = [&](const uint8_t* sc, float row_scale, const float* xgt) {
    if (!fi.group) return -8.0f * row_scale * xgt[0];
    const uint16_t* h = reinterpret_cast<const uint16_t*>(sc);
    float corr = 0;
    if (fi.asym) {
      for (int64_t g = 0; g < ng; ++g) corr += f16_to_f32(h[2 * g + 1]) * xgt[g];
      return corr;
    }
    __m512 cv = _mm512_setzero_ps();
    int64_t g = 0;
    for (; g + 16 <= ng; g += 16) cv = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + g))), _mm512_loadu_ps(xgt + g), cv);
    corr = _mm512_reduce_add_ps(cv);
    for (; g < ng; ++g) corr += f16_to_f32(h[g]) * xgt[g];
    return -8.0f * corr;
  };
  // The prefetch settings (set_vnni_prefetch), read once per call; the
  // scale rows as far ahead as the codes (-1: not prefetched).
  const int pf = g_prefetch_bytes;
  const int64_t pf_scales = g_prefetch_scales ? static_cast<int64_t>(pf / l.row_stride * l.scale_row_bytes) : -1;
  int64_t r = r0;
  for (; r + R <= r1; r += R) {
    const uint8_t* row[R];
    const uint8_t* sc[R];
    float row_scale[R];
    __m512 acc[R][T];
    for (int i = 0; i < R; ++i) {
      row[i] = W.data + static_cast<std::size_t>(r + i) * l.row_stride;
      sc[i] = W.data + l.scale_offset + static_cast<std::size_t>(r + i) * l.scale_row_bytes;
      row_scale[i] = 0;
      if (!fi.group) std::memcpy(&row_scale[i], sc[i], 4);
      for (int t = 0; t < T; ++t) acc[i][t] = _mm512_setzero_ps();
    }
    for (int64_t sb = sb0; sb < nsb; ++sb) {
      __m512i a0[T], a1[T];
      __m512 lanes[T];
      #pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const int8_t* a = qa.codes.data() + ((t0 + t) * nsb + sb) * 128;
        a0[t] = _mm512_loadu_si512(a), a1[t] = _mm512_loadu_si512(a + 64);
        lanes[t] = _mm512_loadu_ps(qa.lanes.data() + ((t0 + t) * nsb + sb) * 16);
      }
      #pragma GCC unroll 8
      for (int i = 0; i < R; ++i) {
        if (pf) _mm_prefetch(reinterpret_cast<const char*>(row[i] + sb * 64) + pf, _MM_HINT_T0);
        if (pf_scales >= 0 && sb % 8 == 0 && sb * 8 < static_cast<int64_t>(l.scale_row_bytes))
          _mm_prefetch(reinterpret_cast<const char*>(sc[i] + sb * 8) + pf_scales, _MM_HINT_T0);
        const __m512i c = _mm512_loadu_si512(row[i] + sb * 64);
        const __m512i lo = _mm512_and_si512(c, mask), hi = _mm512_and_si512(_mm512_srli_epi16(c, 4), mask);
        const __m512 sw = lane_scales(sc[i], row_scale[i], sb);
        #pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
          __m512i ai = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, a0[t]);
          ai = _mm512_dpbusd_epi32(ai, hi, a1[t]);
          acc[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai), _mm512_mul_ps(sw, lanes[t]), acc[i][t]);
        }
      }
    }
    for (int i = 0; i < R; ++i)
      for (int t = 0; t < T; ++t) y[(t0 + t) * ldy + r + i] = _mm512_reduce_add_ps(acc[i][t]) + correction(sc[i], row_scale[i], xg.data() + t * ng);
  }
  if constexpr (R > 1) {
    if (r < r1) rows_vnni<T, 1>(W, qa, t0, r, r1, y, ldy, sb0);
  }
}

// int8 weights (one f32 scale per row): the codes become unsigned by
// flipping their sign bit (w + 128), split into even and odd columns per
// 32-column block to match the activations' order; the 128 * sum(x) that
// the flip adds is taken off at the end.
template <int T>
void rows_vnni_i8(const Matrix& W, const QuantizedActs& qa, int t0, int64_t r0, int64_t r1, float* y, int64_t ldy, int64_t sb0) {
  const MatrixLayout l = layout_of(W.format, W.rows, W.cols);
  const int64_t cols = W.cols, nsb = cols / 128, nb = cols / 32;
  // Byte indices: even columns of the 4 blocks of a 128-column superblock
  // (source: two 64-byte halves), then odd ones.
  alignas(64) uint8_t ie[64], io[64];
  for (int k = 0; k < 4; ++k)
    for (int c = 0; c < 16; ++c) ie[k * 16 + c] = static_cast<uint8_t>(k * 32 + 2 * c), io[k * 16 + c] = static_cast<uint8_t>(k * 32 + 2 * c + 1);
  const __m512i idx_e = _mm512_load_si512(ie), idx_o = _mm512_load_si512(io), flip = _mm512_set1_epi8(static_cast<char>(0x80));
  float xsum[T];
  for (int t = 0; t < T; ++t) {
    xsum[t] = 0;
    for (int64_t j = 0; j < nb; ++j) xsum[t] += qa.bsum[(t0 + t) * nb + j];
  }
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = W.data + static_cast<std::size_t>(r) * l.row_stride;
    float s;
    std::memcpy(&s, W.data + l.scale_offset + static_cast<std::size_t>(r) * l.scale_row_bytes, 4);
    __m512 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t sb = sb0; sb < nsb; ++sb) {
      _mm_prefetch(reinterpret_cast<const char*>(row + sb * 128) + 2048, _MM_HINT_T0);
      const __m512i w0 = _mm512_loadu_si512(row + sb * 128), w1 = _mm512_loadu_si512(row + sb * 128 + 64);
      const __m512i we = _mm512_xor_si512(_mm512_permutex2var_epi8(w0, idx_e, w1), flip);
      const __m512i wo = _mm512_xor_si512(_mm512_permutex2var_epi8(w0, idx_o, w1), flip);
      #pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const int8_t* a = qa.codes.data() + ((t0 + t) * nsb + sb) * 128;
        __m512i ai = _mm512_dpbusd_epi32(_mm512_setzero_si512(), we, _mm512_loadu_si512(a));
        ai = _mm512_dpbusd_epi32(ai, wo, _mm512_loadu_si512(a + 64));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai), _mm512_loadu_ps(qa.lanes.data() + ((t0 + t) * nsb + sb) * 16), acc[t]);
      }
    }
    for (int t = 0; t < T; ++t) y[(t0 + t) * ldy + r] = s * (_mm512_reduce_add_ps(acc[t]) - 128.0f * xsum[t]);
  }
}

}  // namespace

void matmul_rows_vnni(const Matrix& W, const QuantizedActs& qa, int64_t r0, int64_t r1, float* y, int64_t ldy, int64_t col0) {
  const int64_t sb0 = std::clamp<int64_t>(col0, 0, W.cols) / 128;
  // Prefill: rows in blocks of 16 (16 KB of codes at 2048 columns, kept in
  // L1) against every group of 4 tokens, so each weight is read from memory
  // once per call and from cache for the other tokens.
  constexpr int64_t kRows = 16;
  for (int64_t rb = r0; rb < r1; rb += kRows) {
    const int64_t re = std::min(r1, rb + kRows);
    int t = 0;
    if (W.format == QuantFormat::I8) {
      for (; t + 4 <= qa.T; t += 4) rows_vnni_i8<4>(W, qa, t, rb, re, y, ldy, sb0);
      switch (qa.T - t) {
        case 1: rows_vnni_i8<1>(W, qa, t, rb, re, y, ldy, sb0); break;
        case 2: rows_vnni_i8<2>(W, qa, t, rb, re, y, ldy, sb0); break;
        case 3: rows_vnni_i8<3>(W, qa, t, rb, re, y, ldy, sb0); break;
        default: break;
      }
      continue;
    }
    for (; t + 4 <= qa.T; t += 4) rows_vnni<4, 1>(W, qa, t, rb, re, y, ldy, sb0);
    switch (qa.T - t) {
      case 1: rows_vnni<1, 2>(W, qa, t, rb, re, y, ldy, sb0); break;
      case 2: rows_vnni<2, 1>(W, qa, t, rb, re, y, ldy, sb0); break;
      case 3: rows_vnni<3, 1>(W, qa, t, rb, re, y, ldy, sb0); break;
      default: break;
    }
  }
}

bool vnni_applies_gemm(const Matrix& W) {
  const bool int4 = W.format >= QuantFormat::I4 && W.format <= QuantFormat::I4_G128_ASYM;
  return int4 && W.cols % 128 == 0 && vnni_available();  // the AMX kernel takes int4 only
}

}  // namespace coli::cpu
