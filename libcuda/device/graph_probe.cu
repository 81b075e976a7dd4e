// Graph launch cost by node kind (graph_probe.h).
#include "graph_probe.h"

#include <chrono>

#include "cuda_util.cuh"

namespace coli::cuda {

namespace {

struct Big {
  int v[128];
};

__global__ void probe_kernel(int* sink) {
  if (sink && threadIdx.x == 1024) *sink = 0;  // never: keeps the kernel
}

__global__ void probe_big_kernel(Big b, int* sink) {
  if (sink && threadIdx.x == 1024) *sink = b.v[0];
}

void launch_with(cudaStream_t s, cudaLaunchAttribute* attr, int n_attr, dim3 grid) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid, cfg.blockDim = dim3(32), cfg.stream = s;
  cfg.attrs = attr, cfg.numAttrs = n_attr;
  int* sink = nullptr;
  check(cudaLaunchKernelEx(&cfg, probe_kernel, sink), "probe launch");
}

}  // namespace

const char* probe_name(ProbeNodes k) {
  switch (k) {
    case ProbeNodes::kPlain: return "plain";
    case ProbeNodes::kPdl: return "pdl";
    case ProbeNodes::kCluster: return "cluster";
    case ProbeNodes::kBigParams: return "big-params";
    case ProbeNodes::kEventNodes: return "event-nodes";
  }
  return "?";
}

GraphLaunchCost measure_graph_launch(ProbeNodes kind, int nodes, int launches) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) throw Error("CUDA: no usable device for the graph probe");
  if ((kind == ProbeNodes::kCluster || kind == ProbeNodes::kPdl) && device_cc_major() < 9)
    throw Error(std::string("CUDA: the graph probe's ") + probe_name(kind) + " nodes need sm_90");
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaEvent_t ev;
  check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
  cudaGraph_t g;
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "begin capture");
  for (int i = 0; i < nodes; ++i) {
    cudaLaunchAttribute attr[1];
    switch (kind) {
      case ProbeNodes::kPlain:
      case ProbeNodes::kEventNodes:
        probe_kernel<<<1, 32, 0, s>>>(nullptr);
        if (kind == ProbeNodes::kEventNodes && i % 16 == 15) check(cudaEventRecordWithFlags(ev, s, cudaEventRecordExternal), "event record");
        break;
      case ProbeNodes::kPdl:
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        launch_with(s, attr, 1, dim3(1));
        break;
      case ProbeNodes::kCluster:
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = 2, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
        launch_with(s, attr, 1, dim3(2));
        break;
      case ProbeNodes::kBigParams:
        probe_big_kernel<<<1, 32, 0, s>>>(Big{}, nullptr);
        break;
    }
  }
  check(cudaStreamEndCapture(s, &g), "end capture");
  cudaGraphExec_t exec;
  check(cudaGraphInstantiate(&exec, g, 0), "graph instantiate");
  cudaGraphDestroy(g);
  check(cudaGraphLaunch(exec, s), "graph launch");  // upload, warm
  check(cudaStreamSynchronize(s), "probe sync");
  using clock = std::chrono::steady_clock;
  double launch = 0, replay = 0;
  for (int i = 0; i < launches; ++i) {
    const auto t0 = clock::now();
    check(cudaGraphLaunch(exec, s), "graph launch");
    const auto t1 = clock::now();
    check(cudaStreamSynchronize(s), "probe sync");
    const auto t2 = clock::now();
    launch += std::chrono::duration<double, std::micro>(t1 - t0).count();
    replay += std::chrono::duration<double, std::micro>(t2 - t0).count();
  }
  cudaGraphExecDestroy(exec);
  cudaEventDestroy(ev);
  cudaStreamDestroy(s);
  return {launch / launches, replay / launches};
}

}  // namespace coli::cuda
