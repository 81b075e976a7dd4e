#include "cpu_backend.h"

#include <numeric>

#include <algorithm>
#include <numeric>

#include "kernels.h"
#include "kernels_amx.h"
#include "kernels_vnni.h"
#include "ref_kernels.h"
#include "thread_pool.h"

namespace coli::cpu {

// Routed experts use AMX from this many tokens on (VNNI below: a tile has 16
// token columns). Dev machine, 1-layer model, pp512, one session: experts
// 169 ms with a threshold of 64, 150 ms with 16.
constexpr int kAmxExpertTokens = 16;

CpuBackend::CpuBackend(const Model& model, CpuOptions opt) : m_(model), s_(model.spec()), fast_(opt.fast) {
  if (fast_) pool_ = std::make_unique<ThreadPool>(opt.threads);
}

CpuBackend::~CpuBackend() = default;

int CpuBackend::num_threads() const { return pool_ ? pool_->size() : 1; }

void CpuBackend::parallel(int n, const std::function<void(int)>& fn, bool fixed) {
  if (pool_ && fixed) pool_->run_static(n, fn);
  else if (pool_) pool_->run(n, fn);
  else
    for (int i = 0; i < n; ++i) fn(i);
}

void CpuBackend::mm(const Matrix& W, const float* x, int T, float* y) { mm_many({{&W, y}}, x, T); }

void CpuBackend::mm_many(std::initializer_list<std::pair<const Matrix*, float*>> outs, const float* x, int T) {
  if (!fast_) {
    for (const auto& [W, y] : outs) matmul(*W, x, T, y);
    return;
  }
  // One job list over all matrices; activations prepared once per input width and kind.
  struct Job {
    const Matrix* W;
    float* y;
    int64_t r0, r1;
  };
  std::vector<Job> jobs;
  int64_t total_rows = 0;
  for (const auto& o : outs) total_rows += o.first->rows;
  // Enough jobs to balance the threads; prefill blocks are multiples of 16
  // rows (an AMX tile), decode blocks at least 8.
  const int64_t target = static_cast<int64_t>(pool_->size()) * 4;
  int64_t block = std::max<int64_t>(8, (total_rows + target - 1) / target);
  if (T > 4) block = std::max<int64_t>(16, block / 16 * 16);
  for (const auto& [W, y] : outs)
    for (int64_t r = 0; r < W->rows; r += block) jobs.push_back({W, y, r, std::min(W->rows, r + block)});
  const int64_t cols = outs.begin()->first->cols;
  QuantizedActs qa;
  AmxActs aa;
  std::vector<float> xsum;
  bool need_q = false, need_f = false, need_amx = false;
  for (const auto& o : outs) {
    (vnni_applies(*o.first, T) ? need_q : need_f) = true;
    need_amx |= amx_applies(*o.first, T);
  }
  if (need_q) quantize_acts(x, T, cols, &qa);
  if (need_amx) prepare_amx_acts(qa, &aa);
  if (need_f) {
    xsum.resize(static_cast<std::size_t>(T) * ((cols + 31) / 32));
    group_sums(x, T, cols, xsum.data());
  }
  pool_->run(static_cast<int>(jobs.size()), [&](int j) {
    const Job& jb = jobs[j];
    if (amx_applies(*jb.W, T)) matmul_rows_amx(*jb.W, aa, jb.r0, jb.r1, jb.y, jb.W->rows);
    else if (vnni_applies(*jb.W, T)) matmul_rows_vnni(*jb.W, qa, jb.r0, jb.r1, jb.y, jb.W->rows);
    else matmul_rows(*jb.W, x, xsum.data(), T, jb.r0, jb.r1, jb.y, jb.W->rows);
  });
}

void CpuBackend::swiglu_mm(const ExpertWeights& e, const float* x, int T, float* out) {
  const int I = static_cast<int>(e.gate.rows);
  std::vector<float> g(static_cast<std::size_t>(T) * I), u(g.size());
  mm_many({{&e.gate, g.data()}, {&e.up, u.data()}}, x, T);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = silu(g[i]) * u[i];
  mm(e.down, g.data(), T, out);
}

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
  mm(m_.layer(layer).moe.router, hn, T, p.data());
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

void CpuBackend::shared_expert(int layer, int T, const float* hn, float* out) {
  const MoeWeights& moe = m_.layer(layer).moe;
  const int H = s_.hidden_size;
  std::vector<float> gate(T);
  swiglu_mm(moe.shared, hn, T, out);
  mm(moe.shared_gate, hn, T, gate.data());
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < H; ++i) out[t * H + i] *= sigmoid(gate[t]);
}

