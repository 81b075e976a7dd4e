// Which vector instructions the CPU kernels use: the best the CPU has
// unless set_active_level() caps it (the tools do for COLI_CPU_LEVEL,
// tools/env_options.h; tests run every level the machine has against the
// scalar reference). The library reads no environment variable.
#pragma once
#include <string>

namespace coli::cpu {

enum class CpuLevel { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

CpuLevel detected_level();          // what the CPU supports
CpuLevel active_level();            // what the kernels use now
void set_active_level(CpuLevel l);  // capped at detected_level()
const char* level_name(CpuLevel l);  // "scalar", "avx2", "avx512"

}  // namespace coli::cpu
