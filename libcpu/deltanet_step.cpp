// GCC 12 warns inside its own AVX-512 headers (the __Y = __Y idiom).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "deltanet_step.h"

#include <immintrin.h>

#include <vector>

#include "cpu_features.h"

namespace coli::cpu {

void gdn_head_step_ref(float* S, const float* q, const float* k, const float* v, float beta, float decay, int dk, int dv, float* o) {
  std::vector<float> kv_mem(dv, 0.0f), delta(dv);
  for (int i = 0; i < dk * dv; ++i) S[i] *= decay;
  for (int i = 0; i < dk; ++i)
    for (int j = 0; j < dv; ++j) kv_mem[j] += S[i * dv + j] * k[i];
  for (int j = 0; j < dv; ++j) delta[j] = (v[j] - kv_mem[j]) * beta;
  for (int j = 0; j < dv; ++j) o[j] = 0.0f;
  for (int i = 0; i < dk; ++i)
    for (int j = 0; j < dv; ++j) S[i * dv + j] += k[i] * delta[j];
  for (int i = 0; i < dk; ++i)
    for (int j = 0; j < dv; ++j) o[j] += S[i * dv + j] * q[i];
}

namespace {

__attribute__((target("avx512f,fma"))) void step_avx512(float* S, const float* q, const float* k, const float* v, float beta, float decay, int dk,
                                                         int dv, float* o) {
  // dv is a multiple of 16 here (128 in Qwen3.5), up to 256.
  const int n = dv / 16;
  __m512 mem[16], acc[16];
  for (int b = 0; b < n; ++b) mem[b] = _mm512_setzero_ps(), acc[b] = _mm512_setzero_ps();
  for (int i = 0; i < dk; ++i) {  // kv_mem = (decay S)^T k
    const __m512 ki = _mm512_set1_ps(k[i] * decay);
    for (int b = 0; b < n; ++b) mem[b] = _mm512_fmadd_ps(_mm512_loadu_ps(S + i * dv + b * 16), ki, mem[b]);
  }
  const __m512 vb = _mm512_set1_ps(beta), vd = _mm512_set1_ps(decay);
  __m512 delta[16];
  for (int b = 0; b < n; ++b) delta[b] = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(v + b * 16), mem[b]), vb);
  for (int i = 0; i < dk; ++i) {  // S = decay S + k delta^T; o += S^T q
    const __m512 ki = _mm512_set1_ps(k[i]), qi = _mm512_set1_ps(q[i]);
    for (int b = 0; b < n; ++b) {
      float* row = S + i * dv + b * 16;
      const __m512 s = _mm512_fmadd_ps(ki, delta[b], _mm512_mul_ps(_mm512_loadu_ps(row), vd));
      _mm512_storeu_ps(row, s);
      acc[b] = _mm512_fmadd_ps(s, qi, acc[b]);
    }
  }
  for (int b = 0; b < n; ++b) _mm512_storeu_ps(o + b * 16, acc[b]);
}

}  // namespace

void gdn_head_step(float* S, const float* q, const float* k, const float* v, float beta, float decay, int dk, int dv, float* o) {
  if (active_level() == CpuLevel::kAvx512 && dv % 16 == 0 && dv <= 256) return step_avx512(S, q, k, v, beta, decay, dk, dv, o);
  gdn_head_step_ref(S, q, k, v, beta, decay, dk, dv, o);
}

}  // namespace coli::cpu
