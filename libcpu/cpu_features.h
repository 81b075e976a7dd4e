// Which vector instructions the CPU kernels use. Detected once at start;
// COLI_CPU_LEVEL=scalar|avx2|avx512 caps it (tests run every level the
// machine has against the scalar reference).
#pragma once
#include <string>

namespace coli::cpu {

enum class CpuLevel { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

CpuLevel detected_level();          // what the CPU supports
CpuLevel active_level();            // what the kernels use now
void set_active_level(CpuLevel l);  // capped at detected_level()
const char* level_name(CpuLevel l);

}  // namespace coli::cpu
