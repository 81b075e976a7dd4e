// libFuzzer target: config.json -> ModelSpec on arbitrary text, every
// family. Must either give a consistent spec or throw coli::Error.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "model/model_spec.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    coli::ModelSpec s = coli::parse_model_spec(text, "config.json");
    const bool linear = s.num_attention_layers() < s.num_layers;
    if (static_cast<int>(s.layer_kinds.size()) != s.num_layers || static_cast<int>(s.sparse_layers.size()) != s.num_layers ||
        s.num_heads % s.num_kv_heads || (linear && (s.linear_num_key_heads <= 0 || s.linear_num_value_heads % s.linear_num_key_heads)) ||
        s.rotary_dim > s.head_dim || s.num_experts_per_tok > s.num_experts ||
        (std::count(s.sparse_layers.begin(), s.sparse_layers.end(), 0) > 0 && s.intermediate_size <= 0) || s.first_sparse_layer() < 0 ||
        !s.is_sparse(s.first_sparse_layer()))
      std::abort();
  } catch (const coli::Error&) {
  }
  return 0;
}
