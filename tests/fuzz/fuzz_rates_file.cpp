// libFuzzer target: the rates file parser (placement/machine_rates.h) on
// arbitrary text. It must either throw coli::Error or give rates the
// planner accepts (finite, rates > 0, times >= 0) that format back to text
// parsing to the same values.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "placement/machine_rates.h"
#include "fuzz_file.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  {  // parsed as the file is read (the tools' way) or in memory: the same outcome
    const std::string path = coli::fuzz::input_file(data, size, "rates-lines");
    const std::string text(reinterpret_cast<const char*>(data), size);
    if (coli::fuzz::error_of([&] { coli::load_rates(path); }) != coli::fuzz::error_of([&] { coli::parse_rates(text, path); })) std::abort();
  }
  try {
    const coli::MachineRates r = coli::parse_rates(coli::fuzz::through_file(data, size, "rates"), "fuzz");
    for (double v : {r.host_expert_gbs, r.disk_gbs, r.pcie_gbs})
      if (!(v > 0) || !std::isfinite(v)) std::abort();
    for (double v : {r.gpu_layer_s, r.gpu_expert_s, r.handoff_s, r.token_fixed_s, r.prefill_layer_token_s})
      if (!(v >= 0) || !std::isfinite(v)) std::abort();
    const coli::MachineRates b = coli::parse_rates(coli::format_rates(r), "fuzz-again");
    auto near = [](double x, double y) { return std::fabs(x - y) <= 1e-8 * std::fabs(x); };
    if (!near(b.pcie_gbs, r.pcie_gbs) || !near(b.host_expert_gbs, r.host_expert_gbs) || !near(b.gpu_layer_s, r.gpu_layer_s)) std::abort();
  } catch (const coli::Error&) {
  }
  return 0;
}
