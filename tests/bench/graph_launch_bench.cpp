// Host cost of launching a CUDA graph of N empty kernels, by node kind
// (libcuda/include/graph_probe.h): the counters are microseconds per launch
// (launch_us: inside cudaGraphLaunch; replay_us: launch to completion).
// Skipped with the reason when no device is usable.
#include <benchmark/benchmark.h>

#include "graph_probe.h"
#include "util/error.h"

namespace {

using coli::cuda::ProbeNodes;

void BM_GraphLaunch(benchmark::State& st) {
  const auto kind = static_cast<ProbeNodes>(st.range(0));
  const int nodes = static_cast<int>(st.range(1));
  coli::cuda::GraphLaunchCost c;
  try {
    for (auto _ : st) c = coli::cuda::measure_graph_launch(kind, nodes, 200);
  } catch (const coli::Error& e) {
    st.SkipWithError(e.what());
    return;
  }
  st.SetLabel(coli::cuda::probe_name(kind));
  st.counters["launch_us"] = c.launch_us;
  st.counters["replay_us"] = c.replay_us;
}

BENCHMARK(BM_GraphLaunch)
    ->ArgsProduct({{static_cast<int>(ProbeNodes::kPlain), static_cast<int>(ProbeNodes::kPdl), static_cast<int>(ProbeNodes::kCluster),
                    static_cast<int>(ProbeNodes::kBigParams), static_cast<int>(ProbeNodes::kEventNodes)},
                   {10, 100}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace
