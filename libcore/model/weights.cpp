#include "model/weights.h"

#include <filesystem>
#include <set>

#include "formats/container.h"
#include "model/checkpoint_source.h"

#include "util/error.h"

namespace coli {

bool is_ignored_tensor(const std::string& name) {
  auto starts = [&](const char* p) { return name.rfind(p, 0) == 0; };
  return starts("mtp.") || starts("model.visual.") || starts("visual.") || starts("model.mtp.");
}

namespace {

// Binds names to tensors, checking shape and format; remembers what it used.
class Binder {
 public:
  Binder(TensorSource& src, std::string where) : src_(src), where_(std::move(where)) {}

  const SourceTensor& get(const std::string& name, std::vector<int64_t> shape) {
    const SourceTensor* t = src_.find(name);
    if (!t) throw Error(where_ + ": missing tensor '" + name + "'");
    if (t->shape != shape) throw Error(t->file + ": tensor '" + t->name + "' has shape " + t->shape_str() + ", expected " + shape_string(shape));
    used_.insert(name);
    for (const auto& c : t->companions) used_.insert(c);
    return *t;
  }
  bool has(const std::string& name) { return src_.find(name) != nullptr; }

  Matrix matrix(const std::string& name, int64_t rows, int64_t cols) {
    const SourceTensor& t = get(name, {rows, cols});
    return Matrix{t.format, t.data, rows, cols, t.aux};
  }
  std::vector<float> vec(const std::string& name, std::vector<int64_t> shape) {
    const SourceTensor& t = get(name, shape);
    if (format_info(t.format).quantized || t.format == QuantFormat::FP8_E4M3_B128)
      throw Error(t.file + ": tensor '" + t.name + "' is " + format_name(t.format) + "; norms and gates must be f32, bf16 or f16");
    int64_t n = 1;
    for (auto d : shape) n *= d;
    std::vector<float> v(static_cast<std::size_t>(n));
    dequantize_row(t.format, t.data, 1, n, 0, v.data());
    return v;
  }
  // Slice e of a 3-D [n, rows, cols] float tensor, a row range of it.
  Matrix slice(const SourceTensor& t, int64_t e, int64_t row0, int64_t rows) {
    if (format_info(t.format).quantized || t.format == QuantFormat::FP8_E4M3_B128)
      throw Error(t.file + ": fused expert tensor '" + t.name + "' in " + format_name(t.format) + " is not supported");
    const int64_t cols = t.shape[2];
    const std::size_t esz = layout_of(t.format, 1, 1).row_stride;
    return Matrix{t.format, t.data + ((e * t.shape[1] + row0) * cols) * esz, rows, cols, nullptr};
  }

  void check_no_unknown() const {
    for (const auto& n : src_.names())
      if (!used_.count(n) && !is_ignored_tensor(n)) throw Error(where_ + ": unknown tensor '" + n + "'");
  }

