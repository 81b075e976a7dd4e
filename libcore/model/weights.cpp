#include "model/weights.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include "formats/container.h"
#include "model/checkpoint_source.h"
#include "model/fused_projections.h"
#include "model/layer_tensors.h"

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
  // Binds a matrix or vector entry of the tensor table into its slot.
  void bind(const TensorDesc& t, TensorSlot slot) {
    if (slot.matrix) *slot.matrix = matrix(t.name, t.shape.at(0), t.shape.at(1));
    else *slot.vector = vec(t.name, t.shape);
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

  // qwen3_next's fused DeltaNet projections as the split ones the table
  // lists (model/fused_projections.h): whole rows copied into buffers of
  // `owned`. Row-wise formats (f32, bf16, f16: a row is its own bytes), and
  // block-scaled fp8 when every 128-row block of a split projection comes
  // from one 128-row block of the fused tensor (so its scale row moves with
  // it: head sizes in 128s as in Qwen3-Next, and in_proj_ba within one block).
  void split_fused_projections(const ModelSpec& s, const std::string& L, const std::vector<TensorDesc>& ts, LayerWeights& lw,
                               std::vector<std::vector<uint8_t>>& owned) {
    const SourceTensor& qkvz = get(L + kFusedQkvz, fused_qkvz_shape(s));
    const SourceTensor& ba = get(L + kFusedBa, fused_ba_shape(s));
    for (const SourceTensor* t : {&qkvz, &ba})
      if (t->format != QuantFormat::F32 && t->format != QuantFormat::BF16 && t->format != QuantFormat::F16 && t->format != QuantFormat::FP8_E4M3_B128)
        throw Error(t->file + ": tensor '" + t->name + "' is " + format_name(t->format) + "; fused DeltaNet projections must be f32, bf16, f16 or fp8");
    for (const TensorDesc& t : ts) {
      if (!is_split_projection(t.role)) continue;
      const int64_t rows = t.shape.at(0), cols = t.shape.at(1);
      const SourceTensor& from = fused_row(s, t.role, 0).ba ? ba : qkvz;
      const bool fp8 = from.format == QuantFormat::FP8_E4M3_B128;
      const std::size_t rb = fp8 ? static_cast<std::size_t>(cols) : layout_of(from.format, 1, cols).row_stride;
      std::vector<uint8_t> bytes(static_cast<std::size_t>(rows) * rb);
      for (int64_t r = 0; r < rows; ++r) std::memcpy(bytes.data() + r * rb, from.data + fused_row(s, t.role, r).row * rb, rb);
      owned.push_back(std::move(bytes));
      Matrix m{from.format, owned.back().data(), rows, cols, nullptr};
      if (fp8) {
        const int64_t bc = (cols + 127) / 128, br = (rows + 127) / 128;
        std::vector<uint8_t> scales(static_cast<std::size_t>(br * bc) * sizeof(float));
        for (int64_t b = 0; b < br; ++b) {
          const int64_t fb = fused_row(s, t.role, b * 128).row / 128;
          for (int64_t r = b * 128; r < std::min(rows, (b + 1) * 128); ++r)
            if (fused_row(s, t.role, r).row / 128 != fb)
              throw Error(from.file + ": fp8 tensor '" + from.name + "': its 128-row scale blocks do not follow the DeltaNet head groups (" +
                          t.name + " row " + std::to_string(r) + "); convert from the bf16 checkpoint");
          std::memcpy(scales.data() + b * bc * sizeof(float), from.aux + fb * bc, bc * sizeof(float));
        }
        owned.push_back(std::move(scales));
        m.aux = reinterpret_cast<const float*>(owned.back().data());
      }
      *slot_of(lw, t).matrix = m;
    }
  }

  // With the MTP module bound, an mtp.* tensor it did not use is unknown too.
  void check_no_unknown(bool mtp_bound) const {
    for (const auto& n : src_.names())
      if (!used_.count(n) && !(is_ignored_tensor(n) && !(mtp_bound && n.rfind("mtp.", 0) == 0))) throw Error(where_ + ": unknown tensor '" + n + "'");
  }

 private:
  TensorSource& src_;
  std::string where_;
  std::set<std::string> used_;
};

}  // namespace

