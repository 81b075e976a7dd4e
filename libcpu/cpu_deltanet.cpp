// Gated DeltaNet (Qwen3.5 linear attention), token by token:
//   qkv = causal depthwise conv(in_proj_qkv(x)) then SiLU; q, k L2-normalised,
//   q scaled by 1/sqrt(d_k); beta = sigmoid(b); g = -exp(A_log) * softplus(a + dt_bias)
//   S <- exp(g) S;  S <- S + k (beta (v - S^T k))^T;  o = S^T q
//   out = out_proj(RMSNorm(o) * w * silu(z))  per value head.
// Value head h reads key head h / (v_heads / k_heads). Decode cost is O(1)
// in the context length: the state is all the past there is.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu_backend.h"
#include "deltanet_chunk.h"
#include "deltanet_step.h"
#include "ref_kernels.h"
#include "util/buffer.h"

namespace coli::cpu {

// Prompts of at least this many tokens take the chunked form.
constexpr int kGdnChunkMinTokens = 16;

void CpuBackend::deltanet(const LayerWeights& lw, LayerState& st, int T, const float* hn, float* out, LayerState* const* rows) {
  const DeltaNetWeights& g = lw.gdn;
  const int nk = s_.linear_num_key_heads, nv = s_.linear_num_value_heads;
  const int dk = s_.linear_key_head_dim, dv = s_.linear_value_head_dim;
  const int kd = nk * dk, vd = nv * dv, cd = s_.linear_conv_dim(), K = s_.linear_conv_kernel;
  Buffer<float> qkv(static_cast<std::size_t>(T) * cd), z(static_cast<std::size_t>(T) * vd);
  Buffer<float> b(static_cast<std::size_t>(T) * nv), a(b.size());
  mm_many({{&g.in_proj_qkv, qkv.data()}, {&g.in_proj_z, z.data()}, {&g.in_proj_b, b.data()}, {&g.in_proj_a, a.data()}}, hn, T);

  // Token t's state: the one sequence's, or (rows) its own sequence's.
  auto state_of = [&](int t) -> LayerState& { return rows ? *rows[t] : st; };
  // Three passes over the chunk, each parallel across independent lanes of
  // work, so a T-token prompt costs three parallel jobs, not 2T:
  // (1) causal depthwise conv + SiLU, per channel block, sequential in t;
  Buffer<float> conv_out(static_cast<std::size_t>(T) * cd), normed(static_cast<std::size_t>(T) * vd);
  constexpr int kConvBlock = 512;
  parallel((cd + kConvBlock - 1) / kConvBlock, [&](int blk) {
    const int c0 = blk * kConvBlock, c1 = std::min(cd, (blk + 1) * kConvBlock);
    for (int t = 0; t < T; ++t) {
      const float* xin = qkv.data() + static_cast<std::size_t>(t) * cd;
      std::vector<float>& conv = state_of(t).conv;
      for (int c = c0; c < c1; ++c) {
        // Window: the K-1 previous inputs (state rows, oldest first), then this one.
        float acc = g.conv1d[c * K + K - 1] * xin[c];
        for (int j = 0; j < K - 1; ++j) acc += g.conv1d[c * K + j] * conv[static_cast<std::size_t>(j) * cd + c];
        conv_out[static_cast<std::size_t>(t) * cd + c] = silu(acc);
        for (int j = 0; j + 1 < K - 1; ++j) conv[static_cast<std::size_t>(j) * cd + c] = conv[static_cast<std::size_t>(j + 1) * cd + c];
        if (K > 1) conv[static_cast<std::size_t>(K - 2) * cd + c] = xin[c];
      }
    }
  });
  // (2) q and k L2-normalised (q also scaled by 1/sqrt(d_k)), per token;
  const float qscale = 1.0f / std::sqrt(static_cast<float>(dk));
  parallel(T, [&](int t) {
    float* q = conv_out.data() + static_cast<std::size_t>(t) * cd;
    float* k = q + kd;
    for (int h = 0; h < nk; ++h) {
      l2_norm(q + h * dk, dk, 1e-6f);
      l2_norm(k + h * dk, dk, 1e-6f);
      for (int i = 0; i < dk; ++i) q[h * dk + i] *= qscale;
    }
  });
  // A session being verified (mark_state) keeps each token's inputs so that
  // rewind_state can replay the recurrence over the ones it accepts.
  const bool keep = !rows && st.keep;
  const std::size_t j0 = keep ? static_cast<std::size_t>(st.kept) : 0;
  if (keep) {
    st.in.insert(st.in.end(), qkv.data(), qkv.data() + static_cast<std::size_t>(T) * cd);
    st.qkv.insert(st.qkv.end(), conv_out.data(), conv_out.data() + static_cast<std::size_t>(T) * cd);
    st.beta.resize((j0 + T) * nv), st.decay.resize((j0 + T) * nv);
    st.kept += T;
  }
  // (3) the recurrence, per value head (independent), sequential in t; each
  // head stays on one thread so its state stays in that core's cache.
  // Token steps, or with gdn_chunked a prompt in chunks of kGdnChunk tokens
  // in the chunked form (not while keeping: the replay runs token steps).
  const bool chunked = gdn_chunked_ && T >= kGdnChunkMinTokens && !rows && !keep;
  parallel(nv, [&](int h) {
    thread_local std::vector<float> oh, beta, gl;
    const int kh = h / (nv / nk);
    float* S = st.S.data() + static_cast<std::size_t>(h) * dk * dv;  // [dk, dv] (rows: token t's own, below)
    const float a_h = -std::exp(g.A_log[h]);
    // Gated RMSNorm of token t's head output: norm, then weight, then silu(z).
    auto finish = [&](int t, const float* o) {
      float* nh = normed.data() + static_cast<std::size_t>(t) * vd + h * dv;
      rms_norm(o, g.norm.data(), dv, s_.rms_norm_eps, nh);
      const float* zh = z.data() + static_cast<std::size_t>(t) * vd + h * dv;
      for (int j = 0; j < dv; ++j) nh[j] *= silu(zh[j]);
    };
    if (chunked) {
      oh.resize(static_cast<std::size_t>(kGdnChunk) * dv);
      beta.resize(kGdnChunk);
      gl.resize(kGdnChunk);
      for (int t0 = 0; t0 < T; t0 += kGdnChunk) {
        const int n = std::min(kGdnChunk, T - t0);
        for (int i = 0; i < n; ++i) {
          beta[i] = sigmoid(b[(t0 + i) * nv + h]);
          gl[i] = a_h * softplus(a[(t0 + i) * nv + h] + g.dt_bias[h]);
        }
        const float* row = conv_out.data() + static_cast<std::size_t>(t0) * cd;
        gdn_head_chunk(S, row + kh * dk, row + kd + kh * dk, cd, row + 2 * kd + h * dv, cd, beta.data(), gl.data(), n, dk, dv, oh.data());
        for (int i = 0; i < n; ++i) finish(t0 + i, oh.data() + static_cast<std::size_t>(i) * dv);
      }
      return;
    }
    oh.resize(dv);
    for (int t = 0; t < T; ++t) {
      const float* row = conv_out.data() + static_cast<std::size_t>(t) * cd;
      const float* qh = row + kh * dk;
      const float* khv = row + kd + kh * dk;
      const float* vh = row + 2 * kd + h * dv;
      const float beta_t = sigmoid(b[t * nv + h]);
      const float decay = std::exp(a_h * softplus(a[t * nv + h] + g.dt_bias[h]));
      if (keep) st.beta[(j0 + t) * nv + h] = beta_t, st.decay[(j0 + t) * nv + h] = decay;
      float* St = rows ? rows[t]->S.data() + static_cast<std::size_t>(h) * dk * dv : S;
      if (fast_) gdn_head_step(St, qh, khv, vh, beta_t, decay, dk, dv, oh.data());
      else gdn_head_step_ref(St, qh, khv, vh, beta_t, decay, dk, dv, oh.data());
      finish(t, oh.data());
    }
  }, /*fixed=*/true);
  mm(g.out_proj, normed.data(), T, out);
}

}  // namespace coli::cpu
