// libFuzzer target: config.json -> ModelSpec on arbitrary text. Must either
// give a consistent spec or throw coli::Error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "model/model_spec.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    coli::ModelSpec s = coli::parse_model_spec(std::string(reinterpret_cast<const char*>(data), size), "config.json");
    if (static_cast<int>(s.layer_kinds.size()) != s.num_layers || s.num_heads % s.num_kv_heads ||
        s.linear_num_value_heads % s.linear_num_key_heads || s.rotary_dim > s.head_dim)
      std::abort();
  } catch (const coli::Error&) {
  }
  return 0;
}
