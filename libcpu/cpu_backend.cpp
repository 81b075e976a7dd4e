#include "cpu_backend.h"

#include <algorithm>
#include <numeric>

#include "ref_kernels.h"

namespace coli::cpu {

std::unique_ptr<BackendState> CpuBackend::new_state() const {
  auto st = std::make_unique<CpuState>();
  st->layers.resize(s_.num_layers);
  for (int l = 0; l < s_.num_layers; ++l) {
    if (s_.layer_kinds[l] != LayerKind::kLinearAttention) continue;
    st->layers[l].conv.assign(static_cast<std::size_t>(s_.linear_conv_kernel - 1) * s_.linear_conv_dim(), 0.0f);
    st->layers[l].S.assign(static_cast<std::size_t>(s_.linear_num_value_heads) * s_.linear_key_head_dim * s_.linear_value_head_dim, 0.0f);
  }
  return st;
}

void CpuBackend::embed(const int* ids, int T, float* x) {
  for (int t = 0; t < T; ++t) m_.embed().row_f32(ids[t], x + static_cast<std::size_t>(t) * s_.hidden_size);
}

void CpuBackend::trunk_step(int layer, BackendState& state, int pos0, int T, float* x) {
  const LayerWeights& lw = m_.layer(layer);
  LayerState& st = static_cast<CpuState&>(state).layers[layer];
  const int H = s_.hidden_size;
  std::vector<float> hn(static_cast<std::size_t>(T) * H), out(hn.size());
  for (int t = 0; t < T; ++t) rms_norm_1p(x + t * H, lw.input_norm.data(), H, s_.rms_norm_eps, hn.data() + t * H);
  if (lw.kind == LayerKind::kFullAttention) attention(lw, st, pos0, T, hn.data(), out.data());
  else deltanet(lw, st, T, hn.data(), out.data());
  for (std::size_t i = 0; i < hn.size(); ++i) x[i] += out[i];
}

void CpuBackend::ffn_norm(int layer, int T, const float* x, float* hn) {
  const int H = s_.hidden_size;
  for (int t = 0; t < T; ++t) rms_norm_1p(x + t * H, m_.layer(layer).post_norm.data(), H, s_.rms_norm_eps, hn + t * H);
}

void CpuBackend::route(int layer, int T, const float* hn, int* idx, float* w) {
  const int E = s_.num_experts, K = s_.num_experts_per_tok;
  std::vector<float> p(static_cast<std::size_t>(T) * E);
  matmul(m_.layer(layer).moe.router, hn, T, p.data());
  std::vector<int> order(E);
  for (int t = 0; t < T; ++t) {
    float* pt = p.data() + static_cast<std::size_t>(t) * E;
    softmax(pt, E);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int a, int b) { return pt[a] > pt[b] || (pt[a] == pt[b] && a < b); });
    float sum = 0;
    for (int k = 0; k < K; ++k) sum += pt[order[k]];
    for (int k = 0; k < K; ++k) {
      idx[t * K + k] = order[k];
      w[t * K + k] = pt[order[k]] / sum;
    }
  }
}

void swiglu(const ExpertWeights& e, const float* x, int T, float* out) {
  const int I = static_cast<int>(e.gate.rows);
  std::vector<float> g(static_cast<std::size_t>(T) * I), u(g.size());
  matmul(e.gate, x, T, g.data());
  matmul(e.up, x, T, u.data());
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = silu(g[i]) * u[i];
  matmul(e.down, g.data(), T, out);
}

void CpuBackend::shared_expert(int layer, int T, const float* hn, float* out) {
  const MoeWeights& moe = m_.layer(layer).moe;
  const int H = s_.hidden_size;
  std::vector<float> gate(T);
  swiglu(moe.shared, hn, T, out);
  matmul(moe.shared_gate, hn, T, gate.data());
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < H; ++i) out[t * H + i] *= sigmoid(gate[t]);
}

void CpuBackend::routed_experts(int layer, const ExpertPair* pairs, int n, const float* hn, float* out) {
  const MoeWeights& moe = m_.layer(layer).moe;
  const int H = s_.hidden_size;
  // Group by expert so each expert's weights are read once for all its tokens.
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return pairs[a].expert < pairs[b].expert; });
  std::vector<float> xin, y;
  for (int i = 0; i < n;) {
    int j = i;
    const int e = pairs[order[i]].expert;
    while (j < n && pairs[order[j]].expert == e) ++j;
    const int cnt = j - i;
    xin.resize(static_cast<std::size_t>(cnt) * H);
    y.resize(xin.size());
    for (int c = 0; c < cnt; ++c) std::copy_n(hn + static_cast<std::size_t>(pairs[order[i + c]].token) * H, H, xin.data() + c * H);
    swiglu(moe.experts[e], xin.data(), cnt, y.data());
    for (int c = 0; c < cnt; ++c) {
      const ExpertPair& p = pairs[order[i + c]];
      for (int h = 0; h < H; ++h) out[static_cast<std::size_t>(p.token) * H + h] += p.weight * y[c * H + h];
    }
    i = j;
  }
}

void CpuBackend::logits(int T, const float* x, float* out) {
  const int H = s_.hidden_size;
  std::vector<float> hn(static_cast<std::size_t>(T) * H);
  for (int t = 0; t < T; ++t) rms_norm_1p(x + t * H, m_.final_norm().data(), H, s_.rms_norm_eps, hn.data() + t * H);
  matmul(m_.lm_head(), hn.data(), T, out);
}

}  // namespace coli::cpu
