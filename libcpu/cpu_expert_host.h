// CpuExpertHost: the ExpertHost (libcore/engine/expert_host.h) of hybrid
// runs: the experts a device backend's tier does not hold, computed by a
// CPU backend of its own (SIMD kernels on all its threads, reading the
// weights from host memory: the container's mapping) while the device
// works. The model must outlive it; only the device backend's host thread
// calls compute().
//
// threads <= 0 takes every hardware thread but one: the device backend's
// own host thread spins while it waits for the device (CUDA's default
// scheduling), and one more thread than cores stalls the pool's jobs behind
// a preempted worker (measured on the GPU machine's 16 cores, 8-layer
// model at a 2 GiB budget: tg128 167 t/s with 16 threads, 430 with 15).
#pragma once
#include <algorithm>
#include <memory>
#include <thread>

#include "cpu_backend.h"
#include "engine/expert_host.h"
#include "model/weights.h"

namespace coli::cpu {

class CpuExpertHost : public ExpertHost {
 public:
  CpuExpertHost(const Model& model, int threads)
      : cpu_(model, CpuOptions{threads > 0 ? threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) - 1), true}),
        hidden_(model.spec().hidden_size) {}
  void compute(int layer, const ExpertPair* pairs, int n, const float* hn, int T, float* out) override {
    std::fill(out, out + static_cast<std::size_t>(T) * hidden_, 0.0f);
    if (n > 0) cpu_.routed_experts(layer, pairs, n, hn, out);
  }
  void hold(bool on) override { cpu_.hold_threads(on); }
  int num_threads() const { return cpu_.num_threads(); }

 private:
  CpuBackend cpu_;
  int hidden_;
};

}  // namespace coli::cpu
