// libFuzzer target: the residency plan parser (placement/plan.h) on
// arbitrary text. It must either throw coli::Error or give a plan within the
// format's bounds, with one tier per (layer, expert) and counts that add up,
// that formats back to text parsing to the same plan (and the same text).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "placement/plan.h"
#include "fuzz_file.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  {  // parsed as the file is read (the tools' way) or in memory: the same outcome
    const std::string path = coli::fuzz::input_file(data, size, "plan-lines");
    const std::string text(reinterpret_cast<const char*>(data), size);
    if (coli::fuzz::error_of([&] { coli::read_plan_file(path); }) != coli::fuzz::error_of([&] { coli::parse_plan(text, path); })) std::abort();
  }
  try {
    const coli::Plan p = coli::parse_plan(coli::fuzz::through_file(data, size, "plan"), "fuzz");
    if (p.layers < 1 || p.layers > 4096 || p.experts < 1 || p.experts > 65536) std::abort();
    if (p.tier.size() != std::size_t(p.layers) * p.experts) std::abort();
    if (p.prefill_chunk < 0 || p.prefill_chunk > (1 << 20)) std::abort();
    if (!p.comments.empty()) std::abort();
    for (coli::Tier t : p.tier)
      if (t != coli::Tier::kDisk && t != coli::Tier::kRam && t != coli::Tier::kVram) std::abort();
    const int64_t n = p.count(coli::Tier::kDisk) + p.count(coli::Tier::kRam) + p.count(coli::Tier::kVram);
    if (n != int64_t(p.tier.size())) std::abort();
    int64_t vram = 0;
    for (int l = 0; l < p.layers; ++l) vram += p.count(coli::Tier::kVram, l);
    if (vram != p.count(coli::Tier::kVram)) std::abort();
    const std::string text = coli::format_plan(p);
    const coli::Plan q = coli::parse_plan(text, "fuzz-again");
    if (q.fingerprint != p.fingerprint || q.layers != p.layers || q.experts != p.experts || q.vram_budget != p.vram_budget ||
        q.ram_budget != p.ram_budget || q.prefill_chunk != p.prefill_chunk || q.tier != p.tier)
      std::abort();
    if (coli::format_plan(q) != text) std::abort();
    const std::vector<uint64_t> heat = coli::plan_as_heat(p);
    if (heat.size() != p.tier.size()) std::abort();
  } catch (const coli::Error&) {
  }
  return 0;
}
