// TensorSource: where a Model's tensors come from, by canonical name (the
// names of a text-only Hugging Face checkpoint: "model.layers.3.mlp.gate.weight").
// Two implementations: a safetensors checkpoint (any layout; fp8 weights
// come with their block scales) and a coli container.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "quant/format.h"

namespace coli {

struct SourceTensor {
  std::string name;
  QuantFormat format = QuantFormat::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  std::size_t nbytes = 0;
  const float* aux = nullptr;  // fp8 block scales (f32), else null
  std::string file;            // for messages
  std::vector<std::string> companions;  // other source names this one consumed (e.g. *_scale_inv)
  std::string shape_str() const { return shape_string(shape); }
};

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // Null if absent. Throws coli::Error if present but unusable (dtype).
  virtual const SourceTensor* find(const std::string& name) = 0;
  // Every name in the source, for the unknown-tensor check.
  virtual std::vector<std::string> names() const = 0;
  virtual std::string where() const = 0;
};

}  // namespace coli
