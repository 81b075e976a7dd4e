// DeviceTwin: a device copy of a host region that other processes map
// through CUDA IPC. coli-pin start --gpu keeps one of a mirror's data
// region, so that a run on the same GPU reads its weights in place (no
// upload at its start) or copies them device to device (the expert tier's
// slots). Plain C++ header: callers need no CUDA headers. In a build
// without CUDA the constructor throws.
//
// Contract: the constructor allocates bytes on `device`, copies the host
// region there (staged through pinned memory) and exports the allocation;
// throws coli::Error naming what failed. The allocation lives as long as
// the object; processes that mapped it keep their mapping until they close
// it (CUDA IPC semantics), but the exporter must outlive their use of it.
#pragma once
#include <cstddef>
#include <cstdint>

namespace coli::cuda {

class DeviceTwin {
 public:
  DeviceTwin(const void* host, std::size_t bytes, int device);
  ~DeviceTwin();
  DeviceTwin(const DeviceTwin&) = delete;
  DeviceTwin& operator=(const DeviceTwin&) = delete;
  const uint8_t (&handle() const)[64] { return handle_; }
  int device() const { return device_; }
  double copy_ms() const { return copy_ms_; }

 private:
  void* dev_ = nullptr;
  int device_ = 0;
  uint8_t handle_[64] = {};
  double copy_ms_ = 0;
};

}  // namespace coli::cuda
