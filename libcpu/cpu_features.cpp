#include "cpu_features.h"

#include <atomic>

namespace coli::cpu {

CpuLevel detected_level() {
  static const CpuLevel l = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("fma"))
      return CpuLevel::kAvx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) return CpuLevel::kAvx2;
    return CpuLevel::kScalar;
  }();
  return l;
}

namespace {
std::atomic<int>& level_var() {
  static std::atomic<int> v = static_cast<int>(detected_level());
  return v;
}
}  // namespace

CpuLevel active_level() { return static_cast<CpuLevel>(level_var().load(std::memory_order_relaxed)); }

void set_active_level(CpuLevel l) {
  if (l > detected_level()) l = detected_level();
  level_var().store(static_cast<int>(l));
}

const char* level_name(CpuLevel l) { return l == CpuLevel::kAvx512 ? "avx512" : l == CpuLevel::kAvx2 ? "avx2" : "scalar"; }

}  // namespace coli::cpu
