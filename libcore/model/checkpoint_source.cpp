#include "model/checkpoint_source.h"

#include "util/error.h"

namespace coli {

CheckpointSource::CheckpointSource(const std::string& dir, const std::string& prefix) : dir_(dir), prefix_(prefix), archive_(dir) {}

std::string CheckpointSource::to_source(const std::string& canonical) const {
  if (canonical.rfind("model.", 0) == 0) return prefix_ + canonical.substr(6);
  return canonical;
}

std::vector<std::string> CheckpointSource::names() const {
  std::vector<std::string> out;
  for (const auto& n : archive_.names()) {
    if (prefix_ != "model." && n.rfind(prefix_, 0) == 0) out.push_back("model." + n.substr(prefix_.size()));
    else out.push_back(n);
  }
  return out;
}

const SourceTensor* CheckpointSource::find(const std::string& canonical) {
  auto hit = cache_.find(canonical);
  if (hit != cache_.end()) return &hit->second;
  const std::string name = to_source(canonical);
  const TensorView* t = archive_.find(name);
  if (!t) return nullptr;
  SourceTensor s;
  s.name = name;
  s.shape = t->shape;
  s.data = t->data;
  s.nbytes = t->nbytes;
  s.file = t->file;
  switch (t->dtype) {
    case DType::F32: s.format = QuantFormat::F32; break;
    case DType::BF16: s.format = QuantFormat::BF16; break;
    case DType::F16: s.format = QuantFormat::F16; break;
    case DType::F8_E4M3: {
      s.format = QuantFormat::FP8_E4M3_B128;
      const std::string sn = name + "_scale_inv";
      const TensorView* sc = archive_.find(sn);
      if (!sc) throw Error(t->file + ": fp8 tensor '" + name + "' has no '" + sn + "'");
      if (t->shape.size() != 2) throw Error(t->file + ": fp8 tensor '" + name + "' is not 2-D; only 2-D fp8 weights are supported");
      const std::vector<int64_t> want = {(t->shape[0] + 127) / 128, (t->shape[1] + 127) / 128};
      if (sc->shape != want) throw Error(sc->file + ": '" + sn + "' has shape " + sc->shape_str() + "; 128x128 blocks of " + name + " need " + shape_string(want));
      if (sc->dtype != DType::F32 && sc->dtype != DType::BF16 && sc->dtype != DType::F16) throw Error(sc->file + ": '" + sn + "' must be f32, bf16 or f16");
      scales_.emplace_back(static_cast<std::size_t>(sc->numel()));
      to_f32(sc->dtype, sc->data, scales_.back().size(), scales_.back().data());
      s.aux = scales_.back().data();
      s.companions.push_back(canonical + "_scale_inv");
      break;
    }
    default:
      throw Error(t->file + ": tensor '" + name + "' has dtype " + dtype_name(t->dtype) + "; only BF16, F16, F32 and block-scaled F8_E4M3 are supported");
  }
  return &cache_.emplace(canonical, std::move(s)).first->second;
}

}  // namespace coli
