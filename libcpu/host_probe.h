// Host-side rates for the planner (coli-place probe): how fast this
// machine reads memory, and how fast the CPU's expert kernels compute a
// decode step's routed experts from host memory (the CPU part of a hybrid
// layer). Measured, not assumed: the planner's predictions are only as
// good as these.
//
// Contract: each function runs for about `seconds` (at least one
// repetition), uses `threads` threads (<= 0: every hardware thread but
// one, as CpuExpertHost does) and returns the best repetition's rate in
// GB/s (1e9 bytes). The model must stay alive for the call.
#pragma once
#include "model/weights.h"

namespace coli::cpu {

// Sums a buffer of `bytes` (allocated and filled here) on all threads.
double measure_read_gbs(std::size_t bytes, int threads, double seconds);

// One token's k routed experts per layer, random experts (fixed seed),
// through CpuExpertHost: expert bytes read per second, the median pass
// (one pass: every layer once).
double measure_expert_gbs(const Model& model, int threads, double seconds);

}  // namespace coli::cpu
