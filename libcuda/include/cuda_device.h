// The CUDA side as the rest of the toolkit sees it: whether this build has
// CUDA, whether a device is usable, and (for tests) small kernels checked
// against the CPU reference. Plain C++ header: callers need no CUDA headers.
// In a build without CUDA every function reports "no device".
#pragma once
#include <cstddef>
#include <memory>
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

// Host memory pinned (registered with the device) for as long as a copy
// of this object lives, through the process's registry that the backends
// share: a backend given the same range later takes a reference on the
// registration, not a second one. A tool pins before it builds a backend
// to learn whether the driver pins the range at all (it refuses beyond
// the memory the process may lock: RLIMIT_MEMLOCK, a cgroup's limit) and
// choose the paths that need pinned memory only when it does. read_only:
// a PROT_READ mapping (a container file's), registered read-only for the
// device. Without a device, or refused: bytes() is 0 and nothing is held.
class HostPin {
 public:
  HostPin() = default;
  HostPin(const void* p, std::size_t n, bool read_only);
  // Of the n bytes asked, those pinned (the registry's 256 GiB pieces the
  // driver took).
  std::size_t bytes() const { return bytes_; }

 private:
  std::shared_ptr<void> lease_;
  std::size_t bytes_ = 0;
};

// Test seam: while on, every new registration of host memory fails as the
// driver's does beyond the process's lockable memory (ranges registered
// already stay). Off at the start.
void refuse_host_registrations(bool on);

// y[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * (1 + w) on device 0,
// host pointers in and out. Throws coli::Error if no device is usable.
void rms_norm_1p_rows(const float* x, const float* w, int rows, int n, float eps, float* y);

}  // namespace coli::cuda
