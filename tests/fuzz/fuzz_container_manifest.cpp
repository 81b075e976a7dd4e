// libFuzzer target: the container manifest parser on arbitrary text. Every
// accepted entry must lie inside the declared data region.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "formats/container.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr uint64_t kDataEnd = 1ull << 24;
  try {
    const coli::Manifest m = coli::parse_manifest(std::string_view(reinterpret_cast<const char*>(data), size), kDataEnd, "fuzz");
    for (const auto& b : m.blobs) {
      if (b.offset + b.bytes > kDataEnd || b.offset < coli::kContainerHeaderBytes) std::abort();
      for (const auto& p : b.parts)
        if (p.offset < b.offset || p.offset + p.bytes > b.offset + b.bytes) std::abort();
    }
  } catch (const coli::Error&) {
  }
  return 0;
}
