// ExpertHost: routed experts computed on the host for a device backend
// whose expert tier does not hold them (hybrid decode: the GPU computes the
// shared expert and the resident experts while the host computes the rest).
//
// Declared in libcore so that libcuda can call it without knowing who
// implements it; libcpu implements it over the CPU backend's expert kernels
// (cpu::CpuExpertHost) and the tools wire the two together. libcpu and
// libcuda never include each other.
//
// Contract: compute() writes out[t, :] = sum of p.weight * SwiGLU_expert(hn[t])
// over the pairs p of token t, in pair order, for every t < T (rows of
// tokens without pairs become 0). hn and out are [T, hidden] host arrays
// (the device backend's pinned, mapped buffers). One caller at a time: the
// device backend's host thread, while the device works; the implementation
// may use all of its own threads inside the call.
#pragma once
#include "engine/backend.h"

namespace coli {

class ExpertHost {
 public:
  virtual ~ExpertHost() = default;
  virtual void compute(int layer, const ExpertPair* pairs, int n, const float* hn, int T, float* out) = 0;
  // hold(true) .. hold(false) brackets a chunk (the same caller): compute()
  // calls come every few tens of microseconds, so the implementation may
  // keep its threads spinning in between instead of letting them sleep.
  virtual void hold(bool on) { (void)on; }
};

}  // namespace coli
