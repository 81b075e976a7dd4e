// libFuzzer target: the heat file parser (placement/heat.h) on arbitrary
// text. It must either throw coli::Error or give a table within the format's
// bounds whose counts never exceed its tokens, and that formats back to
// text that parses to the same table.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "placement/heat.h"
#include "fuzz_file.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  {  // parsed as the file is read (the tools' way) or in memory: the same outcome
    const std::string path = coli::fuzz::input_file(data, size, "heat-lines");
    const std::string text(reinterpret_cast<const char*>(data), size);
    if (coli::fuzz::error_of([&] { coli::read_heat_file(path); }) != coli::fuzz::error_of([&] { coli::parse_heat(text, path); })) std::abort();
  }
  try {
    const coli::HeatFile f = coli::parse_heat(coli::fuzz::through_file(data, size, "heat"), "fuzz");
    const coli::Heat& h = f.heat;
    if (h.layers() < 1 || h.layers() > 4096 || h.experts() < 1 || h.experts() > 65536) std::abort();
    if (h.counts().size() != std::size_t(h.layers()) * h.experts()) std::abort();
    for (uint64_t c : h.counts())
      if (c > h.tokens()) std::abort();
    const coli::HeatFile g = coli::parse_heat(coli::format_heat(h, f.fingerprint), "fuzz-again");
    if (g.fingerprint != f.fingerprint || g.heat.tokens() != h.tokens() || g.heat.layers() != h.layers() || g.heat.experts() != h.experts())
      std::abort();
    for (std::size_t i = 0; i < h.counts().size(); ++i)
      if (g.heat.counts()[i] != h.counts()[i]) std::abort();
    (void)h.global_order();
  } catch (const coli::Error&) {
  }
  return 0;
}
