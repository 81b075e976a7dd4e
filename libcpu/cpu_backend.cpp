#include "cpu_backend.h"

#include <malloc.h>

#include <algorithm>
#include <mutex>
#include <numeric>

#include "kernels.h"
#include "kernels_amx.h"
#include "kernels_amx_bf16.h"
#include "kernels_vnni.h"
#include "deltanet_step.h"
#include "ref_kernels.h"
#include "thread_pool.h"
#include "util/buffer.h"
#include "util/error.h"

namespace coli::cpu {

namespace {
// Expert inputs are prepared on the pool from this many (token, expert)
// pairs on (a prefill chunk); a decode step's 8 are cheaper inline than
// two more pool dispatches.
constexpr int kParallelPrepPairs = 64;

// Tokens covered by the pairs: 1 + the largest token index.
int num_tokens(const ExpertPair* pairs, int n) {
  int T = 0;
  for (int i = 0; i < n; ++i) T = std::max(T, pairs[i].token + 1);
  return T;
}
}  // namespace


CpuBackend::CpuBackend(const Model& model, CpuOptions opt) : m_(model), s_(model.spec()), fast_(opt.fast), gdn_chunked_(opt.fast && opt.gdn_chunked), one_token_run_(opt.one_token_run) {
  if (!fast_) return;
  pool_ = std::make_unique<ThreadPool>(opt.threads);
  // A prefill chunk allocates and frees buffers of 100 KB - 30 MB in every
  // layer. glibc would map and unmap each one (page faults on every use, and
  // a TLB shootdown across all threads on every unmap); keep them in the
  // heap instead, and keep the heap.
  static std::once_flag once;
  std::call_once(once, [] {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  });
}

CpuBackend::~CpuBackend() = default;

void CpuBackend::hold_threads(bool on) {
  if (pool_) pool_->set_hot(on);
}

int CpuBackend::num_threads() const { return pool_ ? pool_->size() : 1; }

void CpuBackend::parallel(int n, const std::function<void(int)>& fn, bool fixed) {
  if (pool_ && fixed) pool_->run_static(n, fn);
  else if (pool_) pool_->run(n, fn);
  else
    for (int i = 0; i < n; ++i) fn(i);
}

void CpuBackend::parallel_ranges(int n, const std::function<void(int, int)>& fn) {
  const int chunks = std::min(n, num_threads() * 4);
  if (chunks <= 1) {
    if (n > 0) fn(0, n);
    return;
  }
  parallel(chunks, [&](int c) { fn(static_cast<int>(int64_t(n) * c / chunks), static_cast<int>(int64_t(n) * (c + 1) / chunks)); });
}

void CpuBackend::quantize_parallel(const float* x, int T, int64_t cols, QuantizedActs* qa, AmxActs* aa) {
  qa->resize(T, cols);
  parallel_ranges(T, [&](int t0, int t1) { quantize_acts_rows(x, t0, t1, qa); });
  if (!aa) return;
  aa->reset(*qa);
  parallel_ranges(aa->token_blocks(), [&](int b0, int b1) { prepare_amx_acts_blocks(*qa, b0, b1, aa); });
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
  // Enough jobs to balance the threads (decode: 4 per thread, blocks of at
  // least 8 rows; prefill: 8 per thread, blocks of 32 rows = two AMX row
  // tiles, so a thread that draws one job more waits little).
  const int64_t target = static_cast<int64_t>(pool_->size()) * (T > 4 ? 8 : 4);
  int64_t block = std::max<int64_t>(8, (total_rows + target - 1) / target);
  if (T > 4) block = std::max<int64_t>(32, block / 32 * 32);
  for (const auto& [W, y] : outs)
    for (int64_t r = 0; r < W->rows; r += block) jobs.push_back({W, y, r, std::min(W->rows, r + block)});
  const int64_t cols = outs.begin()->first->cols;
  QuantizedActs& qa = mm_qa_;
  AmxActs& aa = mm_aa_;
  std::vector<float> xsum;
  bool need_q = false, need_f = false, need_amx = false, need_bf16 = false;
  for (const auto& o : outs) {
    if (amx_bf16_applies(*o.first, T)) need_bf16 = true;
    else (vnni_applies(*o.first, T) ? need_q : need_f) = true;
    need_amx |= amx_applies(*o.first, T);
  }
  if (need_bf16) {
    mm_bf16_.reset(T, cols);
    parallel_ranges(mm_bf16_.token_blocks(), [&](int b0, int b1) { prepare_bf16_acts_blocks(x, b0, b1, &mm_bf16_); });
  }
  if (need_q) quantize_parallel(x, T, cols, &qa, need_amx ? &aa : nullptr);
  if (need_f) {
    const int64_t nb = (cols + 31) / 32;
    xsum.resize(static_cast<std::size_t>(T) * nb);
    parallel_ranges(T, [&](int t0, int t1) { group_sums(x + t0 * cols, t1 - t0, cols, xsum.data() + t0 * nb); });
  }
  pool_->run(static_cast<int>(jobs.size()), [&](int j) {
    const Job& jb = jobs[j];
    if (amx_bf16_applies(*jb.W, T)) matmul_rows_amx_bf16(*jb.W, mm_bf16_, jb.r0, jb.r1, jb.y, jb.W->rows);
    else if (amx_applies(*jb.W, T)) matmul_rows_amx(*jb.W, aa, jb.r0, jb.r1, jb.y, jb.W->rows);
    else if (vnni_applies(*jb.W, T)) matmul_rows_vnni(*jb.W, qa, jb.r0, jb.r1, jb.y, jb.W->rows);
    else matmul_rows(*jb.W, x, xsum.data(), T, jb.r0, jb.r1, jb.y, jb.W->rows);
  });
}

void CpuBackend::swiglu_mm(const ExpertWeights& e, const float* x, int T, float* out) {
  const int I = static_cast<int>(e.gate.rows);
  Buffer<float> g(static_cast<std::size_t>(T) * I), u(g.size());
  mm_many({{&e.gate, g.data()}, {&e.up, u.data()}}, x, T);
  parallel_ranges(T, [&](int t0, int t1) {
    for (std::size_t i = std::size_t(t0) * I; i < std::size_t(t1) * I; ++i) g[i] = silu(g[i]) * u[i];
  });
  mm(e.down, g.data(), T, out);
}

std::unique_ptr<BackendState> CpuBackend::new_state() const {
  auto st = std::make_unique<CpuState>();
  st->layers.resize(s_.num_layers_with_mtp());  // the MTP layer's KV cache last
  for (int l = 0; l < s_.num_layers; ++l) {
    if (s_.layer_kinds[l] != LayerKind::kLinearAttention) continue;
    st->layers[l].conv.assign(static_cast<std::size_t>(s_.linear_conv_kernel - 1) * s_.linear_conv_dim(), 0.0f);
    st->layers[l].S.assign(static_cast<std::size_t>(s_.linear_num_value_heads) * s_.linear_key_head_dim * s_.linear_value_head_dim, 0.0f);
  }
  return st;
}

void CpuBackend::embed(const int* ids, int T, float* x) {
  parallel_ranges(T, [&](int t0, int t1) {
    for (int t = t0; t < t1; ++t) m_.embed().row_f32(ids[t], x + static_cast<std::size_t>(t) * s_.hidden_size);
  });
}

void CpuBackend::trunk_step(int layer, BackendState& state, int pos0, int T, float* x) {
  const LayerWeights& lw = m_.layer(layer);
  LayerState& st = static_cast<CpuState&>(state).layers[layer];
  const int H = s_.hidden_size;
  Buffer<float> hn(static_cast<std::size_t>(T) * H), out(hn.size());
  parallel_ranges(T, [&](int t0, int t1) {
    for (int t = t0; t < t1; ++t) norm_row(x + t * H, lw.input_norm.data(), H, hn.data() + t * H);
  });
  if (lw.kind == LayerKind::kFullAttention) attention(lw, st, pos0, T, hn.data(), out.data());
  else deltanet(lw, st, T, hn.data(), out.data());
  parallel_ranges(T, [&](int t0, int t1) {
    for (std::size_t i = std::size_t(t0) * H; i < std::size_t(t1) * H; ++i) x[i] += out[i];
  });
}

void CpuBackend::trunk_rows(int layer, BackendState* const* states, const int* positions, int S, int hidden, float* x) {
  const LayerWeights& lw = m_.layer(layer);
  const int H = s_.hidden_size;
  if (hidden != H) throw Error("trunk_rows: rows of " + std::to_string(hidden) + " for a hidden size of " + std::to_string(H) + " (internal)");
  std::vector<LayerState*> rows(S);
  for (int i = 0; i < S; ++i) rows[i] = &static_cast<CpuState&>(*states[i]).layers[layer];
  Buffer<float> hn(static_cast<std::size_t>(S) * H), out(hn.size());
  parallel_ranges(S, [&](int t0, int t1) {
    for (int t = t0; t < t1; ++t) norm_row(x + t * H, lw.input_norm.data(), H, hn.data() + t * H);
  });
  if (lw.kind == LayerKind::kFullAttention) attention(lw, *rows[0], 0, S, hn.data(), out.data(), rows.data(), positions);
  else deltanet(lw, *rows[0], S, hn.data(), out.data(), rows.data());
  parallel_ranges(S, [&](int t0, int t1) {
    for (std::size_t i = std::size_t(t0) * H; i < std::size_t(t1) * H; ++i) x[i] += out[i];
  });
}

void CpuBackend::ffn_norm(int layer, int T, const float* x, float* hn) {
  const int H = s_.hidden_size;
  parallel_ranges(T, [&](int t0, int t1) {
    for (int t = t0; t < t1; ++t) norm_row(x + t * H, m_.layer(layer).post_norm.data(), H, hn + t * H);
  });
}

void CpuBackend::route(int layer, int T, const float* hn, int* idx, float* w) {
  const int E = s_.num_experts, K = s_.num_experts_per_tok;
  Buffer<float> p(static_cast<std::size_t>(T) * E);
  mm(m_.layer(layer).moe.router, hn, T, p.data());
  parallel_ranges(T, [&](int t0, int t1) {
    std::vector<int> order(E);
    for (int t = t0; t < t1; ++t) {
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
  });
}

void CpuBackend::shared_expert(int layer, int T, const float* hn, float* out) {
  const MoeWeights& moe = m_.layer(layer).moe;
  const int H = s_.hidden_size;
  if (!s_.is_sparse(layer)) {  // a dense layer's MLP: no gate
    swiglu_mm(moe.shared, hn, T, out);
    return;
  }
  if (!s_.has_shared_expert()) {
    std::fill(out, out + static_cast<std::size_t>(T) * H, 0.0f);
    return;
  }
  std::vector<float> gate(T);
  swiglu_mm(moe.shared, hn, T, out);
  mm(moe.shared_gate, hn, T, gate.data());
  parallel_ranges(T, [&](int t0, int t1) {
    for (int t = t0; t < t1; ++t) {
      const float s = sigmoid(gate[t]);
      for (int i = 0; i < H; ++i) out[t * H + i] *= s;
    }
  });
}

void CpuBackend::routed_experts(int layer, const ExpertPair* pairs, int n, const float* hn, float* out) {
  const MoeWeights& moe = m_.layer(layer).moe;
  const int H = s_.hidden_size;
  if (fast_ && one_token_run_ && one_token_applies(moe, pairs, n)) {
    routed_experts_one_token(moe, pairs, n, hn, out);
    return;
  }
  if (fast_) {
    routed_experts_fast(moe, pairs, n, hn, out);
    return;
  }
  for (int i = 0; i < n; ++i)
    if (pairs[i].first_row != 0) throw Error("CPU backend: a split expert (first_row " + std::to_string(pairs[i].first_row) + ") needs the fast kernels (internal)");
  // Group by expert so each expert's weights are read once for all its tokens.
  std::fill(out, out + static_cast<std::size_t>(num_tokens(pairs, n)) * H, 0.0f);
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

// Two parallel jobs for all experts of the layer: (1) gate, up and SiLU*up
// for every (expert, row block); (2) down for every output row block,
// summing the experts' weighted outputs into the rows it owns. Each
// expert's inputs are gathered and quantized in parallel before each job.
void CpuBackend::routed_experts_fast(const MoeWeights& moe, const ExpertPair* pairs, int n, const float* hn, float* out) {
  const int H = s_.hidden_size, I = s_.moe_intermediate_size;
  const int T = num_tokens(pairs, n);
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return pairs[a].expert < pairs[b].expert; });
  struct Group {
    int expert, begin, count;  // into order
    int first_row;             // a split expert's first intermediate row (its one pair's ExpertPair::first_row)
    bool amx;                  // tile kernel (kAmxMinTokens or more), else VNNI or float
    std::vector<float> x, xsum, act, actsum;
    QuantizedActs qx, qact;
    AmxActs ax, aact;
  };
  std::vector<Group> groups;
  for (int i = 0; i < n;) {
    int j = i;
    while (j < n && pairs[order[j]].expert == pairs[order[i]].expert) ++j;
    Group g;
    g.expert = pairs[order[i]].expert;
    g.begin = i;
    g.count = j - i;
    g.first_row = pairs[order[i]].first_row;
    for (int c = i; c < j; ++c)
      if (pairs[order[c]].first_row != 0 && (g.count > 1 || pairs[order[c]].first_row % 32 != 0 || pairs[order[c]].first_row > I))
        throw Error("CPU backend: a split expert's pair must be its expert's only one, its first row a multiple of 32 within the expert (internal)");
    g.amx = amx_applies(moe.experts[g.expert].gate, g.count);
    groups.push_back(std::move(g));
    i = j;
  }
  const int ng = static_cast<int>(groups.size());
  // Inputs of each expert: gathered rows, then int8 codes (VNNI / AMX) or
  // group sums (float kernels); on the pool when there are many (prefill),
  // inline for a decode step's few.
  auto per_group = [&](const std::function<void(int)>& fn) {
    if (n >= kParallelPrepPairs) parallel(ng, fn);
    else
      for (int gi = 0; gi < ng; ++gi) fn(gi);
  };
  // One token (a decode step, a hybrid run's misses): every expert takes
  // the same row, so its int8 codes are made once and copied (the same
  // codes as quantizing it per expert; the serial part of a step shrinks).
  QuantizedActs one_row;
  const bool share_row = T == 1 && ng > 1 && std::all_of(groups.begin(), groups.end(), [](const Group& g) { return g.count == 1 && !g.amx; }) &&
                         vnni_applies(moe.experts[groups[0].expert].gate, 1);
  if (share_row) quantize_acts(hn, 1, H, &one_row);
  per_group([&](int gi) {
    Group& g = groups[gi];
    g.act.resize(static_cast<std::size_t>(g.count) * I);
    if (share_row) {
      g.qx = one_row;
      return;
    }
    const Matrix& gate = moe.experts[g.expert].gate;
    g.x.resize(static_cast<std::size_t>(g.count) * H);
    for (int c = 0; c < g.count; ++c) std::copy_n(hn + static_cast<std::size_t>(pairs[order[g.begin + c]].token) * H, H, g.x.data() + c * H);
    if (vnni_applies(gate, g.count)) {
      quantize_acts(g.x.data(), g.count, H, &g.qx);
      if (g.amx) prepare_amx_acts(g.qx, &g.ax);
    } else {
      g.xsum.resize(static_cast<std::size_t>(g.count) * ((H + 31) / 32));
      group_sums(g.x.data(), g.count, H, g.xsum.data());
    }
  });
  constexpr int kRowBlock = 64;
  const int iblocks = (I + kRowBlock - 1) / kRowBlock;
  parallel(ng * iblocks, [&](int job) {
    Group& g = groups[job / iblocks];
    const int64_t rb = int64_t(job % iblocks) * kRowBlock, r1 = std::min<int64_t>(I, rb + kRowBlock);
    // A split expert's rows below its first row are the device's: activations 0.
    const int64_t r0 = std::clamp<int64_t>(g.first_row, rb, r1);
    for (int t = 0; t < g.count; ++t) std::fill(g.act.begin() + t * I + rb, g.act.begin() + t * I + r0, 0.0f);
    if (r0 == r1) return;
    const ExpertWeights& e = moe.experts[g.expert];
    thread_local std::vector<float> gate, up;
    gate.resize(static_cast<std::size_t>(g.count) * I);
    up.resize(gate.size());
    if (g.amx) {
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
  per_group([&](int gi) {
    Group& g = groups[gi];
    const Matrix& down = moe.experts[g.expert].down;
    if (vnni_applies(down, g.count)) {
      quantize_acts(g.act.data(), g.count, I, &g.qact);
      if (g.amx && amx_applies(down, g.count)) prepare_amx_acts(g.qact, &g.aact);
    } else {
      g.actsum.resize(static_cast<std::size_t>(g.count) * ((I + 31) / 32));
      group_sums(g.act.data(), g.count, I, g.actsum.data());
    }
  });
  // Output rows in blocks of 32 (two AMX row tiles): 64 jobs for H = 2048.
  constexpr int kOutBlock = 32;
  const int hblocks = (H + kOutBlock - 1) / kOutBlock;
  parallel(hblocks, [&](int job) {
    const int64_t r0 = int64_t(job) * kOutBlock, r1 = std::min<int64_t>(H, r0 + kOutBlock);
    for (int t = 0; t < T; ++t) std::fill(out + static_cast<std::size_t>(t) * H + r0, out + static_cast<std::size_t>(t) * H + r1, 0.0f);
    thread_local std::vector<float> y;
    for (const Group& g : groups) {
      const Matrix& down = moe.experts[g.expert].down;
      y.resize(static_cast<std::size_t>(g.count) * H);
      if (g.aact.T) matmul_rows_amx(down, g.aact, r0, r1, y.data(), H);
      else if (g.qact.T) matmul_rows_vnni(down, g.qact, r0, r1, y.data(), H, g.first_row);  // its columns below the first row: zero
      else matmul_rows(down, g.act.data(), g.actsum.data(), g.count, r0, r1, y.data(), H);
      for (int c = 0; c < g.count; ++c) {
        const ExpertPair& p = pairs[order[g.begin + c]];
        float* o = out + static_cast<std::size_t>(p.token) * H;
        for (int64_t r = r0; r < r1; ++r) o[r] += p.weight * y[c * H + r];
      }
    }
  });
}

void CpuBackend::add_moe_output(std::size_t n, const float* routed, const float* shared, float* x) {
  constexpr int kBlock = 16384;
  parallel_ranges(static_cast<int>((n + kBlock - 1) / kBlock), [&](int b0, int b1) {
    for (std::size_t i = std::size_t(b0) * kBlock; i < std::min(n, std::size_t(b1) * kBlock); ++i) x[i] += routed[i] + shared[i];
  });
}

void CpuBackend::logits(int T, const float* x, float* out) {
  Buffer<float> hn(static_cast<std::size_t>(T) * s_.hidden_size);
  output_norm(T, x, hn.data(), false);
  lm_head(T, hn.data(), out);
}

void CpuBackend::output_norm(int T, const float* x, float* h, bool mtp) {
  if (mtp && !m_.has_mtp()) throw Error("output_norm: the model has no MTP module (internal)");
  const int H = s_.hidden_size;
  const float* w = mtp ? m_.mtp().norm.data() : m_.final_norm().data();
  for (int t = 0; t < T; ++t) norm_row(x + t * H, w, H, h + t * H);
}

void CpuBackend::lm_head(int T, const float* h, float* out) { mm(m_.lm_head(), h, T, out); }

void CpuBackend::mtp_input(int T, const float* e, const float* h, float* x) {
  if (!m_.has_mtp()) throw Error("mtp_input: the model has no MTP module (internal)");
  const int H = s_.hidden_size;
  const MtpWeights& w = m_.mtp();
  Buffer<float> cat(static_cast<std::size_t>(T) * 2 * H);
  for (int t = 0; t < T; ++t) {
    norm_row(e + std::size_t(t) * H, w.norm_embedding.data(), H, cat.data() + std::size_t(t) * 2 * H);
    norm_row(h + std::size_t(t) * H, w.norm_hidden.data(), H, cat.data() + std::size_t(t) * 2 * H + H);
  }
  mm(w.fc, cat.data(), T, x);
}

void CpuBackend::mark_state(BackendState& state) {
  for (LayerState& st : static_cast<CpuState&>(state).layers) {
    if (st.S.empty()) continue;  // attention layers (the MTP layer among them)
    st.keep = true, st.kept = 0;
    st.conv0 = st.conv, st.S0 = st.S;
    st.in.clear(), st.qkv.clear(), st.beta.clear(), st.decay.clear();
  }
}

void CpuBackend::rewind_state(BackendState& state, int tokens) {
  const int nk = s_.linear_num_key_heads, nv = s_.linear_num_value_heads;
  const int dk = s_.linear_key_head_dim, dv = s_.linear_value_head_dim;
  const int kd = nk * dk, cd = s_.linear_conv_dim(), K = s_.linear_conv_kernel;
  for (LayerState& st : static_cast<CpuState&>(state).layers) {
    if (st.S.empty()) continue;
    if (!st.keep) throw Error("rewind_state without mark_state (internal)");
    if (tokens < 0 || tokens > st.kept) throw Error("rewind_state: " + std::to_string(tokens) + " tokens of " + std::to_string(st.kept) + " kept (internal)");
    st.keep = false;
    if (tokens == st.kept) continue;
    // The conv window: the last K-1 inputs of [window at the mark, in_0 .. in_{tokens-1}].
    st.conv = st.conv0;
    for (int j = 0; j < tokens; ++j) {
      const float* xin = st.in.data() + std::size_t(j) * cd;
      for (int r = 0; r + 1 < K - 1; ++r) std::copy_n(st.conv.data() + std::size_t(r + 1) * cd, cd, st.conv.data() + std::size_t(r) * cd);
      if (K > 1) std::copy_n(xin, cd, st.conv.data() + std::size_t(K - 2) * cd);
    }
    // The recurrence from S0 over the same inputs, with the same step the
    // chunk ran (deltanet(): the token form while keeping).
    st.S = st.S0;
    parallel(nv, [&](int h) {
      thread_local std::vector<float> oh;
      oh.resize(dv);
      const int kh = h / (nv / nk);
      float* S = st.S.data() + static_cast<std::size_t>(h) * dk * dv;
      for (int j = 0; j < tokens; ++j) {
        const float* row = st.qkv.data() + std::size_t(j) * cd;
        const float b = st.beta[std::size_t(j) * nv + h], d = st.decay[std::size_t(j) * nv + h];
        if (fast_) gdn_head_step(S, row + kh * dk, row + kd + kh * dk, row + 2 * kd + h * dv, b, d, dk, dv, oh.data());
        else gdn_head_step_ref(S, row + kh * dk, row + kd + kh * dk, row + 2 * kd + h * dv, b, d, dk, dv, oh.data());
      }
    }, /*fixed=*/true);
  }
}

}  // namespace coli::cpu
