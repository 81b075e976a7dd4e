// ModelSpec: what a Hugging Face config.json says about the network.
//
// Run: qwen3_5_moe in both layouts real checkpoints use:
//   - text-only Qwen3_5MoeForCausalLM: flat config (model_type
//     "qwen3_5_moe_text" or "qwen3_5_moe"), tensors under "model.";
//   - multimodal Qwen3_5MoeForConditionalGeneration: model_type
//     "qwen3_5_moe" with a nested text_config, tensors under
//     "model.language_model." (model.visual.* and mtp.* are ignored).
// Also (issue 31; docs/design/qwen3-families.md): qwen3_moe (attention
// only, y w norms, no output gate, no shared expert) and qwen3_next
// (qwen3_5_moe's layers with fused DeltaNet projections), both with dense
// MLP layers where mlp_only_layers / decoder_sparse_step say. A backend
// that does not run a family yet says so when it is made.
// Anything else throws coli::Error naming config.json and the key.
#pragma once
#include <string>
#include <vector>

namespace coli {

enum class LayerKind { kLinearAttention, kFullAttention };
enum class ModelFamily { kQwen35Moe, kQwen3Moe, kQwen3Next };
const char* family_name(ModelFamily f);  // "qwen3_5_moe", "qwen3_moe", "qwen3_next"

struct ModelSpec {
  std::string model_type;     // as written in config.json (top level)
  ModelFamily family = ModelFamily::kQwen35Moe;
  std::string tensor_prefix;  // "model." or "model.language_model."
  bool multimodal = false;    // nested text_config layout

  int vocab_size = 0;
  int hidden_size = 0;
  int num_layers = 0;
  std::vector<LayerKind> layer_kinds;
  float rms_norm_eps = 1e-6f;
  int max_position_embeddings = 0;  // the trained context; 0: config.json does not say
  bool tie_word_embeddings = false;
  std::vector<int> eos_token_ids;

  // Gated full attention.
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int rotary_dim = 0;  // head_dim * partial_rotary_factor, even
  double rope_theta = 10000.0;

  // Gated DeltaNet.
  int linear_num_key_heads = 0;
  int linear_num_value_heads = 0;
  int linear_key_head_dim = 0;
  int linear_value_head_dim = 0;
  int linear_conv_kernel = 0;

  // MoE.
  int num_experts = 0;
  int num_experts_per_tok = 0;
  int moe_intermediate_size = 0;
  int shared_expert_intermediate_size = 0;  // 0: no shared expert (qwen3_moe)

  // What differs between the families (the qwen3_5_moe values by default).
  bool norm_plus_one = true;          // RMSNorms scale by (1 + w); qwen3_moe's by w
  bool attention_output_gate = true;  // q_proj rows per head [q; gate], sigmoid(gate) on the output; qwen3_moe: q only
  bool fused_linear_projections = false;  // qwen3_next: in_proj_qkvz / in_proj_ba, grouped per key head
  std::vector<uint8_t> sparse_layers;     // [num_layers] 1: routed experts; 0: a dense MLP of intermediate_size
  int intermediate_size = 0;              // the dense MLP layers' width (0: no dense layer)

  // Multi-token prediction (speculative decoding, engine/speculative.h):
  // 0 or 1 MTP decoder layer, bound as layer num_layers (a full-attention
  // layer with routed experts and a shared expert, tensors under
  // "mtp.layers.0.") next to mtp.fc and its three norms. 0 when the config
  // has none or the checkpoint left its tensors out (Model::bind).
  int mtp_layers = 0;
  // The MTP layer's index (== num_layers) and every layer a session holds.
  int mtp_layer() const { return num_layers; }
  int num_layers_with_mtp() const { return num_layers + mtp_layers; }
  // Layer l's kind, the MTP layer's included (full attention).
  LayerKind kind_of(int l) const { return l < num_layers ? layer_kinds.at(l) : LayerKind::kFullAttention; }

  int linear_key_dim() const { return linear_num_key_heads * linear_key_head_dim; }
  int linear_value_dim() const { return linear_num_value_heads * linear_value_head_dim; }
  int linear_conv_dim() const { return 2 * linear_key_dim() + linear_value_dim(); }
  int num_attention_layers() const;
  // Layer l has routed experts (else a dense MLP of intermediate_size); the
  // MTP layer always.
  bool is_sparse(int l) const { return l >= num_layers || sparse_layers.empty() || sparse_layers.at(l) != 0; }
  int num_sparse_layers() const {
    int n = 0;
    for (int l = 0; l < num_layers; ++l) n += is_sparse(l);
    return n;
  }
  bool has_shared_expert() const { return shared_expert_intermediate_size > 0; }
  // The first layer with routed experts (every model has one).
  int first_sparse_layer() const {
    for (int l = 0; l < num_layers; ++l)
      if (is_sparse(l)) return l;
    return 0;
  }
};

// Parses config.json text; `path` is used in messages.
ModelSpec parse_model_spec(const std::string& json_text, const std::string& path);
// Reads DIR/config.json.
ModelSpec load_model_spec(const std::string& dir);

}  // namespace coli
