// libFuzzer target: the shared-memory mirror's header and directory parser
// (mirror/mirror.h parse_mirror) on arbitrary bytes. It must either throw
// coli::Error or give a layout whose directory, heat counters and blobs all
// lie inside the bytes, blobs inside the data region, no blob twice.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <set>
#include <vector>

#include "mirror/mirror.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A segment is page aligned: parse an aligned copy.
  std::vector<uint64_t> buf((size + 7) / 8);
  if (size) std::memcpy(buf.data(), data, size);
  const auto* bytes = reinterpret_cast<const uint8_t*>(buf.data());
  try {
    const coli::MirrorLayout l = coli::parse_mirror(bytes, size, "fuzz");
    const coli::MirrorHeader& h = *l.header;
    if (h.segment_bytes > size || h.dir_offset + uint64_t(h.dir_count) * sizeof(coli::MirrorEntry) > h.segment_bytes) std::abort();
    if (h.heat_offset + uint64_t(h.layers) * h.experts * 8 > h.segment_bytes || h.data_offset + h.data_bytes > h.segment_bytes) std::abort();
    std::set<uint32_t> seen;
    for (const coli::MirrorEntry& e : l.entries) {
      if (e.offset < h.data_offset || e.offset + e.bytes > h.data_offset + h.data_bytes || e.offset + e.bytes < e.offset) std::abort();
      if (!seen.insert(e.blob).second) std::abort();
    }
  } catch (const coli::Error&) {
  }
  return 0;
}
