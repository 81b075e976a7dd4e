// The CPU backend: every Backend operation in float32 over the mapped
// checkpoint weights. This is the reference path: readable loops that follow
// the transformers implementation step for step.
#pragma once
#include "engine/backend.h"
#include "model/weights.h"

namespace coli::cpu {

// Session state of one layer on the CPU.
struct LayerState {
  // Full attention: K and V of every past position, [n_pos, kv_heads * head_dim].
  std::vector<float> k, v;
  // Gated DeltaNet: the last (kernel - 1) conv inputs, oldest first,
  // [kernel - 1, conv_dim]; and the recurrent state [v_heads, k_dim, v_dim].
  std::vector<float> conv, S;
};

struct CpuState : BackendState {
  std::vector<LayerState> layers;
};

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(const Model& model) : m_(model), s_(model.spec()) {}

  std::string name() const override { return "cpu"; }
  std::unique_ptr<BackendState> new_state() const override;
  void embed(const int* ids, int T, float* x) override;
  void trunk_step(int layer, BackendState& state, int pos0, int T, float* x) override;
  void ffn_norm(int layer, int T, const float* x, float* hn) override;
  void route(int layer, int T, const float* hn, int* idx, float* w) override;
  void shared_expert(int layer, int T, const float* hn, float* out) override;
  void routed_experts(int layer, const ExpertPair* pairs, int n, const float* hn, float* out) override;
  void logits(int T, const float* x, float* out) override;

 private:
  // out[T, H] = mixer output for normed input hn (no residual).
  void attention(const LayerWeights& lw, LayerState& st, int pos0, int T, const float* hn, float* out);
  void deltanet(const LayerWeights& lw, LayerState& st, int T, const float* hn, float* out);

  const Model& m_;
  const ModelSpec& s_;
};

// out[T, H] = down(silu(gate . x) * (up . x)) for T rows of x.
void swiglu(const ExpertWeights& e, const float* x, int T, float* out);

}  // namespace coli::cpu
