// Error checks and an owning device allocation for the CUDA sources.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "placement/device_budget.h"
#include "util/error.h"

namespace coli::cuda {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
}

// Whether the bytes [src, src + n) lie inside [base, base + len): where a
// copy's source is (a registered range, the device twin's host side).
inline bool within(const void* base, std::size_t len, const void* src, std::size_t n) {
  const auto b = reinterpret_cast<std::uintptr_t>(base), s = reinterpret_cast<std::uintptr_t>(src);
  return s >= b && s - b <= len && n <= len - (s - b);
}
// The same for any of (base, len) ranges (each registered on its own: a
// copy that spans two is refused by the driver, so it is in neither).
template <class Ranges>
bool within_any(const Ranges& ranges, const void* src, std::size_t n) {
  for (const auto& [base, len] : ranges)
    if (within(base, len, src, n)) return true;
  return false;
}

// The current device's compute capability major (0 when it cannot be
// read), asked once: which kernels exist there (mma sm_80, PDL and
// clusters sm_90).
inline int device_cc_major() {
  static const int major = [] {
    int dev = 0, m = 0;
    return cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetAttribute(&m, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess ? m : 0;
  }();
  return major;
}

// Programmatic Dependent Launch (sm_90+): every kernel is launched allowed
// to start while the previous kernel in the stream is finishing (its
// launch and block scheduling overlap that kernel's tail); every kernel
// therefore begins with griddep_wait(), which returns once the previous
// kernel has completed and its writes are visible, and then lets the next
// kernel launch. CudaOptions::pdl = false turns it off.
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Whether launches now ask for PDL: the backend turns it on for decode
// steps (latency-bound chains of small kernels; unless CudaOptions::pdl is
// false) and off for prefill, where early-launched blocks would only take
// SM slots from the running kernel.
inline bool& pdl_wanted() {
  static bool on = true;
  return on;
}

inline bool pdl_enabled() {
  return device_cc_major() >= 9 && pdl_wanted();
}

// kernel<<<grid, block, smem, s>>>(args...) with PDL allowed (see above).
template <typename... KArgs, typename... Args>
void launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t s, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr, cfg.numAttrs = pdl_enabled() ? 1 : 0;
  check(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), "kernel launch");
}

// The same for a grid of thread block clusters of cluster_x blocks along x
// (sm_90; the caller checks device_cc_major() >= 9).
template <typename... KArgs, typename... Args>
void launch_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t s, int cluster_x, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = s;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster_x, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr, cfg.numAttrs = pdl_enabled() ? 2 : 1;
  check(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), "kernel launch");
}

// The ledger device allocations on this thread are charged to, and what
// they are for (named when one does not fit): set by a BudgetScope around a
// backend's work. Without a scope nothing is charged.
struct BudgetTarget {
  DeviceBudget* budget = nullptr;
  const char* what = "device memory";
};
inline BudgetTarget& budget_target() {
  thread_local BudgetTarget t;
  return t;
}
class BudgetScope {
 public:
  BudgetScope(DeviceBudget* b, const char* what) : saved_(budget_target()) { budget_target() = {b, what}; }
  ~BudgetScope() { budget_target() = saved_; }
  BudgetScope(const BudgetScope&) = delete;
  BudgetScope& operator=(const BudgetScope&) = delete;

 private:
  BudgetTarget saved_;
};

// cudaMalloc charged to the current BudgetTarget (nothing allocated when the
// charge throws); *charged_to says whom to credit at cudaFree.
inline void* budgeted_malloc(std::size_t bytes, DeviceBudget** charged_to) {
  const BudgetTarget t = budget_target();
  if (t.budget) t.budget->charge(t.what, bytes);
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    if (t.budget) t.budget->credit(bytes);
    check(e, (std::string("cudaMalloc of ") + format_bytes(bytes) + " for " + t.what).c_str());
  }
  *charged_to = t.budget;
  return p;
}

// A typed window into memory another object owns (a DeviceArray carved
// into buffers): no allocation, no charge; valid while the owner keeps it.
template <class T>
class DeviceView {
 public:
  void set(T* p, std::size_t n) { p_ = p, n_ = n; }
  T* get() const { return p_; }
  std::size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

// A device array of n T; moves, frees on destruction. Its bytes are charged
// to the BudgetTarget current when it was sized.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(std::size_t n) { resize(n); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept : p_(o.p_), n_(o.n_), budget_(o.budget_) { o.p_ = nullptr, o.n_ = 0, o.budget_ = nullptr; }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) {
      release();
      p_ = o.p_, n_ = o.n_, budget_ = o.budget_;
      o.p_ = nullptr, o.n_ = 0, o.budget_ = nullptr;
    }
    return *this;
  }
  ~DeviceArray() { release(); }
  // Reallocates (contents lost) when n differs.
  void resize(std::size_t n) {
    if (n == n_) return;
    release();
    if (n) p_ = static_cast<T*>(budgeted_malloc(n * sizeof(T), &budget_));
    n_ = n;
  }
  T* get() const { return p_; }
  std::size_t size() const { return n_; }

 private:
  void release() {
    if (p_) {
      cudaFree(p_);
      if (budget_) budget_->credit(n_ * sizeof(T));
    }
    p_ = nullptr, n_ = 0, budget_ = nullptr;
  }
  T* p_ = nullptr;
  std::size_t n_ = 0;
  DeviceBudget* budget_ = nullptr;
};

}  // namespace coli::cuda