void CpuBackend::routed_experts(int layer, const ExpertPair* pairs, int n, const float* hn, float* out) {
  const MoeWeights& moe = m_.layer(layer).moe;
  const int H = s_.hidden_size;
  if (fast_) {
    // Two parallel jobs for all experts of the layer: (1) gate, up and
    // SiLU*up for every (expert, row block); (2) down for every output row
    // block, summing the experts' weighted outputs into rows it owns.
    const int I = s_.moe_intermediate_size;
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return pairs[a].expert < pairs[b].expert; });
    struct Group {
      int expert, begin, count;  // into order
      std::vector<float> x, xsum, act, actsum;
      QuantizedActs qx, qact;  // for the VNNI kernel (int4)
      AmxActs ax, aact;        // for the AMX kernel (16 tokens or more)
    };
    std::vector<Group> groups;
    for (int i = 0; i < n;) {
      int j = i;
      while (j < n && pairs[order[j]].expert == pairs[order[i]].expert) ++j;
      Group g;
      g.expert = pairs[order[i]].expert;
      g.begin = i;
      g.count = j - i;
      g.x.resize(static_cast<std::size_t>(g.count) * H);
      for (int c = 0; c < g.count; ++c) std::copy_n(hn + static_cast<std::size_t>(pairs[order[i + c]].token) * H, H, g.x.data() + c * H);
      g.xsum.resize(static_cast<std::size_t>(g.count) * ((H + 31) / 32));
      group_sums(g.x.data(), g.count, H, g.xsum.data());
      g.act.resize(static_cast<std::size_t>(g.count) * I);
      if (vnni_applies(moe.experts[g.expert].gate, g.count)) quantize_acts(g.x.data(), g.count, H, &g.qx);
      // AMX pays for experts only with many tokens: a few are padded to a tile of 16.
      if (g.count >= kAmxExpertTokens && amx_applies(moe.experts[g.expert].gate, g.count)) prepare_amx_acts(g.qx, &g.ax);
      groups.push_back(std::move(g));
      i = j;
    }
    constexpr int kRowBlock = 64;
    const int iblocks = (I + kRowBlock - 1) / kRowBlock;
    parallel(static_cast<int>(groups.size()) * iblocks, [&](int job) {
      Group& g = groups[job / iblocks];
      const int64_t r0 = int64_t(job % iblocks) * kRowBlock, r1 = std::min<int64_t>(I, r0 + kRowBlock);
      const ExpertWeights& e = moe.experts[g.expert];
      thread_local std::vector<float> gate, up;
      gate.resize(static_cast<std::size_t>(g.count) * I);
      up.resize(gate.size());
      if (g.ax.T) {
        matmul_rows_amx(e.gate, g.ax, r0, r1, gate.data(), I);
        matmul_rows_amx(e.up, g.ax, r0, r1, up.data(), I);
      } else if (g.qx.T) {
        matmul_rows_vnni(e.gate, g.qx, r0, r1, gate.data(), I);
        matmul_rows_vnni(e.up, g.qx, r0, r1, up.data(), I);
      } else {
        matmul_rows(e.gate, g.x.data(), g.xsum.data(), g.count, r0, r1, gate.data(), I);
        matmul_rows(e.up, g.x.data(), g.xsum.data(), g.count, r0, r1, up.data(), I);
      }
      for (int t = 0; t < g.count; ++t)
        for (int64_t r = r0; r < r1; ++r) g.act[t * I + r] = silu(gate[t * I + r]) * up[t * I + r];
    });
    for (auto& g : groups) {
      g.actsum.resize(static_cast<std::size_t>(g.count) * ((I + 31) / 32));
      group_sums(g.act.data(), g.count, I, g.actsum.data());
      if (vnni_applies(moe.experts[g.expert].down, g.count)) quantize_acts(g.act.data(), g.count, I, &g.qact);
      if (g.count >= kAmxExpertTokens && amx_applies(moe.experts[g.expert].down, g.count)) prepare_amx_acts(g.qact, &g.aact);
    }
    const int hblocks = (H + kRowBlock - 1) / kRowBlock;
    parallel(hblocks, [&](int job) {
      const int64_t r0 = int64_t(job) * kRowBlock, r1 = std::min<int64_t>(H, r0 + kRowBlock);
      thread_local std::vector<float> y;
      for (const Group& g : groups) {
        y.resize(static_cast<std::size_t>(g.count) * H);
        if (g.aact.T) matmul_rows_amx(moe.experts[g.expert].down, g.aact, r0, r1, y.data(), H);
        else if (g.qact.T) matmul_rows_vnni(moe.experts[g.expert].down, g.qact, r0, r1, y.data(), H);
        else matmul_rows(moe.experts[g.expert].down, g.act.data(), g.actsum.data(), g.count, r0, r1, y.data(), H);
        for (int c = 0; c < g.count; ++c) {
          const ExpertPair& p = pairs[order[g.begin + c]];
          float* o = out + static_cast<std::size_t>(p.token) * H;
          for (int64_t r = r0; r < r1; ++r) o[r] += p.weight * y[c * H + r];
        }
      }
    });
    return;
  }
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
    swiglu_mm(moe.experts[e], xin.data(), cnt, y.data());
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
  mm(m_.lm_head(), hn.data(), T, out);
}

}  // namespace coli::cpu
