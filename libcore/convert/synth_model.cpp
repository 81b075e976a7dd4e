#include "convert/synth_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>

#include "formats/dtype.h"
#include "model/fused_projections.h"
#include "model/layer_tensors.h"
#include "util/error.h"

namespace coli {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr float kChannel0 = 64.0f;  // the routing-bias channel's constant

inline uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
// Uniform in (0, 1) from 24 random bits.
inline float unit(uint64_t r) { return (static_cast<float>(r >> 40) + 0.5f) * (1.0f / 16777216.0f); }

}  // namespace

SynthOptions synth_shapes(SynthOptions o, ModelFamily f) {
  o.family = f;
  switch (f) {
    case ModelFamily::kQwen35Moe:
      o.vocab = 248320, o.hidden = 2048, o.experts = 256, o.top_k = 8, o.moe_inter = 512, o.shared_inter = 512;
      o.heads = 16, o.kv_heads = 2, o.head_dim = 256, o.lin_k_heads = 16, o.lin_v_heads = 32, o.lin_k_dim = 128, o.lin_v_dim = 128, o.conv = 4;
      break;
    case ModelFamily::kQwen3Moe:
      o.vocab = 151936, o.hidden = 2048, o.experts = 128, o.top_k = 8, o.moe_inter = 768, o.shared_inter = 0;
      o.heads = 32, o.kv_heads = 4, o.head_dim = 128;
      break;
    case ModelFamily::kQwen3Next:
      o.vocab = 151936, o.hidden = 2048, o.experts = 512, o.top_k = 10, o.moe_inter = 512, o.shared_inter = 512;
      o.heads = 16, o.kv_heads = 2, o.head_dim = 256, o.lin_k_heads = 16, o.lin_v_heads = 32, o.lin_k_dim = 128, o.lin_v_dim = 128, o.conv = 4;
      break;
  }
  return o;
}

int64_t SynthModel::Tensor::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

const std::vector<std::string>& SynthModel::tokenizer_files() {
  static const std::vector<std::string> files = {"tokenizer.json", "tokenizer_config.json", "LICENSE"};
  return files;
}

