// Full attention: q_proj yields the query and, with an output gate
// (qwen3_5_moe, qwen3_next: ModelSpec::attention_output_gate), the gate per
// head; per-head RMSNorm on q and k; rotary embedding on the first
// rotary_dim dims; GQA over the KV cache; sigmoid(gate) on the output.
#include <cmath>

#include "cpu_backend.h"
#include "util/error.h"
#include "ref_kernels.h"
#include "vec_ops.h"
#include "util/buffer.h"

namespace coli::cpu {

void CpuBackend::attention(const LayerWeights& lw, LayerState& st, int pos0, int T, const float* hn, float* out, LayerState* const* rows,
                           const int* pos) {
  const AttentionWeights& a = lw.attn;
  const int hd = s_.head_dim, nh = s_.num_heads, nkv = s_.num_kv_heads;
  const bool gated_out = s_.attention_output_gate;
  const int per_head = gated_out ? 2 * hd : hd, qg_w = nh * per_head, kv_w = nkv * hd, group = nh / nkv;
  Buffer<float> qg(static_cast<std::size_t>(T) * qg_w), k(static_cast<std::size_t>(T) * kv_w), v(k.size());
  mm_many({{&a.q_proj, qg.data()}, {&a.k_proj, k.data()}, {&a.v_proj, v.data()}}, hn, T);

  // Token t's sequence state and position: one sequence from pos0, or
  // (rows) a sequence per token.
  auto state_of = [&](int t) -> LayerState& { return rows ? *rows[t] : st; };
  auto pos_of = [&](int t) { return rows ? pos[t] : pos0 + t; };
  // Normalise and rotate the new keys, then append them to the cache.
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < nkv; ++h) {
      float* kh = k.data() + t * kv_w + h * hd;
      norm_row(kh, a.k_norm.data(), hd, kh);
      rope(kh, s_.rotary_dim, pos_of(t), s_.rope_theta);
    }
  if (rows) {
    for (int t = 0; t < T; ++t) {
      if (static_cast<std::size_t>(pos[t]) * kv_w > rows[t]->k.size()) throw Error("attention: a row's position is past its cache's end (internal)");
      rows[t]->k.resize(static_cast<std::size_t>(pos[t]) * kv_w), rows[t]->v.resize(static_cast<std::size_t>(pos[t]) * kv_w);  // a rewound session
      rows[t]->k.insert(rows[t]->k.end(), k.begin() + t * kv_w, k.begin() + (t + 1) * kv_w);
      rows[t]->v.insert(rows[t]->v.end(), v.begin() + t * kv_w, v.begin() + (t + 1) * kv_w);
    }
  } else {
    // From pos0 on: a rewound session's cache (or the MTP layer's, drafting
    // again from an earlier position) is cut there.
    if (static_cast<std::size_t>(pos0) * kv_w > st.k.size()) throw Error("attention: position " + std::to_string(pos0) + " is past the cache's end (internal)");
    st.k.resize(static_cast<std::size_t>(pos0) * kv_w), st.v.resize(static_cast<std::size_t>(pos0) * kv_w);
    st.k.insert(st.k.end(), k.begin(), k.end());
    st.v.insert(st.v.end(), v.begin(), v.end());
  }

  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  Buffer<float> gated(static_cast<std::size_t>(T) * nh * hd);
  // One job per (token, head): each writes its own slice of `gated`.
  parallel(T * nh, [&](int job) {
    const int t = job / nh, h = job % nh;
    thread_local std::vector<float> q, scores, o;
    q.resize(hd);
    o.assign(hd, 0.0f);
    const int n_ctx = pos_of(t) + 1;  // causal: positions 0 .. its own
    scores.resize(n_ctx);
    const float* qsrc = qg.data() + t * qg_w + h * per_head;  // query, then gate
    norm_row(qsrc, a.q_norm.data(), hd, q.data());
    rope(q.data(), s_.rotary_dim, pos_of(t), s_.rope_theta);
    const int kvh = h / group;
    const LayerState& sq = state_of(t);
    const float* K = sq.k.data() + kvh * hd;
    const float* Vv = sq.v.data() + kvh * hd;
    if (fast_) {
      for (int j = 0; j < n_ctx; ++j) scores[j] = vdot(q.data(), K + static_cast<std::size_t>(j) * kv_w, hd) * scale;
      softmax(scores.data(), n_ctx);
      for (int j = 0; j < n_ctx; ++j) vaxpy(scores[j], Vv + static_cast<std::size_t>(j) * kv_w, o.data(), hd);
    } else {
      for (int j = 0; j < n_ctx; ++j) scores[j] = dot(q.data(), K + static_cast<std::size_t>(j) * kv_w, hd) * scale;
      softmax(scores.data(), n_ctx);
      for (int j = 0; j < n_ctx; ++j) {
        const float* vj = Vv + static_cast<std::size_t>(j) * kv_w;
        for (int d = 0; d < hd; ++d) o[d] += scores[j] * vj[d];
      }
    }
    float* dst = gated.data() + static_cast<std::size_t>(t) * nh * hd + h * hd;
    if (gated_out) {
      const float* gate = qsrc + hd;
      for (int d = 0; d < hd; ++d) dst[d] = o[d] * sigmoid(gate[d]);
    } else {
      for (int d = 0; d < hd; ++d) dst[d] = o[d];
    }
  });
  mm(a.o_proj, gated.data(), T, out);
}

}  // namespace coli::cpu
