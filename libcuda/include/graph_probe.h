// What launching a CUDA graph costs the host, by the kinds of node a graph
// holds: a decode step's graph waits for cudaGraphLaunch to return before
// the device starts, so this cost adds to every token (COLI_CUDA_PROFILE=
// graph shows ~36 us for coli's ~95-node decode graph on the H200). The
// probe captures `nodes` empty kernels of one kind into a graph and times
// its launches. Plain C++ header.
#pragma once
#include <string>

namespace coli::cuda {

enum class ProbeNodes {
  kPlain,       // <<<1, 32>>>, no attributes
  kPdl,         // Programmatic Dependent Launch allowed (cudaLaunchKernelEx)
  kCluster,     // 2-block thread block clusters (sm_90)
  kBigParams,   // a 512-byte kernel parameter
  kEventNodes,  // plain kernels and, every 16, an external event record node
};

const char* probe_name(ProbeNodes k);

struct GraphLaunchCost {
  double launch_us = 0;  // host time in cudaGraphLaunch, mean
  double replay_us = 0;  // launch to completion (stream synchronize), mean
};

// Throws coli::Error when no device is usable or the kind needs a newer one.
GraphLaunchCost measure_graph_launch(ProbeNodes kind, int nodes, int launches);

}  // namespace coli::cuda