SynthModel::SynthModel(const SynthOptions& o) : opt_(o) {
  if (o.layers < 1) throw Error("synth: --layers must be at least 1");
  if (o.routing_skew < 0) throw Error("synth: --routing-skew must be >= 0");
  // A mistyped --tokenizer would otherwise make a model without one, noticed
  // only when a prompt is given.
  if (!o.tokenizer_dir.empty() && !fs::exists(fs::path(o.tokenizer_dir) / "tokenizer.json"))
    throw Error("--tokenizer " + o.tokenizer_dir + ": has no tokenizer.json");

  const int H = o.hidden, I = o.moe_inter, SI = o.shared_inter, E = o.experts;
  const bool skew = o.routing_skew > 0;
  // Router columns other than channel 0: keep the token-dependent logits O(1)
  // though channel 0 dominates the norm (see synth.h).
  const float router_std = skew ? kChannel0 / (std::sqrt(float(H)) * 0.02f * std::sqrt(float(H - 1))) : 0.02f;

  auto add = [&](std::string name, std::vector<int64_t> shape, Init init, float a = 0.02f, float b = 0, int layer = -1, bool zero_row0 = false) {
    Tensor t;
    t.name = std::move(name);
    t.shape = std::move(shape);
    t.init = init;
    t.a = a;
    t.b = b;
    t.layer = layer;
    t.zero_row0 = zero_row0;
    t.id = plan_.size();
    plan_.push_back(std::move(t));
  };
  // The plan walks the tensor table. Its order numbers each tensor's random
  // stream, and predates the table: the final norm and lm_head follow the
  // layers, a DeltaNet's out_proj follows its vectors. Kept, so a seed
  // still writes the same checkpoint.
  const ModelFamily fam = o.family;
  const bool moe_only = fam == ModelFamily::kQwen3Moe, next = fam == ModelFamily::kQwen3Next;
  ModelSpec spec;
  spec.family = fam;
  spec.norm_plus_one = !moe_only, spec.attention_output_gate = !moe_only, spec.fused_linear_projections = next;
  spec.vocab_size = o.vocab, spec.hidden_size = H, spec.num_layers = o.layers;
  spec.num_heads = o.heads, spec.num_kv_heads = o.kv_heads, spec.head_dim = o.head_dim;
  if (!moe_only) {
    spec.linear_num_key_heads = o.lin_k_heads, spec.linear_num_value_heads = o.lin_v_heads;
    spec.linear_key_head_dim = o.lin_k_dim, spec.linear_value_head_dim = o.lin_v_dim, spec.linear_conv_kernel = o.conv;
  }
  spec.num_experts = E, spec.num_experts_per_tok = o.top_k, spec.moe_intermediate_size = I, spec.shared_expert_intermediate_size = moe_only ? 0 : SI;
  spec.sparse_layers.assign(o.layers, 1);
  if (o.mtp && moe_only) throw Error("synth: --mtp: qwen3_moe checkpoints have no MTP module");
  spec.mtp_layers = o.mtp ? 1 : 0;
  std::vector<std::string> layer_types;
  for (int l = 0; l < o.layers; ++l) {
    const bool attn = moe_only || (l + 1) % 4 == 0;
    spec.layer_kinds.push_back(attn ? LayerKind::kFullAttention : LayerKind::kLinearAttention);
    layer_types.push_back(attn ? "full_attention" : "linear_attention");
  }
  // Norms: zero-centred (1 + w, init 0) or plain (w, init 1, qwen3_moe).
  const Init norm_init = moe_only ? Init::Ones : Init::Zeros, masked_init = moe_only ? Init::OnesMasked : Init::NormMasked;
  // transformers' init of each tensor (and the routing-bias twists, synth.h).
  auto add_entry = [&](const TensorDesc& t) {
    switch (t.role) {
      case TensorRole::kEmbed: return add(t.name, t.shape, Init::Embed);
      case TensorRole::kFinalNorm:
      case TensorRole::kInputNorm: return add(t.name, t.shape, skew ? masked_init : norm_init);
      case TensorRole::kPostNorm:
      case TensorRole::kQNorm:
      case TensorRole::kKNorm: return add(t.name, t.shape, norm_init);
      // qwen3_next's checkpoint fuses the DeltaNet input projections: the
      // plan holds its two tensors (model/fused_projections.h), in the
      // places of in_proj_qkv and in_proj_b.
      case TensorRole::kInProjQkv:
        if (next) return add(t.name.substr(0, t.name.find("linear_attn.")) + kFusedQkvz, fused_qkvz_shape(spec), Init::Normal);
        return add(t.name, t.shape, Init::Normal);
      case TensorRole::kInProjB:
        if (next) return add(t.name.substr(0, t.name.find("linear_attn.")) + kFusedBa, fused_ba_shape(spec), Init::Normal);
        return add(t.name, t.shape, Init::Normal);
      case TensorRole::kInProjZ:
      case TensorRole::kInProjA:
        if (next) return;
        return add(t.name, t.shape, Init::Normal);
      case TensorRole::kConv1d: return add(t.name, t.shape, Init::Uniform, -0.5f, 0.5f);
      case TensorRole::kDtBias:
      case TensorRole::kLinearNorm: return add(t.name, t.shape, Init::Ones);
      case TensorRole::kALog: return add(t.name, t.shape, Init::ALog, 0.5f, 16.0f);
      case TensorRole::kRouter: return add(t.name, t.shape, Init::Router, router_std, 0, t.layer);
      // The MTP module: the embedding's channel 0 (the routing constant)
      // masked out of fc's input, and fc never writes it (so the MTP layer
      // routes without the Zipf bias).
      case TensorRole::kMtpNormEmbed: return add(t.name, t.shape, skew ? masked_init : norm_init);
      case TensorRole::kMtpNormHidden:
      case TensorRole::kMtpNorm: return add(t.name, t.shape, norm_init);
      case TensorRole::kMtpFc: return add(t.name, t.shape, Init::Normal, 0.02f, 0, -1, true);
      // Output projections: channel 0 of the residual is never written.
      case TensorRole::kOProj:
      case TensorRole::kOutProj:
      case TensorRole::kSharedDown:
      case TensorRole::kExpertDown: return add(t.name, t.shape, Init::Normal, 0.02f, 0, t.layer, true);
      default: return add(t.name, t.shape, Init::Normal);
    }
  };
  const std::vector<TensorDesc> outer = model_tensors(spec, true);
  for (const TensorDesc& t : outer)
    if (t.role == TensorRole::kEmbed) add_entry(t);
  for (int l = 0; l < o.layers; ++l) {
    std::vector<TensorDesc> ts = layer_tensors(spec, l);
    const auto is = [](TensorRole r) { return [r](const TensorDesc& t) { return t.role == r; }; };
    const auto out_proj = std::find_if(ts.begin(), ts.end(), is(TensorRole::kOutProj));
    if (out_proj != ts.end()) std::rotate(out_proj, out_proj + 1, std::find_if(ts.begin(), ts.end(), is(TensorRole::kRouter)));
    for (const TensorDesc& t : ts) add_entry(t);
  }
  for (const TensorDesc& t : outer)
    if (t.role != TensorRole::kEmbed) add_entry(t);
  // The MTP layer last (after its module's fc and norms, which follow the
  // lm_head in the table's model-level order).
  for (int l = o.layers; l < spec.num_layers_with_mtp(); ++l)
    for (const TensorDesc& t : layer_tensors(spec, l)) add_entry(t);
  for (std::size_t i = 0; i < plan_.size(); ++i) index_.emplace(plan_[i].name, i);

  // Per-layer expert ranking for the Zipf bias (the MTP layer's unused).
  ranks_.assign(spec.num_layers_with_mtp(), std::vector<int>(E));
  for (int l = 0; l < spec.num_layers_with_mtp(); ++l) {
    std::iota(ranks_[l].begin(), ranks_[l].end(), 1);
    uint64_t r = splitmix(o.seed * 1000003 + l);
    for (int i = E - 1; i > 0; --i) {
      r = splitmix(r);
      std::swap(ranks_[l][i], ranks_[l][r % (i + 1)]);
    }
  }

  json cfg;
  if (fam == ModelFamily::kQwen35Moe) {
    cfg = {
        {"architectures", {"Qwen3_5MoeForCausalLM"}},
        {"model_type", "qwen3_5_moe_text"},
        {"dtype", "bfloat16"},
        {"vocab_size", o.vocab},
        {"hidden_size", H},
        {"num_hidden_layers", o.layers},
        {"layer_types", layer_types},
        {"num_attention_heads", o.heads},
        {"num_key_value_heads", o.kv_heads},
        {"head_dim", o.head_dim},
        {"hidden_act", "silu"},
        {"rms_norm_eps", 1e-6},
        {"max_position_embeddings", 262144},
        {"attention_bias", false},
        {"attention_dropout", 0.0},
        {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000000.0}, {"partial_rotary_factor", 0.25},
                             {"mrope_section", {11, 11, 10}}, {"mrope_interleaved", true}}},
        {"partial_rotary_factor", 0.25},
        {"linear_conv_kernel_dim", o.conv},
        {"linear_key_head_dim", o.lin_k_dim},
        {"linear_value_head_dim", o.lin_v_dim},
        {"linear_num_key_heads", o.lin_k_heads},
        {"linear_num_value_heads", o.lin_v_heads},
        {"num_experts", E},
        {"num_experts_per_tok", o.top_k},
        {"moe_intermediate_size", I},
        {"shared_expert_intermediate_size", SI},
        {"initializer_range", 0.02},
        {"tie_word_embeddings", false},
        {"use_cache", true},
        {"bos_token_id", nullptr},
        {"eos_token_id", 248046},
        {"pad_token_id", 248044},
    };
  } else {
    // As the released Qwen3-30B-A3B / Qwen3-Next-80B-A3B config.json files.
    cfg = {
        {"architectures", {moe_only ? "Qwen3MoeForCausalLM" : "Qwen3NextForCausalLM"}},
        {"model_type", family_name(fam)},
        {"torch_dtype", "bfloat16"},
        {"vocab_size", o.vocab},
        {"hidden_size", H},
        {"num_hidden_layers", o.layers},
        {"num_attention_heads", o.heads},
        {"num_key_value_heads", o.kv_heads},
        {"head_dim", o.head_dim},
        {"hidden_act", "silu"},
        {"rms_norm_eps", 1e-6},
        {"max_position_embeddings", moe_only ? 40960 : 262144},
        {"attention_bias", false},
        {"attention_dropout", 0.0},
        {"rope_theta", moe_only ? 1000000.0 : 10000000.0},
        {"rope_scaling", nullptr},
        {"use_sliding_window", false},
        {"sliding_window", nullptr},
        {"num_experts", E},
        {"num_experts_per_tok", o.top_k},
        {"moe_intermediate_size", I},
        {"intermediate_size", moe_only ? 6144 : 5120},
        {"norm_topk_prob", true},
        {"decoder_sparse_step", 1},
        {"mlp_only_layers", json::array()},
        {"output_router_logits", false},
        {"router_aux_loss_coef", 0.001},
        {"initializer_range", 0.02},
        {"tie_word_embeddings", false},
        {"use_cache", true},
        {"bos_token_id", 151643},
        {"eos_token_id", 151645},
    };
    if (next) {
      cfg["full_attention_interval"] = 4;
      cfg["partial_rotary_factor"] = 0.25;
      cfg["shared_expert_intermediate_size"] = SI;
      cfg["linear_conv_kernel_dim"] = o.conv;
      cfg["linear_key_head_dim"] = o.lin_k_dim;
      cfg["linear_value_head_dim"] = o.lin_v_dim;
      cfg["linear_num_key_heads"] = o.lin_k_heads;
      cfg["linear_num_value_heads"] = o.lin_v_heads;
    }
  }
  if (o.mtp) cfg["mtp_num_hidden_layers"] = 1, cfg["mtp_use_dedicated_embeddings"] = false;
  cfg["coli_synthetic"] = {{"seed", o.seed}, {"routing_skew", o.routing_skew}, {"note", "random weights for benchmarks; see coli-convert(1)"}};
  config_ = cfg.dump(2) + "\n";
  generation_config_ = fam == ModelFamily::kQwen35Moe
                           ? json{{"bos_token_id", nullptr}, {"eos_token_id", {248046, 248044}}, {"pad_token_id", 248044}}.dump(2) + "\n"
                           : json{{"bos_token_id", 151643}, {"eos_token_id", {151645, 151643}}, {"pad_token_id", 151643}}.dump(2) + "\n";
}