std::string container_file_of(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::is_regular_file(path)) return path;
  if (fs::is_directory(path) && fs::exists(fs::path(path) / "model.coli")) return (fs::path(path) / "model.coli").string();
  return "";
}

std::unique_ptr<Model> Model::bind_container(const Container& c, std::shared_ptr<TensorSource> source, const std::string& file) {
  ModelSpec spec = parse_model_spec(c.config_json(), file + ": config");
  spec.tensor_prefix = "model.";  // containers store canonical names
  return bind(spec, std::move(source), file);
}

std::unique_ptr<Model> Model::load(const std::string& path) {
  if (const std::string file = container_file_of(path); !file.empty()) {
    auto c = std::make_shared<Container>(file);
    return bind_container(*c, c, file);
  }
  ModelSpec spec = load_model_spec(path);
  return bind(spec, std::make_shared<CheckpointSource>(path, spec.tensor_prefix), path);
}

std::unique_ptr<Model> Model::bind(const ModelSpec& spec, std::shared_ptr<TensorSource> source, const std::string& where) {
  std::unique_ptr<Model> m(new Model());
  m->dir_ = where;
  m->spec_ = spec;
  m->source_ = std::move(source);
  // An MTP module the config declares is kept where the checkpoint has it
  // (quantized repacks often leave it out: the model then has none).
  if (m->spec_.mtp_layers > 0 && !m->source_->find("mtp.fc.weight")) m->spec_.mtp_layers = 0;
  const ModelSpec& s = m->spec_;
  Binder b(*m->source_, where);
  for (const TensorDesc& t : model_tensors(s, true)) {
    if (t.role == TensorRole::kLmHead && s.tie_word_embeddings && !b.has(t.name)) {
      m->outer_.lm_head = m->outer_.embed;
      continue;
    }
    b.bind(t, slot_of(m->outer_, t));
  }
  for (int i = 0; i < s.num_layers_with_mtp(); ++i) {
    LayerWeights lw;
    lw.kind = s.kind_of(i);
    if (s.is_sparse(i)) lw.moe.experts.resize(s.num_experts);  // a dense layer has none
    // Routed experts come one tensor per part, or stacked in transformers'
    // fused layout (recognised by its first stack).
    std::vector<TensorDesc> ts = layer_tensors(s, i, ExpertLayout::kStacked);
    const auto stack = std::find_if(ts.begin(), ts.end(), [](const TensorDesc& t) { return t.form == TensorForm::kStack; });
    lw.moe.fused_layout = stack != ts.end() && b.has(stack->name);
    if (!lw.moe.fused_layout) ts = layer_tensors(s, i, ExpertLayout::kPerExpert);
    // qwen3_next checkpoints fuse the DeltaNet's input projections
    // (containers store them split, as qwen3_5_moe does).
    const std::string L = layer_prefix(s, i);
    const bool fused_gdn = s.fused_linear_projections && lw.kind == LayerKind::kLinearAttention && b.has(L + kFusedQkvz);
    if (fused_gdn) b.split_fused_projections(s, L, ts, lw, m->owned_);
    for (const TensorDesc& t : ts) {
      if (fused_gdn && is_split_projection(t.role)) continue;
      if (t.form != TensorForm::kStack) {
        b.bind(t, slot_of(lw, t));
        continue;
      }
      const SourceTensor& st = b.get(t.name, t.shape);
      const int64_t rows = t.shape[1];
      for (int64_t e = 0; e < t.shape[0]; ++e) {
        ExpertWeights& x = lw.moe.experts[e];
        if (t.role == TensorRole::kExpertsGateUp) x.gate = b.slice(st, e, 0, rows / 2), x.up = b.slice(st, e, rows / 2, rows / 2);
        else x.down = b.slice(st, e, 0, rows);
      }
    }
    m->layers_.push_back(std::move(lw));
  }
  b.check_no_unknown(s.mtp_layers > 0);
  return m;
}

}  // namespace coli