 private:
  TensorSource& src_;
  std::string where_;
  std::set<std::string> used_;
};

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& path) {
  namespace fs = std::filesystem;
  std::string file;
  if (fs::is_regular_file(path)) file = path;
  else if (fs::is_directory(path) && fs::exists(fs::path(path) / "model.coli")) file = (fs::path(path) / "model.coli").string();
  if (!file.empty()) {
    auto c = std::make_shared<Container>(file);
    ModelSpec spec = parse_model_spec(c->config_json(), file + ": config");
    spec.tensor_prefix = "model.";  // containers store canonical names
    return bind(spec, c, file);
  }
  ModelSpec spec = load_model_spec(path);
  return bind(spec, std::make_shared<CheckpointSource>(path, spec.tensor_prefix), path);
}

std::unique_ptr<Model> Model::bind(const ModelSpec& spec, std::shared_ptr<TensorSource> source, const std::string& where) {
  std::unique_ptr<Model> m(new Model());
  m->dir_ = where;
  m->spec_ = spec;
  m->source_ = std::move(source);
  const ModelSpec& s = m->spec_;
  Binder b(*m->source_, where);
  const int64_t H = s.hidden_size, V = s.vocab_size;
  const std::string P = "model.";

  m->embed_ = b.matrix(P + "embed_tokens.weight", V, H);
  m->final_norm_ = b.vec(P + "norm.weight", {H});
  if (b.has("lm_head.weight") || !s.tie_word_embeddings) m->lm_head_ = b.matrix("lm_head.weight", V, H);
  else m->lm_head_ = m->embed_;

  for (int i = 0; i < s.num_layers; ++i) {
    const std::string L = P + "layers." + std::to_string(i) + ".";
    LayerWeights lw;
    lw.kind = s.layer_kinds[i];
    lw.input_norm = b.vec(L + "input_layernorm.weight", {H});
    lw.post_norm = b.vec(L + "post_attention_layernorm.weight", {H});
    if (lw.kind == LayerKind::kFullAttention) {
      const int64_t hd = s.head_dim, nh = s.num_heads, nkv = s.num_kv_heads;
      auto& a = lw.attn;
      a.q_proj = b.matrix(L + "self_attn.q_proj.weight", nh * hd * 2, H);
      a.k_proj = b.matrix(L + "self_attn.k_proj.weight", nkv * hd, H);
      a.v_proj = b.matrix(L + "self_attn.v_proj.weight", nkv * hd, H);
      a.o_proj = b.matrix(L + "self_attn.o_proj.weight", H, nh * hd);
      a.q_norm = b.vec(L + "self_attn.q_norm.weight", {hd});
      a.k_norm = b.vec(L + "self_attn.k_norm.weight", {hd});
    } else {
      const int64_t kd = s.linear_key_dim(), vd = s.linear_value_dim(), nv = s.linear_num_value_heads;
      const int64_t cd = s.linear_conv_dim(), K = s.linear_conv_kernel;
      auto& g = lw.gdn;
      g.in_proj_qkv = b.matrix(L + "linear_attn.in_proj_qkv.weight", 2 * kd + vd, H);
      g.in_proj_z = b.matrix(L + "linear_attn.in_proj_z.weight", vd, H);
      g.in_proj_b = b.matrix(L + "linear_attn.in_proj_b.weight", nv, H);
      g.in_proj_a = b.matrix(L + "linear_attn.in_proj_a.weight", nv, H);
      g.out_proj = b.matrix(L + "linear_attn.out_proj.weight", H, vd);
      g.conv1d = b.vec(L + "linear_attn.conv1d.weight", {cd, 1, K});
      g.dt_bias = b.vec(L + "linear_attn.dt_bias", {nv});
      g.A_log = b.vec(L + "linear_attn.A_log", {nv});
      g.norm = b.vec(L + "linear_attn.norm.weight", {s.linear_value_head_dim});
    }
    auto& moe = lw.moe;
    const int64_t E = s.num_experts, I = s.moe_intermediate_size, SI = s.shared_expert_intermediate_size;
    moe.router = b.matrix(L + "mlp.gate.weight", E, H);
    moe.experts.resize(E);
    if (b.has(L + "mlp.experts.gate_up_proj")) {
      moe.fused_layout = true;
      const SourceTensor& gu = b.get(L + "mlp.experts.gate_up_proj", {E, 2 * I, H});
      const SourceTensor& dn = b.get(L + "mlp.experts.down_proj", {E, H, I});
      for (int64_t e = 0; e < E; ++e) {
        moe.experts[e].gate = b.slice(gu, e, 0, I);
        moe.experts[e].up = b.slice(gu, e, I, I);
        moe.experts[e].down = b.slice(dn, e, 0, H);
      }
    } else {
      for (int64_t e = 0; e < E; ++e) {
        const std::string X = L + "mlp.experts." + std::to_string(e) + ".";
        moe.experts[e].gate = b.matrix(X + "gate_proj.weight", I, H);
        moe.experts[e].up = b.matrix(X + "up_proj.weight", I, H);
        moe.experts[e].down = b.matrix(X + "down_proj.weight", H, I);
      }
    }
    moe.shared.gate = b.matrix(L + "mlp.shared_expert.gate_proj.weight", SI, H);
    moe.shared.up = b.matrix(L + "mlp.shared_expert.up_proj.weight", SI, H);
    moe.shared.down = b.matrix(L + "mlp.shared_expert.down_proj.weight", H, SI);
    moe.shared_gate = b.matrix(L + "mlp.shared_expert_gate.weight", 1, H);
    m->layers_.push_back(std::move(lw));
  }
  b.check_no_unknown();
  return m;
}

}  // namespace coli
