// Host-to-device copy rate by the kind of host memory the bytes are in:
// pageable (the driver stages them), pinned (cudaMallocHost), or memory
// the caller owns registered for the measurement (cudaHostRegister: a
// coli-pin mirror's mapping). The roofline of every upload. Plain C++ header.
#pragma once
#include <cstddef>

namespace coli::cuda {

enum class HostMemory { kPageable, kPinned, kRegistered };

struct CopyRate {
  double gb_per_s = 0;      // best of the repetitions
  double register_ms = 0;   // kRegistered: cudaHostRegister of the bytes
};

// Copies `bytes` to one device buffer `reps` times. kPageable and kPinned
// allocate (and fill) their own source; kRegistered copies from src, which
// must be writable mapped memory of at least `bytes`. Throws coli::Error
// when no device is usable or the driver refuses.
CopyRate measure_h2d(HostMemory kind, void* src, std::size_t bytes, int reps);

}  // namespace coli::cuda
