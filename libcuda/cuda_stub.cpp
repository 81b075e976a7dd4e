// Built instead of the .cu files when the toolkit is built without CUDA.
#include "cuda_backend.h"
#include "cuda_device.h"
#include "device_twin.h"
#include "copy_probe.h"
#include "graph_probe.h"
#include "util/error.h"

namespace coli::cuda {

bool compiled_with_cuda() { return false; }

void prepare_device(int) {}

DeviceTwin::DeviceTwin(const void*, std::size_t, int) { throw Error("device twin: built without CUDA"); }
DeviceTwin::~DeviceTwin() = default;

int device_count(std::string* why) {
  if (why) *why = "built without CUDA";
  return 0;
}

std::string describe_device(int) { return "none (built without CUDA)"; }

std::size_t device_free_bytes() { return 0; }

std::size_t device_total_bytes() { return 0; }

DeviceMemoryHold::DeviceMemoryHold(std::size_t) { throw Error("CUDA: no usable device: built without CUDA"); }
DeviceMemoryHold::~DeviceMemoryHold() = default;

std::size_t registered_host_ranges() { return 0; }

HostPin::HostPin(const void*, std::size_t, bool) {}

void refuse_host_registrations(bool) {}

void rms_norm_1p_rows(const float*, const float*, int, int, float, float*) {
  throw Error("CUDA: no usable device: built without CUDA");
}

std::vector<int> device_greedy_ids(const float*, int, int) { throw Error("CUDA: no usable device: built without CUDA"); }

std::unique_ptr<Backend> make_cuda_backend(const Model&, const CudaOptions&) {
  throw Error("CUDA backend: no usable device: built without CUDA");
}

const char* probe_name(ProbeNodes) { return "none"; }

GraphLaunchCost measure_graph_launch(ProbeNodes, int, int) { throw Error("CUDA: no usable device for the graph probe: built without CUDA"); }

CopyRate measure_h2d(HostMemory, void*, std::size_t, int) { throw Error("CUDA: no usable device for the copy probe: built without CUDA"); }

}  // namespace coli::cuda
