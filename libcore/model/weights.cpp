#include "model/weights.h"

#include <set>

#include "util/error.h"

namespace coli {

void Matrix::row_f32(int64_t r, float* dst) const { to_f32(dtype, data + r * row_bytes(), static_cast<std::size_t>(cols), dst); }

bool is_ignored_tensor(const std::string& name) {
  auto starts = [&](const char* p) { return name.rfind(p, 0) == 0; };
  return starts("mtp.") || starts("model.visual.") || starts("visual.") || starts("model.mtp.");
}

namespace {

// Binds names to views, checking shape and dtype; remembers what it used.
class Binder {
 public:
  Binder(const SafetensorsArchive& a, std::string dir) : a_(a), dir_(std::move(dir)) {}

  const TensorView& get(const std::string& name, std::vector<int64_t> shape) {
    const TensorView* t = a_.find(name);
    if (!t) throw Error(dir_ + ": missing tensor '" + name + "'");
    if (t->shape != shape) {
      TensorView want;
      want.shape = shape;
      throw Error(t->file + ": tensor '" + name + "' has shape " + t->shape_str() + ", expected " + want.shape_str());
    }
    if (t->dtype != DType::F32 && t->dtype != DType::BF16 && t->dtype != DType::F16)
      throw Error(t->file + ": tensor '" + name + "' has dtype " + dtype_name(t->dtype) + "; only BF16, F16 and F32 are supported");
    used_.insert(name);
    return *t;
  }
  bool has(const std::string& name) const { return a_.find(name) != nullptr; }

  Matrix matrix(const std::string& name, int64_t rows, int64_t cols) {
    const TensorView& t = get(name, {rows, cols});
    return Matrix{t.dtype, t.data, rows, cols};
  }
  std::vector<float> vec(const std::string& name, std::vector<int64_t> shape) {
    const TensorView& t = get(name, shape);
    std::vector<float> v(static_cast<std::size_t>(t.numel()));
    to_f32(t.dtype, t.data, v.size(), v.data());
    return v;
  }
  // Slice e of a 3-D [n, rows, cols] tensor, optionally a row range of it.
  Matrix slice(const TensorView& t, int64_t e, int64_t row0, int64_t rows) {
    const int64_t cols = t.shape[2];
    const std::size_t esz = dtype_size(t.dtype);
    return Matrix{t.dtype, t.data + ((e * t.shape[1] + row0) * cols) * esz, rows, cols};
  }

  void check_no_unknown() const {
    for (const auto& n : a_.names())
      if (!used_.count(n) && !is_ignored_tensor(n)) throw Error(dir_ + ": unknown tensor '" + n + "'");
  }

 private:
  const SafetensorsArchive& a_;
  std::string dir_;
  std::set<std::string> used_;
};

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& dir) {
  std::unique_ptr<Model> m(new Model());
  m->dir_ = dir;
  m->spec_ = load_model_spec(dir);
  m->archive_ = std::make_unique<SafetensorsArchive>(dir);
  const ModelSpec& s = m->spec_;
  Binder b(*m->archive_, dir);
  const int64_t H = s.hidden_size, V = s.vocab_size;
  const std::string& P = s.tensor_prefix;

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
      const TensorView& gu = b.get(L + "mlp.experts.gate_up_proj", {E, 2 * I, H});
      const TensorView& dn = b.get(L + "mlp.experts.down_proj", {E, H, I});
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
