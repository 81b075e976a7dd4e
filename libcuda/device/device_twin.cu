#include "device_twin.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "cuda_util.cuh"
#include "staged_upload.cuh"
#include "util/error.h"

namespace coli::cuda {

static_assert(sizeof(cudaIpcMemHandle_t) == 64, "the mirror header keeps 64 bytes for the handle");

DeviceTwin::DeviceTwin(const void* host, std::size_t bytes, int device) : device_(device) {
  const auto t0 = std::chrono::steady_clock::now();
  check(cudaSetDevice(device), "cudaSetDevice (device twin)");
  check(cudaMalloc(&dev_, std::max<std::size_t>(bytes, 1)), ("cudaMalloc of the device twin (" + std::to_string(bytes >> 20) + " MiB)").c_str());
  try {
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    try {
      const int threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()) - 1, 1, 8);
      detail::StagedUploader up(threads, std::size_t(16) << 20);
      up.add(dev_, host, bytes);
      up.flush(s);
    } catch (...) {
      cudaStreamDestroy(s);
      throw;
    }
    cudaStreamDestroy(s);
    cudaIpcMemHandle_t h;
    check(cudaIpcGetMemHandle(&h, dev_), "cudaIpcGetMemHandle (device twin)");
    std::memcpy(handle_, &h, sizeof h);
  } catch (...) {
    cudaFree(dev_);
    throw;
  }
  copy_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

DeviceTwin::~DeviceTwin() {
  if (dev_) cudaFree(dev_);
}

}  // namespace coli::cuda
