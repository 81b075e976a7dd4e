#include <cuda_runtime.h>

#include <dlfcn.h>

#include <cstdio>
#include <vector>

#include "cuda_device.h"
#include "util/error.h"

namespace coli::cuda {

namespace {
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
}

// One block per row; shared-memory tree reduction of the sum of squares.
__global__ void rms_norm_1p_kernel(const float* x, const float* w, int n, float eps, float* y) {
  extern __shared__ float partial[];
  const float* xr = x + static_cast<size_t>(blockIdx.x) * n;
  float* yr = y + static_cast<size_t>(blockIdx.x) * n;
  float ss = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  partial[threadIdx.x] = ss;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  const float r = rsqrtf(partial[0] / n + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * r * (1.0f + w[i]);
}
}  // namespace

bool compiled_with_cuda() { return true; }

int device_count(std::string* why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    // Without libcuda the runtime reports an "insufficient driver": say what is really missing.
    const bool has_driver = e != cudaErrorInsufficientDriver || dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD) ||
                            dlopen("libcuda.so.1", RTLD_LAZY);
    if (why) *why = has_driver ? cudaGetErrorString(e) : "no NVIDIA driver (libcuda.so.1) on this machine";
    cudaGetLastError();  // clear the sticky error
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device present";
  return n;
}

void prepare_device(int i) {
  if (device_count() <= i) return;
  if (cudaSetDevice(i) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) cudaGetLastError();
}

std::string describe_device(int i) {
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, i), "cudaGetDeviceProperties");
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s, sm_%d%d, %d SMs, %.1f GiB", p.name, p.major, p.minor, p.multiProcessorCount,
                p.totalGlobalMem / double(1ull << 30));
  return buf;
}

std::size_t device_free_bytes() {
  std::size_t free_b = 0, total_b = 0;
  if (cudaDeviceSynchronize() != cudaSuccess || cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return 0;
  return free_b;
}

std::size_t device_total_bytes() {
  std::size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return total_b;
}

DeviceMemoryHold::DeviceMemoryHold(std::size_t bytes) {
  std::string why;
  if (device_count(&why) == 0) throw Error("CUDA: no usable device: " + why);
  check(cudaMalloc(&p_, bytes), ("cudaMalloc of " + std::to_string(bytes >> 20) + " MiB held").c_str());
}

DeviceMemoryHold::~DeviceMemoryHold() {
  if (p_) cudaFree(p_);
}

void rms_norm_1p_rows(const float* x, const float* w, int rows, int n, float eps, float* y) {
  std::string why;
  if (device_count(&why) == 0) throw Error("CUDA: no usable device: " + why);
  float *dx = nullptr, *dw = nullptr, *dy = nullptr;
  const size_t bytes = size_t(rows) * n * sizeof(float);
  check(cudaMalloc(&dx, bytes), "cudaMalloc");
  check(cudaMalloc(&dw, n * sizeof(float)), "cudaMalloc");
  check(cudaMalloc(&dy, bytes), "cudaMalloc");
  check(cudaMemcpy(dx, x, bytes, cudaMemcpyHostToDevice), "copy x");
  check(cudaMemcpy(dw, w, n * sizeof(float), cudaMemcpyHostToDevice), "copy w");
  const int threads = 256;
  rms_norm_1p_kernel<<<rows, threads, threads * sizeof(float)>>>(dx, dw, n, eps, dy);
  check(cudaGetLastError(), "rms_norm_1p_kernel launch");
  check(cudaMemcpy(y, dy, bytes, cudaMemcpyDeviceToHost), "copy y");
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dy);
}

}  // namespace coli::cuda
