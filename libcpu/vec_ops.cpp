// GCC 12 warns inside its own AVX-512 headers (the __Y = __Y idiom).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "vec_ops.h"

#include <immintrin.h>

#include "cpu_features.h"
#include "ref_kernels.h"

namespace coli::cpu {

namespace {
__attribute__((target("avx512f,fma"))) float dot512(const float* a, const float* b, int n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = s0;
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
  }
  for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
  float s = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}
__attribute__((target("avx512f,fma"))) void axpy512(float alpha, const float* x, float* y, int n) {
  const __m512 va = _mm512_set1_ps(alpha);
  int i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += alpha * x[i];
}
}  // namespace

float vdot(const float* a, const float* b, int n) { return active_level() == CpuLevel::kAvx512 ? dot512(a, b, n) : dot(a, b, n); }

void vaxpy(float alpha, const float* x, float* y, int n) {
  if (active_level() == CpuLevel::kAvx512) return axpy512(alpha, x, y, n);
  for (int i = 0; i < n; ++i) y[i] += alpha * x[i];
}

}  // namespace coli::cpu
