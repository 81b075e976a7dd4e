// The tensor table of a qwen3_5_moe, qwen3_next or qwen3_moe model: every
// tensor, in one list; the spec says which rows a layer has (its mixer,
// sparse or dense MLP, a shared expert or none, the q_proj's gate rows).
//
// Binding (weights.cpp), conversion, the synthetic checkpoint writer, byte
// accounting (bench, CUDA upload) and comparison walk this table instead of
// keeping lists of their own, so a tensor added here reaches all of them (as
// llama.cpp keeps one tensor list per architecture). An entry gives a
// tensor's canonical name (a text-only checkpoint's: "model.layers.3.
// mlp.gate.weight"), its role (what it is, which fixes where Model keeps
// it), its conversion class and its shape from the ModelSpec.
//
// Order, which is also a container's blob order: embed, final norm,
// lm_head, the MTP module's fc and norms; then per layer (the MTP layer
// after the others) its two norms, the mixer's matrices, the mixer's
// vectors, router, shared expert (gate, up, down, then its 1-row gate) and
// the routed experts one by one (gate, up, down), or for a dense layer its
// MLP (gate, up, down); qwen3_next's DeltaNet projections in the split
// layout of qwen3_5_moe (weights.cpp permutes a checkpoint's fused ones), or with
// ExpertLayout::kStacked the two 3-D tensors of transformers' fused layout.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/model_spec.h"

namespace coli {

struct Matrix;
struct LayerWeights;
struct OuterWeights;
class Model;

enum class TensorRole {
  kEmbed, kFinalNorm, kLmHead,
  kMtpFc, kMtpNormEmbed, kMtpNormHidden, kMtpNorm,  // the MTP module outside its layer
  kInputNorm, kPostNorm,
  // gated full attention
  kQProj, kKProj, kVProj, kOProj, kQNorm, kKNorm,
  // Gated DeltaNet
  kInProjQkv, kInProjZ, kInProjB, kInProjA, kOutProj, kConv1d, kDtBias, kALog, kLinearNorm,
  // MoE
  kRouter, kSharedGate, kSharedUp, kSharedDown, kSharedExpertGate,
  kDenseGate, kDenseUp, kDenseDown,         // a dense MLP layer's (qwen3_moe, qwen3_next where configured)
  kExpertGate, kExpertUp, kExpertDown,      // one routed expert's parts
  kExpertsGateUp, kExpertsDown,             // all experts stacked (fused checkpoints)
};

// The conversion class: which ConvertOptions format a tensor is stored in.
enum class TensorClass {
  kEmbed, kLmHead,
  kTrunk,    // attention and Gated DeltaNet projections
  kRouter,
  kShared,   // the shared expert's gate, up and down; a dense layer's MLP
  kExperts,  // routed experts' gate and up
  kDown,     // routed experts' down
  kF32,      // norms, conv taps, A_log, dt_bias, the shared-expert gate: always f32
};
const char* tensor_class_name(TensorClass c);

enum class TensorForm {
  kMatrix,  // 2-D [rows, cols]; Model keeps it in its stored format
  kVector,  // norms, conv taps, A_log, dt_bias: upcast to f32 at load
  kStack,   // 3-D [experts, rows, cols] of a fused checkpoint; bound as per-expert slices
};

enum class ExpertLayout { kPerExpert, kStacked };

struct TensorDesc {
  TensorRole role;
  std::string name;  // canonical
  TensorClass cls;
  TensorForm form;
  std::vector<int64_t> shape;
  int layer = -1;   // -1: outside the layers
  int expert = -1;  // a routed expert's part: the expert
};

// embed, final norm and (when own_lm_head: not tied to embed) lm_head;
// in a model with an MTP module (ModelSpec::mtp_layers) also its fc and
// three norms.
std::vector<TensorDesc> model_tensors(const ModelSpec& spec, bool own_lm_head);
// The tensors of layer `layer` (its kind from spec.kind_of); layer
// num_layers is the MTP decoder layer, named "mtp.layers.0.".
std::vector<TensorDesc> layer_tensors(const ModelSpec& spec, int layer, ExpertLayout experts = ExpertLayout::kPerExpert);
// A tensor of the MTP module (its fc and norms, or its layer's).
bool is_mtp_tensor(const ModelSpec& spec, const TensorDesc& t);
// "model.layers.N." or, for the MTP layer, "mtp.layers.0.".
std::string layer_prefix(const ModelSpec& spec, int layer);

// Where a model-level or layer entry lives in weights being bound. Stacked
// entries have no slot of their own (the binder slices them).
struct TensorSlot {
  Matrix* matrix = nullptr;
  std::vector<float>* vector = nullptr;
};
TensorSlot slot_of(OuterWeights& w, const TensorDesc& t);
TensorSlot slot_of(LayerWeights& w, const TensorDesc& t);

// Every tensor a model of this spec holds (lm_head only when own_lm_head),
// model-level first, then the layers (the MTP layer last), experts per
// expert: a container's blob order.
std::vector<TensorDesc> tensors_of(const ModelSpec& spec, bool own_lm_head);
// The same for a bound model (lm_head unless tied to embed), and each one's
// storage in it.
std::vector<TensorDesc> tensors_of(const Model& m);
const Matrix& matrix_of(const Model& m, const TensorDesc& t);
const std::vector<float>& vector_of(const Model& m, const TensorDesc& t);

}  // namespace coli