const SynthModel::Tensor* SynthModel::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &plan_[it->second];
}

uint64_t SynthModel::params() const {
  uint64_t n = 0;
  for (const Tensor& t : plan_) n += static_cast<uint64_t>(t.numel());
  return n;
}

void SynthModel::fill(const Tensor& t, int64_t i0, int64_t n, uint16_t* out) const {
  const double skew = opt_.routing_skew;
  const int64_t cols = t.shape.back();
  const uint64_t base = splitmix(opt_.seed ^ splitmix(t.id));
  for (int64_t k = 0; k < n; ++k) {
    const int64_t i = i0 + k;
    const uint64_t r = splitmix(base + static_cast<uint64_t>(i));
    float v = 0;
    switch (t.init) {
      case Init::Normal:
      case Init::Embed:
      case Init::Router: {
        // Box-Muller; the second draw of the pair is not needed.
        const float u1 = unit(r), u2 = unit(splitmix(r));
        v = t.a * std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
        break;
      }
      case Init::Zeros: v = 0; break;
      case Init::Ones: v = 1; break;
      case Init::Uniform: v = t.a + (t.b - t.a) * unit(r); break;
      case Init::ALog: v = std::log(t.a + (t.b - t.a) * unit(r)); break;
      case Init::NormMasked: v = 0; break;
      case Init::OnesMasked: v = 1; break;
    }
    const int64_t row = i / cols, col = i % cols;
    if (skew > 0) {
      if (t.init == Init::Embed && col == 0) v = kChannel0;
      if (t.init == Init::NormMasked && i == 0) v = -1.0f;  // 1 + w = 0
      if (t.init == Init::OnesMasked && i == 0) v = 0.0f;
      if (t.init == Init::Router && col == 0) v = static_cast<float>(-skew * std::log(double(ranks_[t.layer][row])) / std::sqrt(double(opt_.hidden)));
      if (t.zero_row0 && row == 0) v = 0;
    }
    out[k] = f32_to_bf16(v);
  }
}

}  // namespace coli
