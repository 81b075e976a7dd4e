// Gated DeltaNet (Qwen3.5 linear attention), token by token:
//   qkv = causal depthwise conv(in_proj_qkv(x)) then SiLU; q, k L2-normalised,
//   q scaled by 1/sqrt(d_k); beta = sigmoid(b); g = -exp(A_log) * softplus(a + dt_bias)
//   S <- exp(g) S;  S <- S + k (beta (v - S^T k))^T;  o = S^T q
//   out = out_proj(RMSNorm(o) * w * silu(z))  per value head.
// Value head h reads key head h / (v_heads / k_heads). Decode cost is O(1)
// in the context length: the state is all the past there is.
#include <cmath>

#include "cpu_backend.h"
#include "deltanet_step.h"
#include "ref_kernels.h"

namespace coli::cpu {

void CpuBackend::deltanet(const LayerWeights& lw, LayerState& st, int T, const float* hn, float* out) {
  const DeltaNetWeights& g = lw.gdn;
  const int nk = s_.linear_num_key_heads, nv = s_.linear_num_value_heads;
  const int dk = s_.linear_key_head_dim, dv = s_.linear_value_head_dim;
  const int kd = nk * dk, vd = nv * dv, cd = s_.linear_conv_dim(), K = s_.linear_conv_kernel;
  std::vector<float> qkv(static_cast<std::size_t>(T) * cd), z(static_cast<std::size_t>(T) * vd);
  std::vector<float> b(static_cast<std::size_t>(T) * nv), a(b.size());
  mm_many({{&g.in_proj_qkv, qkv.data()}, {&g.in_proj_z, z.data()}, {&g.in_proj_b, b.data()}, {&g.in_proj_a, a.data()}}, hn, T);

  std::vector<float> conv_out(cd), normed(static_cast<std::size_t>(T) * vd);
  for (int t = 0; t < T; ++t) {
    const float* xin = qkv.data() + static_cast<std::size_t>(t) * cd;
    // Causal depthwise conv over (K-1 history rows, this row), then SiLU;
    // channel blocks in parallel.
    constexpr int kConvBlock = 512;
    parallel((cd + kConvBlock - 1) / kConvBlock, [&](int blk) {
      for (int c = blk * kConvBlock; c < std::min(cd, (blk + 1) * kConvBlock); ++c) {
        float acc = 0;
        for (int j = 0; j < K - 1; ++j) acc += g.conv1d[c * K + j] * st.conv[static_cast<std::size_t>(j) * cd + c];
        acc += g.conv1d[c * K + K - 1] * xin[c];
        conv_out[c] = silu(acc);
      }
    });
    if (K > 1) {
      std::copy(st.conv.begin() + cd, st.conv.end(), st.conv.begin());
      std::copy(xin, xin + cd, st.conv.end() - cd);
    }
    float* q = conv_out.data();
    float* k = conv_out.data() + kd;
    const float* v = conv_out.data() + 2 * kd;
    const float qscale = 1.0f / std::sqrt(static_cast<float>(dk));
    for (int h = 0; h < nk; ++h) {
      l2_norm(q + h * dk, dk, 1e-6f);
      l2_norm(k + h * dk, dk, 1e-6f);
      for (int i = 0; i < dk; ++i) q[h * dk + i] *= qscale;
    }
    // Value heads are independent: one job each.
    parallel(nv, [&](int h) {
      thread_local std::vector<float> oh;
      oh.resize(dv);
      const int kh = h / (nv / nk);
      const float* qh = q + kh * dk;
      const float* khv = k + kh * dk;
      const float* vh = v + h * dv;
      const float beta = sigmoid(b[t * nv + h]);
      const float gate = -std::exp(g.A_log[h]) * softplus(a[t * nv + h] + g.dt_bias[h]);
      const float decay = std::exp(gate);
      float* S = st.S.data() + static_cast<std::size_t>(h) * dk * dv;  // [dk, dv]
      if (fast_) gdn_head_step(S, qh, khv, vh, beta, decay, dk, dv, oh.data());
      else gdn_head_step_ref(S, qh, khv, vh, beta, decay, dk, dv, oh.data());
      // Gated RMSNorm: norm first, then weight, then silu(z).
      float* nh = normed.data() + static_cast<std::size_t>(t) * vd + h * dv;
      rms_norm(oh.data(), g.norm.data(), dv, s_.rms_norm_eps, nh);
      const float* zh = z.data() + static_cast<std::size_t>(t) * vd + h * dv;
      for (int j = 0; j < dv; ++j) nh[j] *= silu(zh[j]);
    }, /*fixed=*/true);
  }
  mm(g.out_proj, normed.data(), T, out);
}

}  // namespace coli::cpu
