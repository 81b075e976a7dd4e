// GCC 12 warns inside its own AVX-512 headers (the __Y = __Y idiom).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "deltanet_chunk.h"

#include <immintrin.h>

#include <cmath>
#include <vector>

#include "cpu_features.h"
#include "vec_ops.h"

namespace coli::cpu {

namespace {

// For each of n rows i: u_i -= sum_m w[i][m] S_m and o_i = e_i sum_m q[i][m] S_m
// (S [dk][dv]); AVX-512 with both rows' accumulators in registers.
__attribute__((target("avx512f,fma"))) void rows_times_state_avx512(const float* S, int dk, int dv, int n, const float* W, const float* q, int ldq,
                                                                     const float* G, float* U, float* o) {
  const int nb = dv / 16;  // <= 16
  for (int i = 0; i < n; ++i) {
    __m512 u[16], acc[16];
    float* ui = U + static_cast<std::size_t>(i) * dv;
    for (int b = 0; b < nb; ++b) u[b] = _mm512_loadu_ps(ui + b * 16), acc[b] = _mm512_setzero_ps();
    const float* wi = W + static_cast<std::size_t>(i) * dk;
    const float* qi = q + static_cast<std::size_t>(i) * ldq;
    for (int m = 0; m < dk; ++m) {
      const float* Sm = S + static_cast<std::size_t>(m) * dv;
      const __m512 wm = _mm512_set1_ps(wi[m]), qm = _mm512_set1_ps(qi[m]);
      for (int b = 0; b < nb; ++b) {
        const __m512 s = _mm512_loadu_ps(Sm + b * 16);
        u[b] = _mm512_fnmadd_ps(wm, s, u[b]);
        acc[b] = _mm512_fmadd_ps(qm, s, acc[b]);
      }
    }
    const __m512 e = _mm512_set1_ps(std::exp(G[i]));
    float* oi = o + static_cast<std::size_t>(i) * dv;
    for (int b = 0; b < nb; ++b) _mm512_storeu_ps(ui + b * 16, u[b]), _mm512_storeu_ps(oi + b * 16, _mm512_mul_ps(acc[b], e));
  }
}

// S_m = el S_m + sum_j c[j] k[j][m] V'_j for every row m of S.
__attribute__((target("avx512f,fma"))) void update_state_avx512(float* S, int dk, int dv, int n, float el, const float* c, const float* k, int ldk,
                                                                 const float* V) {
  const int nb = dv / 16;
  const __m512 ve = _mm512_set1_ps(el);
  for (int m = 0; m < dk; ++m) {
    float* Sm = S + static_cast<std::size_t>(m) * dv;
    __m512 acc[16];
    for (int b = 0; b < nb; ++b) acc[b] = _mm512_mul_ps(_mm512_loadu_ps(Sm + b * 16), ve);
    for (int j = 0; j < n; ++j) {
      const __m512 f = _mm512_set1_ps(c[j] * k[static_cast<std::size_t>(j) * ldk + m]);
      const float* Vj = V + static_cast<std::size_t>(j) * dv;
      for (int b = 0; b < nb; ++b) acc[b] = _mm512_fmadd_ps(f, _mm512_loadu_ps(Vj + b * 16), acc[b]);
    }
    for (int b = 0; b < nb; ++b) _mm512_storeu_ps(Sm + b * 16, acc[b]);
  }
}

}  // namespace

void gdn_head_chunk(float* S, const float* q, const float* k, int ldqk, const float* v, int ldv, const float* beta, const float* g, int n, int dk,
                    int dv, float* o) {
  thread_local std::vector<float> buf;
  const std::size_t C = static_cast<std::size_t>(n);
  buf.resize(C + 2 * C * C + 2 * C * dv + C * dk);
  float* G = buf.data();          // [n] running log decay
  float* A = G + C;               // [n][n] T = (I - A)^-1, built in place
  float* QK = A + C * C;          // [n][n] decayed q.k, lower incl. diagonal
  float* U = QK + C * C;          // [n][dv] T (beta v), then V'
  float* X = U + C * dv;          // [n][dv] scratch rows
  float* W = X + C * dv;          // [n][dk] T (beta exp(G) k)
  float run = 0.0f;
  for (int i = 0; i < n; ++i) G[i] = run += g[i];

  // A (strictly lower) and the decayed q.k (lower with the diagonal).
  for (int i = 0; i < n; ++i) {
    const float* ki = k + static_cast<std::size_t>(i) * ldqk;
    const float* qi = q + static_cast<std::size_t>(i) * ldqk;
    for (int j = 0; j < n; ++j) {
      const float* kj = k + static_cast<std::size_t>(j) * ldqk;
      const float d = j <= i ? std::exp(G[i] - G[j]) : 0.0f;
      A[i * C + j] = j < i ? -beta[i] * vdot(ki, kj, dk) * d : 0.0f;
      QK[i * C + j] = j <= i ? vdot(qi, kj, dk) * d : 0.0f;
    }
  }
  // Forward substitution: row i of (I - A)^-1 - I from the rows above it.
  for (int i = 1; i < n; ++i) {
    float* ai = A + i * C;
    for (int j = 0; j < i; ++j) X[j] = ai[j];
    for (int m = 0; m < i; ++m)
      if (X[m] != 0.0f) vaxpy(X[m], A + m * C, ai, m);  // A[m][j], j < m
  }
  for (int i = 0; i < n; ++i) A[i * C + i] = 1.0f;
  // U = T (beta v), W = T (beta exp(G) k).
  for (int i = 0; i < n; ++i) {
    float* ui = U + static_cast<std::size_t>(i) * dv;
    float* wi = W + static_cast<std::size_t>(i) * dk;
    for (int c = 0; c < dv; ++c) ui[c] = 0.0f;
    for (int c = 0; c < dk; ++c) wi[c] = 0.0f;
    for (int j = 0; j <= i; ++j) {
      const float t = A[i * C + j];
      vaxpy(t * beta[j], v + static_cast<std::size_t>(j) * ldv, ui, dv);
      vaxpy(t * beta[j] * std::exp(G[j]), k + static_cast<std::size_t>(j) * ldqk, wi, dk);
    }
  }
  // V' = U - W S; o_i = exp(G_i) S^T q_i + sum_j QK[i][j] V'_j (S before the update).
  const bool simd = active_level() == CpuLevel::kAvx512 && dv % 16 == 0 && dv <= 256;
  if (simd) rows_times_state_avx512(S, dk, dv, n, W, q, ldqk, G, U, o);
  for (int i = 0; i < n && !simd; ++i) {
    float* ui = U + static_cast<std::size_t>(i) * dv;
    float* oi = o + static_cast<std::size_t>(i) * dv;
    const float* wi = W + static_cast<std::size_t>(i) * dk;
    const float* qi = q + static_cast<std::size_t>(i) * ldqk;
    const float e = std::exp(G[i]);
    for (int c = 0; c < dv; ++c) oi[c] = 0.0f;
    for (int m = 0; m < dk; ++m) {
      const float* Sm = S + static_cast<std::size_t>(m) * dv;
      vaxpy(-wi[m], Sm, ui, dv);
      vaxpy(e * qi[m], Sm, oi, dv);
    }
  }
  for (int i = 0; i < n; ++i)
    for (int j = 0; j <= i; ++j) vaxpy(QK[i * C + j], U + static_cast<std::size_t>(j) * dv, o + static_cast<std::size_t>(i) * dv, dv);
  // S = exp(G_n) S + sum_j exp(G_n - G_j) k_j V'_j^T.
  const float last = G[n - 1], el = std::exp(last);
  for (int j = 0; j < n; ++j) X[j] = std::exp(last - G[j]);
  if (simd) return update_state_avx512(S, dk, dv, n, el, X, k, ldqk, U);
  for (int m = 0; m < dk; ++m) {
    float* Sm = S + static_cast<std::size_t>(m) * dv;
    for (int c = 0; c < dv; ++c) Sm[c] *= el;
    for (int j = 0; j < n; ++j) vaxpy(X[j] * k[static_cast<std::size_t>(j) * ldqk + m], U + static_cast<std::size_t>(j) * dv, Sm, dv);
  }
}

}  // namespace coli::cpu
