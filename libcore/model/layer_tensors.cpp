#include "model/layer_tensors.h"

#include "model/weights.h"
#include "util/error.h"

namespace coli {

namespace {

using Shape = std::vector<int64_t>;
using R = TensorRole;
using C = TensorClass;
using F = TensorForm;

// Which entries a row yields.
enum class Scope {
  kModel,      // one, outside the layers
  kMtp,        // one, outside the layers, in a model with an MTP module (ModelSpec::mtp_layers)
  kLayer,      // one in every layer
  kAttention,  // one in every full-attention layer
  kDeltaNet,   // one in every Gated DeltaNet layer
  kSparse,     // one in every layer with routed experts (ModelSpec::sparse_layers)
  kShared,     // one in every sparse layer of a model with a shared expert
  kDense,      // one in every dense MLP layer (qwen3_moe / qwen3_next where the config says)
  kExpert,     // one per routed expert of every sparse layer (ExpertLayout::kPerExpert)
  kStacked,    // one in every sparse layer (ExpertLayout::kStacked)
};

// Slots: the member path of a tensor in OuterWeights or LayerWeights.
template <auto... Path>
TensorSlot outer_matrix(OuterWeights& w) { return {&(w .* ... .* Path), nullptr}; }
template <auto... Path>
TensorSlot outer_vector(OuterWeights& w) { return {nullptr, &(w .* ... .* Path)}; }
template <auto... Path>
TensorSlot mtp_matrix(OuterWeights& w) { return {&(w.mtp .* ... .* Path), nullptr}; }
template <auto... Path>
TensorSlot mtp_vector(OuterWeights& w) { return {nullptr, &(w.mtp .* ... .* Path)}; }
template <auto... Path>
TensorSlot matrix_at(LayerWeights& w, int) { return {&(w .* ... .* Path), nullptr}; }
template <auto... Path>
TensorSlot vector_at(LayerWeights& w, int) { return {nullptr, &(w .* ... .* Path)}; }
template <auto Part>
TensorSlot expert_part(LayerWeights& w, int e) { return {&(w.moe.experts[e].*Part), nullptr}; }
TensorSlot no_slot(LayerWeights&, int) { return {}; }

struct Row {
  TensorRole role;
  Scope scope;
  const char* name;  // kModel, kMtp: the whole name; kExpert: after "model.layers.N.mlp.experts.E."; else after "model.layers.N." (or "mtp.layers.0.")
  TensorClass cls;
  TensorForm form;
  Shape (*shape)(const ModelSpec&);
  TensorSlot (*outer)(OuterWeights&) = nullptr;     // kModel rows
  TensorSlot (*inner)(LayerWeights&, int) = nullptr;  // the other rows
};

int64_t hidden(const ModelSpec& s) { return s.hidden_size; }
int64_t q_dim(const ModelSpec& s) { return int64_t(s.num_heads) * s.head_dim; }
int64_t kv_dim(const ModelSpec& s) { return int64_t(s.num_kv_heads) * s.head_dim; }

// The table. Rows of one scope keep the order of their entries.
const Row kRows[] = {
    {R::kEmbed, Scope::kModel, "model.embed_tokens.weight", C::kEmbed, F::kMatrix,
     [](const ModelSpec& s) -> Shape { return {s.vocab_size, hidden(s)}; }, outer_matrix<&OuterWeights::embed>},
    {R::kFinalNorm, Scope::kModel, "model.norm.weight", C::kF32, F::kVector, [](const ModelSpec& s) -> Shape { return {hidden(s)}; },
     outer_vector<&OuterWeights::final_norm>},
    {R::kLmHead, Scope::kModel, "lm_head.weight", C::kLmHead, F::kMatrix, [](const ModelSpec& s) -> Shape { return {s.vocab_size, hidden(s)}; },
     outer_matrix<&OuterWeights::lm_head>},

    // The MTP module (its decoder layer is layer num_layers, named
    // "mtp.layers.0."): x = fc([pre_fc_norm_embedding(embed(t)) |
    // pre_fc_norm_hidden(h)]), the layer, then norm before the lm_head.
    {R::kMtpFc, Scope::kMtp, "mtp.fc.weight", C::kTrunk, F::kMatrix, [](const ModelSpec& s) -> Shape { return {hidden(s), 2 * hidden(s)}; },
     mtp_matrix<&MtpWeights::fc>},
    {R::kMtpNormEmbed, Scope::kMtp, "mtp.pre_fc_norm_embedding.weight", C::kF32, F::kVector, [](const ModelSpec& s) -> Shape { return {hidden(s)}; },
     mtp_vector<&MtpWeights::norm_embedding>},
    {R::kMtpNormHidden, Scope::kMtp, "mtp.pre_fc_norm_hidden.weight", C::kF32, F::kVector, [](const ModelSpec& s) -> Shape { return {hidden(s)}; },
     mtp_vector<&MtpWeights::norm_hidden>},
    {R::kMtpNorm, Scope::kMtp, "mtp.norm.weight", C::kF32, F::kVector, [](const ModelSpec& s) -> Shape { return {hidden(s)}; },
     mtp_vector<&MtpWeights::norm>},

    {R::kInputNorm, Scope::kLayer, "input_layernorm.weight", C::kF32, F::kVector, [](const ModelSpec& s) -> Shape { return {hidden(s)}; },
     nullptr, vector_at<&LayerWeights::input_norm>},
    {R::kPostNorm, Scope::kLayer, "post_attention_layernorm.weight", C::kF32, F::kVector, [](const ModelSpec& s) -> Shape { return {hidden(s)}; },
     nullptr, vector_at<&LayerWeights::post_norm>},

    // per head, query then gate (ModelSpec::attention_output_gate; else query only)
    {R::kQProj, Scope::kAttention, "self_attn.q_proj.weight", C::kTrunk, F::kMatrix,
     [](const ModelSpec& s) -> Shape { return {(s.attention_output_gate ? 2 : 1) * q_dim(s), hidden(s)}; },
     nullptr, matrix_at<&LayerWeights::attn, &AttentionWeights::q_proj>},
    {R::kKProj, Scope::kAttention, "self_attn.k_proj.weight", C::kTrunk, F::kMatrix, [](const ModelSpec& s) -> Shape { return {kv_dim(s), hidden(s)}; },
     nullptr, matrix_at<&LayerWeights::attn, &AttentionWeights::k_proj>},
    {R::kVProj, Scope::kAttention, "self_attn.v_proj.weight", C::kTrunk, F::kMatrix, [](const ModelSpec& s) -> Shape { return {kv_dim(s), hidden(s)}; },
     nullptr, matrix_at<&LayerWeights::attn, &AttentionWeights::v_proj>},
    {R::kOProj, Scope::kAttention, "self_attn.o_proj.weight", C::kTrunk, F::kMatrix, [](const ModelSpec& s) -> Shape { return {hidden(s), q_dim(s)}; },
     nullptr, matrix_at<&LayerWeights::attn, &AttentionWeights::o_proj>},
    {R::kQNorm, Scope::kAttention, "self_attn.q_norm.weight", C::kF32, F::kVector, [](const ModelSpec& s) -> Shape { return {s.head_dim}; },
     nullptr, vector_at<&LayerWeights::attn, &AttentionWeights::q_norm>},
    {R::kKNorm, Scope::kAttention, "self_attn.k_norm.weight", C::kF32, F::kVector, [](const ModelSpec& s) -> Shape { return {s.head_dim}; },
     nullptr, vector_at<&LayerWeights::attn, &AttentionWeights::k_norm>},

    {R::kInProjQkv, Scope::kDeltaNet, "linear_attn.in_proj_qkv.weight", C::kTrunk, F::kMatrix,
     [](const ModelSpec& s) -> Shape { return {s.linear_conv_dim(), hidden(s)}; }, nullptr,
     matrix_at<&LayerWeights::gdn, &DeltaNetWeights::in_proj_qkv>},
    {R::kInProjZ, Scope::kDeltaNet, "linear_attn.in_proj_z.weight", C::kTrunk, F::kMatrix,
     [](const ModelSpec& s) -> Shape { return {s.linear_value_dim(), hidden(s)}; }, nullptr,
     matrix_at<&LayerWeights::gdn, &DeltaNetWeights::in_proj_z>},
    {R::kInProjB, Scope::kDeltaNet, "linear_attn.in_proj_b.weight", C::kTrunk, F::kMatrix,
     [](const ModelSpec& s) -> Shape { return {s.linear_num_value_heads, hidden(s)}; }, nullptr,
     matrix_at<&LayerWeights::gdn, &DeltaNetWeights::in_proj_b>},
    {R::kInProjA, Scope::kDeltaNet, "linear_attn.in_proj_a.weight", C::kTrunk, F::kMatrix,
     [](const ModelSpec& s) -> Shape { return {s.linear_num_value_heads, hidden(s)}; }, nullptr,
     matrix_at<&LayerWeights::gdn, &DeltaNetWeights::in_proj_a>},
    {R::kOutProj, Scope::kDeltaNet, "linear_attn.out_proj.weight", C::kTrunk, F::kMatrix,
     [](const ModelSpec& s) -> Shape { return {hidden(s), s.linear_value_dim()}; }, nullptr,
     matrix_at<&LayerWeights::gdn, &DeltaNetWeights::out_proj>},
    {R::kConv1d, Scope::kDeltaNet, "linear_attn.conv1d.weight", C::kF32, F::kVector,
     [](const ModelSpec& s) -> Shape { return {s.linear_conv_dim(), 1, s.linear_conv_kernel}; }, nullptr,
     vector_at<&LayerWeights::gdn, &DeltaNetWeights::conv1d>},
    {R::kDtBias, Scope::kDeltaNet, "linear_attn.dt_bias", C::kF32, F::kVector, [](const ModelSpec& s) -> Shape { return {s.linear_num_value_heads}; },
     nullptr, vector_at<&LayerWeights::gdn, &DeltaNetWeights::dt_bias>},
    {R::kALog, Scope::kDeltaNet, "linear_attn.A_log", C::kF32, F::kVector, [](const ModelSpec& s) -> Shape { return {s.linear_num_value_heads}; },
     nullptr, vector_at<&LayerWeights::gdn, &DeltaNetWeights::A_log>},
    {R::kLinearNorm, Scope::kDeltaNet, "linear_attn.norm.weight", C::kF32, F::kVector,
     [](const ModelSpec& s) -> Shape { return {s.linear_value_head_dim}; }, nullptr, vector_at<&LayerWeights::gdn, &DeltaNetWeights::norm>},

    {R::kRouter, Scope::kSparse, "mlp.gate.weight", C::kRouter, F::kMatrix, [](const ModelSpec& s) -> Shape { return {s.num_experts, hidden(s)}; },
     nullptr, matrix_at<&LayerWeights::moe, &MoeWeights::router>},
    {R::kSharedGate, Scope::kShared, "mlp.shared_expert.gate_proj.weight", C::kShared, F::kMatrix,
     [](const ModelSpec& s) -> Shape { return {s.shared_expert_intermediate_size, hidden(s)}; }, nullptr,
     matrix_at<&LayerWeights::moe, &MoeWeights::shared, &ExpertWeights::gate>},
    {R::kSharedUp, Scope::kShared, "mlp.shared_expert.up_proj.weight", C::kShared, F::kMatrix,
     [](const ModelSpec& s) -> Shape { return {s.shared_expert_intermediate_size, hidden(s)}; }, nullptr,
     matrix_at<&LayerWeights::moe, &MoeWeights::shared, &ExpertWeights::up>},
    {R::kSharedDown, Scope::kShared, "mlp.shared_expert.down_proj.weight", C::kShared, F::kMatrix,
     [](const ModelSpec& s) -> Shape { return {hidden(s), s.shared_expert_intermediate_size}; }, nullptr,
     matrix_at<&LayerWeights::moe, &MoeWeights::shared, &ExpertWeights::down>},
    {R::kSharedExpertGate, Scope::kShared, "mlp.shared_expert_gate.weight", C::kF32, F::kMatrix,
     [](const ModelSpec& s) -> Shape { return {1, hidden(s)}; }, nullptr, matrix_at<&LayerWeights::moe, &MoeWeights::shared_gate>},

    // a dense layer's MLP, bound where a sparse layer keeps its shared expert (no sigmoid gate)
    {R::kDenseGate, Scope::kDense, "mlp.gate_proj.weight", C::kShared, F::kMatrix,
     [](const ModelSpec& s) -> Shape { return {s.intermediate_size, hidden(s)}; }, nullptr, matrix_at<&LayerWeights::moe, &MoeWeights::shared, &ExpertWeights::gate>},
    {R::kDenseUp, Scope::kDense, "mlp.up_proj.weight", C::kShared, F::kMatrix,
     [](const ModelSpec& s) -> Shape { return {s.intermediate_size, hidden(s)}; }, nullptr, matrix_at<&LayerWeights::moe, &MoeWeights::shared, &ExpertWeights::up>},
    {R::kDenseDown, Scope::kDense, "mlp.down_proj.weight", C::kShared, F::kMatrix,
     [](const ModelSpec& s) -> Shape { return {hidden(s), s.intermediate_size}; }, nullptr, matrix_at<&LayerWeights::moe, &MoeWeights::shared, &ExpertWeights::down>},

    {R::kExpertGate, Scope::kExpert, "gate_proj.weight", C::kExperts, F::kMatrix,
     [](const ModelSpec& s) -> Shape { return {s.moe_intermediate_size, hidden(s)}; }, nullptr, expert_part<&ExpertWeights::gate>},
    {R::kExpertUp, Scope::kExpert, "up_proj.weight", C::kExperts, F::kMatrix,
     [](const ModelSpec& s) -> Shape { return {s.moe_intermediate_size, hidden(s)}; }, nullptr, expert_part<&ExpertWeights::up>},
    {R::kExpertDown, Scope::kExpert, "down_proj.weight", C::kDown, F::kMatrix,
     [](const ModelSpec& s) -> Shape { return {hidden(s), s.moe_intermediate_size}; }, nullptr, expert_part<&ExpertWeights::down>},

    // every expert's gate rows, then its up rows
    {R::kExpertsGateUp, Scope::kStacked, "mlp.experts.gate_up_proj", C::kExperts, F::kStack,
     [](const ModelSpec& s) -> Shape { return {s.num_experts, 2 * int64_t(s.moe_intermediate_size), hidden(s)}; }, nullptr, no_slot},
    {R::kExpertsDown, Scope::kStacked, "mlp.experts.down_proj", C::kDown, F::kStack,
     [](const ModelSpec& s) -> Shape { return {s.num_experts, hidden(s), s.moe_intermediate_size}; }, nullptr, no_slot},
};

const Row& row_of(TensorRole role) {
  for (const Row& r : kRows)
    if (r.role == role) return r;
  throw Error("tensor table: no row for role " + std::to_string(static_cast<int>(role)) + " (internal)");
}

TensorDesc entry(const Row& r, const ModelSpec& spec, std::string name, int layer, int expert) {
  return TensorDesc{r.role, std::move(name), r.cls, r.form, r.shape(spec), layer, expert};
}

}  // namespace

const char* tensor_class_name(TensorClass c) {
  switch (c) {
    case C::kEmbed: return "embed";
    case C::kLmHead: return "lm_head";
    case C::kTrunk: return "trunk";
    case C::kRouter: return "router";
    case C::kShared: return "shared";
    case C::kExperts: return "experts";
    case C::kDown: return "down";
    case C::kF32: return "f32";
  }
  return "?";
}

bool is_mtp_tensor(const ModelSpec& spec, const TensorDesc& t) {
  return t.layer >= spec.num_layers || row_of(t.role).scope == Scope::kMtp;
}

std::string layer_prefix(const ModelSpec& spec, int layer) {
  return layer < spec.num_layers ? "model.layers." + std::to_string(layer) + "." : "mtp.layers." + std::to_string(layer - spec.num_layers) + ".";
}

std::vector<TensorDesc> model_tensors(const ModelSpec& spec, bool own_lm_head) {
  std::vector<TensorDesc> out;
  for (const Row& r : kRows)
    if ((r.scope == Scope::kModel && (own_lm_head || r.role != R::kLmHead)) || (r.scope == Scope::kMtp && spec.mtp_layers > 0))
      out.push_back(entry(r, spec, r.name, -1, -1));
  return out;
}

std::vector<TensorDesc> layer_tensors(const ModelSpec& spec, int layer, ExpertLayout experts) {
  if (layer < 0 || layer >= spec.num_layers_with_mtp()) throw Error("tensor table: no layer " + std::to_string(layer) + " (internal)");
  const std::string L = layer_prefix(spec, layer);
  const bool attention = spec.kind_of(layer) == LayerKind::kFullAttention, sparse = spec.is_sparse(layer);
  std::vector<TensorDesc> out;
  for (const Row& r : kRows) {
    const bool here = r.scope == Scope::kLayer || (r.scope == Scope::kAttention && attention) || (r.scope == Scope::kDeltaNet && !attention) ||
                      (r.scope == Scope::kSparse && sparse) || (r.scope == Scope::kShared && sparse && spec.has_shared_expert()) ||
                      (r.scope == Scope::kDense && !sparse) || (r.scope == Scope::kStacked && sparse && experts == ExpertLayout::kStacked);
    if (here) out.push_back(entry(r, spec, L + r.name, layer, -1));
  }
  if (sparse && experts == ExpertLayout::kPerExpert)
    for (int e = 0; e < spec.num_experts; ++e) {
      const std::string X = L + "mlp.experts." + std::to_string(e) + ".";
      for (const Row& r : kRows)
        if (r.scope == Scope::kExpert) out.push_back(entry(r, spec, X + r.name, layer, e));
    }
  return out;
}

TensorSlot slot_of(OuterWeights& w, const TensorDesc& t) {
  const Row& r = row_of(t.role);
  if (!r.outer) throw Error("tensor table: '" + t.name + "' is not a model-level tensor (internal)");
  return r.outer(w);
}

TensorSlot slot_of(LayerWeights& w, const TensorDesc& t) {
  const Row& r = row_of(t.role);
  if (!r.inner) throw Error("tensor table: '" + t.name + "' is not a layer tensor (internal)");
  return r.inner(w, t.expert);
}

std::vector<TensorDesc> tensors_of(const ModelSpec& spec, bool own_lm_head) {
  std::vector<TensorDesc> out = model_tensors(spec, own_lm_head);
  for (int l = 0; l < spec.num_layers_with_mtp(); ++l) {
    std::vector<TensorDesc> layer = layer_tensors(spec, l);
    out.insert(out.end(), std::make_move_iterator(layer.begin()), std::make_move_iterator(layer.end()));
  }
  return out;
}

std::vector<TensorDesc> tensors_of(const Model& m) { return tensors_of(m.spec(), m.lm_head().data != m.embed().data); }

// The slots are written once, by the binder; reading through them leaves
// the model as it is, so the const_casts below only share slot_of's paths.
namespace {
TensorSlot bound_slot(const Model& m, const TensorDesc& t) {
  return t.layer < 0 ? slot_of(const_cast<OuterWeights&>(m.outer()), t) : slot_of(const_cast<LayerWeights&>(m.layer(t.layer)), t);
}
}  // namespace

const Matrix& matrix_of(const Model& m, const TensorDesc& t) {
  const TensorSlot s = bound_slot(m, t);
  if (!s.matrix) throw Error("tensor table: '" + t.name + "' is not a bound matrix (internal)");
  return *s.matrix;
}

const std::vector<float>& vector_of(const Model& m, const TensorDesc& t) {
  const TensorSlot s = bound_slot(m, t);
  if (!s.vector) throw Error("tensor table: '" + t.name + "' is not a bound vector (internal)");
  return *s.vector;
}

}  // namespace coli
