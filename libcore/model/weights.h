// Model: the weights of a checkpoint or coli container, bound to ModelSpec
// by tensor name, walking the tensor table (model/layer_tensors.h).
//
// Matrices stay in the memory-mapped file in their stored format (bf16,
// f16, f32, block-scaled fp8 from checkpoints; the quantized formats of
// quant/format.h from containers); small vectors (norms, A_log, dt_bias, conv
// taps) are upcast to f32 at load. Binding checks every expected tensor's
// presence and shape and rejects any tensor it does not know (*visual.*
// is ignored on purpose, and mtp.* unless the config declares an MTP layer
// and the checkpoint holds mtp.fc.weight: then every MTP tensor must be
// there): each problem is a coli::Error naming the tensor.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/model_spec.h"
#include "formats/tensor_source.h"
#include "quant/format.h"

namespace coli {

class Container;

// A [rows, cols] matrix inside the mapped file, in one of the weight formats.
struct Matrix {
  QuantFormat format = QuantFormat::F32;
  const uint8_t* data = nullptr;
  int64_t rows = 0, cols = 0;
  const float* aux = nullptr;  // fp8 block scales

  // Dequantizes row r to f32 into dst[cols].
  void row_f32(int64_t r, float* dst) const { dequantize_row(format, data, rows, cols, r, dst, aux); }
  std::size_t bytes() const { return layout_of(format, rows, cols).total; }
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

// The multi-token-prediction module outside its decoder layer (bound when
// ModelSpec::mtp_layers is 1; its layer is Model::layer(num_layers)).
struct MtpWeights {
  Matrix fc;                                      // [hidden, 2 * hidden]: [embedding | hidden] -> hidden
  std::vector<float> norm_embedding, norm_hidden;  // pre-fc norms, (1 + w)
  std::vector<float> norm;                        // after the layer, before the lm_head, (1 + w)
};

// The tensors outside the layers.
struct OuterWeights {
  Matrix embed;                   // [vocab, hidden]
  Matrix lm_head;                 // [vocab, hidden]; embed itself when tied
  std::vector<float> final_norm;  // (1 + w)
  MtpWeights mtp;                 // empty without an MTP module
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
  // PATH: a checkpoint directory (config.json + safetensors), a coli
  // container file, or a directory holding model.coli.
  static std::unique_ptr<Model> load(const std::string& path);
  // Binds spec's tensors from any source (the source must outlive the model).
  static std::unique_ptr<Model> bind(const ModelSpec& spec, std::shared_ptr<TensorSource> source, const std::string& where);
  // A container's model with its tensors from `source` (the container
  // itself, or a source serving the same names, e.g. a mirror); file names
  // the container in messages.
  static std::unique_ptr<Model> bind_container(const Container& c, std::shared_ptr<TensorSource> source, const std::string& file);

  const ModelSpec& spec() const { return spec_; }
  const std::string& dir() const { return dir_; }
  const Matrix& embed() const { return outer_.embed; }
  const Matrix& lm_head() const { return outer_.lm_head; }
  const std::vector<float>& final_norm() const { return outer_.final_norm; }
  const OuterWeights& outer() const { return outer_; }
  // Layers 0 .. num_layers - 1, and num_layers: the MTP layer when bound.
  const LayerWeights& layer(int i) const { return layers_[i]; }
  // The MTP module is bound (spec().mtp_layers == 1).
  bool has_mtp() const { return spec_.mtp_layers > 0; }
  const MtpWeights& mtp() const { return outer_.mtp; }

 private:
  Model() = default;
  std::string dir_;
  ModelSpec spec_;
  std::shared_ptr<TensorSource> source_;
  // Matrices the binder made rather than found (qwen3_next's fused DeltaNet
  // projections split into qwen3_5_moe's layout); the matrices point in here.
  std::vector<std::vector<uint8_t>> owned_;
  OuterWeights outer_;
  std::vector<LayerWeights> layers_;
};

// The container file PATH names: PATH itself when it is a file, DIR/model.coli
// for a directory holding one, else "" (a checkpoint directory, or nothing).
std::string container_file_of(const std::string& path);

// True for checkpoint tensors the text model deliberately ignores
// (vision tower; the multi-token-prediction module where it is not bound).
bool is_ignored_tensor(const std::string& name);

}  // namespace coli
