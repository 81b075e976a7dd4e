// The CPU backend: every Backend operation in float32 over the mapped
// weights. Two modes of the same code:
//   reference (CpuBackend(model)): one thread, scalar matmuls; readable
//     loops that follow the transformers implementation step for step;
//   fast (CpuBackend(model, {threads, true})): the same steps with the
//     SIMD kernels of kernels.h, a persistent thread pool, heads of attention
//     and Gated DeltaNet in parallel, and the routed experts of a layer as two
//     parallel jobs (gate+up+SiLU for every expert, then down and combine).
#pragma once
#include <atomic>
#include <functional>
#include <memory>

#include "engine/backend.h"
#include "kernels_amx.h"
#include "kernels_amx_bf16.h"
#include "model/weights.h"
#include "ref_kernels.h"

namespace coli::cpu {

// Session state of one layer on the CPU.
struct LayerState {
  // Full attention: K and V of every past position, [n_pos, kv_heads * head_dim].
  std::vector<float> k, v;
  // Gated DeltaNet: the last (kernel - 1) conv inputs, oldest first,
  // [kernel - 1, conv_dim]; and the recurrent state [v_heads, k_dim, v_dim].
  std::vector<float> conv, S;
  // Speculative verification (mark_state .. rewind_state), Gated DeltaNet
  // layers: conv and S at the mark, and per token fed since: its conv
  // input row [conv_dim] (in), its q, k, v after conv, SiLU and the q/k
  // normalisation [conv_dim] (qkv), and beta and the decay per value head.
  // Rewinding replays the recurrence from S0 over the first tokens.
  bool keep = false;
  int kept = 0;  // tokens fed since the mark
  std::vector<float> conv0, S0, in, qkv, beta, decay;
};

struct CpuState : BackendState {
  std::vector<LayerState> layers;
};

struct CpuOptions {
  int threads = 1;     // <= 0: all cores
  bool fast = false;   // SIMD kernels and fused jobs
  // A decode step's routed experts as one parallel run without a barrier
  // between the gate/up and the down projections (expert_one_token.cpp);
  // off: two runs (the prefill path). The same results either way.
  bool one_token_run = true;
  // Gated DeltaNet prompts in the chunked (WY) form (fast mode, 16 tokens
  // or more). Off by default: on the CPU the vectorised token step is
  // faster (docs/perf/cpu.md); the chunked form is what the GPU runs.
  bool gdn_chunked = false;
};

class ThreadPool;

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(const Model& model, CpuOptions opt = {});
  ~CpuBackend() override;

  std::string name() const override { return fast_ ? "cpu" : "cpu-ref"; }
  int num_threads() const override;
  // The pool's workers spin between jobs while on (ThreadPool::set_hot).
  void hold_threads(bool on);
  std::unique_ptr<BackendState> new_state() const override;
  void embed(const int* ids, int T, float* x) override;
  void trunk_step(int layer, BackendState& state, int pos0, int T, float* x) override;
  // The rows' norms and projections as S-row matmuls; each row's conv,
  // recurrence or attention on its own state (the one-token arithmetic).
  void trunk_rows(int layer, BackendState* const* states, const int* positions, int S, int hidden, float* x) override;
  void ffn_norm(int layer, int T, const float* x, float* hn) override;
  void route(int layer, int T, const float* hn, int* idx, float* w) override;
  void shared_expert(int layer, int T, const float* hn, float* out) override;
  void routed_experts(int layer, const ExpertPair* pairs, int n, const float* hn, float* out) override;
  void logits(int T, const float* x, float* out) override;
  void output_norm(int T, const float* x, float* h, bool mtp) override;
  void lm_head(int T, const float* h, float* out) override;
  void mtp_input(int T, const float* e, const float* h, float* x) override;
  void mark_state(BackendState& state) override;
  void rewind_state(BackendState& state, int tokens) override;
  void add_moe_output(std::size_t n, const float* routed, const float* shared, float* x) override;

 private:
  // out[T, H] = mixer output for normed input hn (no residual): T tokens of
  // one sequence (st, from pos0), or with rows T single tokens of T
  // sequences (rows[t]: token t's state; pos[t]: its position).
  void attention(const LayerWeights& lw, LayerState& st, int pos0, int T, const float* hn, float* out, LayerState* const* rows = nullptr,
                 const int* pos = nullptr);
  // y[n] = RMSNorm(x) scaled by the family's norm weight: (1 + w), or w for
  // qwen3_moe (ModelSpec::norm_plus_one).
  void norm_row(const float* x, const float* w, int n, float* y) const {
    if (s_.norm_plus_one) rms_norm_1p(x, w, n, s_.rms_norm_eps, y);
    else rms_norm(x, w, n, s_.rms_norm_eps, y);
  }
  void deltanet(const LayerWeights& lw, LayerState& st, int T, const float* hn, float* out, LayerState* const* rows = nullptr);
  // y[T, W.rows] = x[T, W.cols] W^T, on the reference or the fast path.
  void mm(const Matrix& W, const float* x, int T, float* y);
  // Several matrices with the same input, as one parallel job on the fast path.
  void mm_many(std::initializer_list<std::pair<const Matrix*, float*>> outs, const float* x, int T);
  // fn(i) for i < n, on the pool in fast mode (fixed: same thread per i).
  void parallel(int n, const std::function<void(int)>& fn, bool fixed = false);
  // fn(begin, end) over [0, n) split into a few ranges per thread.
  void parallel_ranges(int n, const std::function<void(int, int)>& fn);
  // qa (and aa, if given) for x[T, cols], token ranges in parallel.
  void quantize_parallel(const float* x, int T, int64_t cols, QuantizedActs* qa, AmxActs* aa);
  void routed_experts_fast(const MoeWeights& moe, const ExpertPair* pairs, int n, const float* hn, float* out);
  // One token's experts as one parallel run (expert_one_token.cpp); applies
  // to distinct experts whose matrices take the VNNI kernel.
  bool one_token_applies(const MoeWeights& moe, const ExpertPair* pairs, int n) const;
  void routed_experts_one_token(const MoeWeights& moe, const ExpertPair* pairs, int n, const float* hn, float* out);
  // out[T, H] = down(silu(gate . x) * (up . x)) for T rows of x.
  void swiglu_mm(const ExpertWeights& e, const float* x, int T, float* out);

  const Model& m_;
  const ModelSpec& s_;
  bool fast_ = false;
  bool gdn_chunked_ = false;
  std::unique_ptr<ThreadPool> pool_;
  // mm_many's quantized input, kept so its arrays are allocated once.
  QuantizedActs mm_qa_;
  AmxActs mm_aa_;
  Bf16Acts mm_bf16_;
  // routed_experts_one_token's arrays, kept between calls.
  struct OneToken {
    QuantizedActs x;                                  // the token's row, int8 codes
    std::vector<float> gate, up;                      // [n][I]
    std::vector<QuantizedActs> act;                   // [n]: SiLU(gate) * up, int8 codes
    std::unique_ptr<std::atomic<int>[]> left, ready;  // [n]: gate/up units not done; activations made
    int capacity = 0;
    std::vector<int> order, down_start;
    std::atomic<int> next{0};
  };
  std::unique_ptr<OneToken> one_token_;
  bool one_token_run_ = true;
};


}  // namespace coli::cpu
