// libFuzzer target: the safetensors header parser on arbitrary bytes.
// Any input must either parse into tensors that lie inside the buffer or
// throw coli::Error; never crash or read out of bounds.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "formats/safetensors.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto ts = coli::SafetensorsFile::parse("fuzz.safetensors", data, size);
    for (const auto& [name, t] : ts) {
      if (t.data < data || t.data + t.nbytes > data + size) std::abort();
      volatile uint8_t sink = 0;
      for (std::size_t i = 0; i < t.nbytes; i += 64) sink = sink + t.data[i];
    }
  } catch (const coli::Error&) {
  }
  return 0;
}
