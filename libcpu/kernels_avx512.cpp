// AVX-512 kernels (see kernels_simd.inc). Compiled for AVX-512 here only;
// dispatch makes sure they run only where the CPU has it.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")
// GCC 12 warns inside its own AVX-512 headers (the __Y = __Y idiom).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "formats/dtype.h"
#include "kernels.h"

namespace coli::cpu {
namespace {
using V = __m512;
constexpr int W = 16;
inline V _add(V a, V b) { return _mm512_add_ps(a, b); }
inline V vzero() { return _mm512_setzero_ps(); }
inline V vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, V v) { _mm512_storeu_ps(p, v); }
inline V vset1(float f) { return _mm512_set1_ps(f); }
inline V vfma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline float vsum(V v) { return _mm512_reduce_add_ps(v); }
inline V load_bf16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
inline V load_f16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline V load_i8(const int8_t* p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))); }
inline void load_u4_32(const uint8_t* p, V out[2]) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(b, mask), hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
  out[0] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
  out[1] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi)));
}
inline void f16_array(const uint16_t* p, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i))));
  for (; i < n; ++i) out[i] = f16_to_f32(p[i]);
}
}  // namespace
#define KERNEL_NAME matmul_rows_avx512
#include "kernels_simd.inc"
}  // namespace coli::cpu
