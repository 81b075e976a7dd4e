// AVX2 + FMA + F16C kernels (see kernels_simd.inc).
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "formats/dtype.h"
#include "kernels.h"

namespace coli::cpu {
namespace {
using V = __m256;
constexpr int W = 8;
inline V _add(V a, V b) { return _mm256_add_ps(a, b); }
inline V vzero() { return _mm256_setzero_ps(); }
inline V vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, V v) { _mm256_storeu_ps(p, v); }
inline V vset1(float f) { return _mm256_set1_ps(f); }
inline V vfma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
inline float vsum(V v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline V load_bf16(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
inline V load_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline V load_i8(const int8_t* p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))); }
inline void load_u4_32(const uint8_t* p, V out[4]) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(b, mask), hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
  const __m128i c0 = _mm_unpacklo_epi8(lo, hi), c1 = _mm_unpackhi_epi8(lo, hi);
  out[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(c0));
  out[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(c0, 8)));
  out[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(c1));
  out[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(c1, 8)));
}
inline void f16_array(const uint16_t* p, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i))));
  for (; i < n; ++i) out[i] = f16_to_f32(p[i]);
}
}  // namespace
#define KERNEL_NAME matmul_rows_avx2
#include "kernels_simd.inc"
}  // namespace coli::cpu
