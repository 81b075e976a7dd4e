// Model: the weights of a checkpoint, bound to ModelSpec by tensor name.
//
// Matrices stay in the memory-mapped checkpoint in their stored dtype
// (bf16/f16/f32); small vectors (norms, A_log, dt_bias, conv taps) are
// upcast to f32 at load. Binding checks every expected tensor's presence and
// shape and rejects any tensor it does not know (mtp.* and *visual.* are
// ignored on purpose): each problem is a coli::Error naming the tensor.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "formats/dtype.h"
#include "formats/safetensors.h"
#include "model/model_spec.h"

namespace coli {

// A row-major [rows, cols] matrix inside the mapped checkpoint.
struct Matrix {
  DType dtype = DType::F32;
  const uint8_t* data = nullptr;
  int64_t rows = 0, cols = 0;

  // Converts row r to f32 into dst[cols].
  void row_f32(int64_t r, float* dst) const;
  std::size_t row_bytes() const { return static_cast<std::size_t>(cols) * dtype_size(dtype); }
};

struct AttentionWeights {
  Matrix q_proj;  // [heads * head_dim * 2, hidden]: per head, query then gate
  Matrix k_proj, v_proj, o_proj;
  std::vector<float> q_norm, k_norm;  // [head_dim], applied as (1 + w)
};

struct DeltaNetWeights {
  Matrix in_proj_qkv;  // [2 * key_dim + value_dim, hidden]
  Matrix in_proj_z;    // [value_dim, hidden]
  Matrix in_proj_b, in_proj_a;  // [value_heads, hidden]
  Matrix out_proj;     // [hidden, value_dim]
  std::vector<float> conv1d;  // [conv_dim, kernel]
  std::vector<float> dt_bias, A_log;  // [value_heads]
  std::vector<float> norm;    // [value_head_dim], applied as w
};

struct ExpertWeights {
  Matrix gate, up;  // [intermediate, hidden]
  Matrix down;      // [hidden, intermediate]
};

struct MoeWeights {
  Matrix router;  // [experts, hidden]
  std::vector<ExpertWeights> experts;
  ExpertWeights shared;
  Matrix shared_gate;  // [1, hidden]
  bool fused_layout = false;  // the checkpoint stored gate_up_proj/down_proj 3-D tensors
};

struct LayerWeights {
  LayerKind kind = LayerKind::kLinearAttention;
  std::vector<float> input_norm, post_norm;  // (1 + w)
  AttentionWeights attn;                     // kFullAttention only
  DeltaNetWeights gdn;                       // kLinearAttention only
  MoeWeights moe;
};

class Model {
 public:
  // Loads DIR/config.json and the safetensors checkpoint in DIR.
  static std::unique_ptr<Model> load(const std::string& dir);

  const ModelSpec& spec() const { return spec_; }
  const std::string& dir() const { return dir_; }
  const Matrix& embed() const { return embed_; }
  const Matrix& lm_head() const { return lm_head_; }
  const std::vector<float>& final_norm() const { return final_norm_; }
  const LayerWeights& layer(int i) const { return layers_[i]; }

 private:
  Model() = default;
  std::string dir_;
  ModelSpec spec_;
  std::unique_ptr<SafetensorsArchive> archive_;
  Matrix embed_, lm_head_;
  std::vector<float> final_norm_;
  std::vector<LayerWeights> layers_;
};

// True for checkpoint tensors the text model deliberately ignores
// (vision tower, multi-token-prediction head).
bool is_ignored_tensor(const std::string& name);

}  // namespace coli
