#include "formats/tensor_source.h"

namespace coli {

std::string SourceTensor::shape_str() const {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace coli
