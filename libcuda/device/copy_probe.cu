#include "copy_probe.h"

#include <cuda_runtime.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "cuda_util.cuh"

namespace coli::cuda {

CopyRate measure_h2d(HostMemory kind, void* src, std::size_t bytes, int reps) {
  CopyRate r;
  void* dev = nullptr;
  check(cudaMalloc(&dev, bytes), "cudaMalloc (copy probe)");
  std::vector<uint8_t> pageable;
  void* pinned = nullptr;
  void* from = src;
  using clock = std::chrono::steady_clock;
  if (kind == HostMemory::kPageable) {
    pageable.assign(bytes, 1);
    from = pageable.data();
  } else if (kind == HostMemory::kPinned) {
    check(cudaMallocHost(&pinned, bytes), "cudaMallocHost (copy probe)");
    std::memset(pinned, 1, bytes);
    from = pinned;
  } else {
    const auto t0 = clock::now();
    check(cudaHostRegister(src, bytes, cudaHostRegisterDefault), "cudaHostRegister (copy probe)");
    r.register_ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
  }
  for (int i = 0; i < reps; ++i) {
    const auto t0 = clock::now();
    check(cudaMemcpy(dev, from, bytes, cudaMemcpyHostToDevice), "copy probe");
    const double s = std::chrono::duration<double>(clock::now() - t0).count();
    r.gb_per_s = std::max(r.gb_per_s, bytes / s / 1e9);
  }
  if (kind == HostMemory::kRegistered) cudaHostUnregister(src);
  if (pinned) cudaFreeHost(pinned);
  cudaFree(dev);
  return r;
}

}  // namespace coli::cuda
