// Gated DeltaNet prefill for one value head over a chunk of n tokens in the
// chunked (WY / UT) form of the gated delta rule, as transformers'
// torch_chunk_gated_delta_rule computes it. With G the running sum of the
// log decays g inside the chunk and the strictly lower matrix
//   A[i][j] = -beta_i (k_i . k_j) exp(G_i - G_j),  T = (I - A)^-1 (forward
// substitution), the chunk's corrected values and the state update are
//   U = T (beta v),  W = T (beta exp(G) k),  V' = U - W S,
//   o_i = exp(G_i) S^T q_i + sum_{j<=i} (q_i . k_j) exp(G_i - G_j) V'_j,
//   S <- exp(G_n) S + sum_j exp(G_n - G_j) k_j V'_j^T.
// Equal to n recurrent steps (gdn_head_step) up to rounding, but S [dk, dv]
// is read a few times per chunk instead of twice per token, and the work is
// small dense matrix products.
#pragma once

namespace coli::cpu {

constexpr int kGdnChunk = 64;  // tokens per chunk (transformers' chunk_size)

// q, k: rows of dk floats with stride ldqk (q already scaled, q and k
// L2-normalised); v: rows of dv with stride ldv; beta, g (log decay, <= 0):
// n values; o: n rows of dv (stride dv). n <= kGdnChunk.
void gdn_head_chunk(float* S, const float* q, const float* k, int ldqk, const float* v, int ldv, const float* beta, const float* g, int n, int dk,
                    int dv, float* o);

}  // namespace coli::cpu
