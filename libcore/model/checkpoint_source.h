// A Hugging Face safetensors checkpoint as a TensorSource. Names are mapped
// from the checkpoint's layout (prefix "model." or "model.language_model.")
// to canonical ones. F8_E4M3 weights are paired with their
// "<name>_scale_inv" block scales (128 x 128 blocks).
#pragma once
#include <deque>
#include <map>
#include <memory>

#include "formats/safetensors.h"
#include "formats/tensor_source.h"

namespace coli {

class CheckpointSource : public TensorSource {
 public:
  // prefix: where the text model's tensors live ("model." or "model.language_model.").
  CheckpointSource(const std::string& dir, const std::string& prefix);
  const SourceTensor* find(const std::string& canonical) override;
  std::vector<std::string> names() const override;  // canonical names
  std::string where() const override { return dir_; }

 private:
  std::string to_source(const std::string& canonical) const;
  std::string dir_, prefix_;
  SafetensorsArchive archive_;
  std::map<std::string, SourceTensor> cache_;
  std::deque<std::vector<float>> scales_;  // upcast fp8 block scales
};

}  // namespace coli
