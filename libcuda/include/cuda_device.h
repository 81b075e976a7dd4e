// The CUDA side as the rest of the toolkit sees it: whether this build has
// CUDA, whether a device is usable, and (for tests) small kernels checked
// against the CPU reference. Plain C++ header: callers need no CUDA headers.
// In a build without CUDA every function reports "no device".
#pragma once
#include <cstddef>
#include <string>

namespace coli::cuda {

// True when the library was compiled with nvcc.
bool compiled_with_cuda();

// Number of usable CUDA devices; when 0, *why (if given) says why, e.g.
// "built without CUDA" or the driver's error string.
int device_count(std::string* why = nullptr);

// Creates device i's primary context when a device is usable, and does
// nothing otherwise (never throws). The context costs 0.1-0.25 s on the
// H200 machine: a tool calls this on a thread of its own at its start, so
// that the cost overlaps reading the model instead of delaying the first
// token. Thread-safe (the runtime's context creation is).
void prepare_device(int i = 0);

// "NVIDIA H200, sm_90, 132 SMs, 139.8 GiB" for device i.
std::string describe_device(int i);

// Bytes free on the current device after the work queued on it finishes
// (cudaDeviceSynchronize, then cudaMemGetInfo): what tests and benchmarks
// hold a --vram-budget against. 0 without a device.
std::size_t device_free_bytes();
// The current device's memory in bytes (cudaMemGetInfo's total). 0 without a device.
std::size_t device_total_bytes();

// Device memory held for as long as the object lives: a test's or a
// benchmark's stand-in for another process using the card. Throws
// coli::Error when the allocation fails (or no device is usable).
class DeviceMemoryHold {
 public:
  explicit DeviceMemoryHold(std::size_t bytes);
  ~DeviceMemoryHold();
  DeviceMemoryHold(const DeviceMemoryHold&) = delete;
  DeviceMemoryHold& operator=(const DeviceMemoryHold&) = delete;

 private:
  void* p_ = nullptr;
};

// Host ranges this process holds registered with the device (pinned) on
// the backends' behalf: each range once, however many backends use it, and
// none once the last of them is gone. 0 without a device.
std::size_t registered_host_ranges();

// y[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * (1 + w) on device 0,
// host pointers in and out. Throws coli::Error if no device is usable.
void rms_norm_1p_rows(const float* x, const float* w, int rows, int n, float eps, float* y);

}  // namespace coli::cuda
