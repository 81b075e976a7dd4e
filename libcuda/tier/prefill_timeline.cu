// Hybrid prefill's timeline (CudaProfile::kPrefill, COLI_CUDA_PROFILE=
// prefill): for each staging unit of a prompt chunk, when its copies ran
// on the upload stream and when the compute stream waited for them and
// finished its kernels, printed on stderr once the chunk has drained. It
// answers where a chunk's time goes when it runs slower than its uploads
// at the PCIe rate: copies waiting for an area (the kernels two units
// back), or the GPU waiting for copies, or neither (the host).
#include <algorithm>
#include <cstdio>

#include "expert_tier.cuh"

namespace coli::cuda::detail {

void ExpertTier::timeline_start(int T) {
  const std::size_t n = pu_.units.size();
  auto make = [](cudaEvent_t* e) {
    if (!*e) check(cudaEventCreate(e), "cudaEventCreate");
  };
  make(&pu_.t0);
  if (pu_.times.size() < n) pu_.times.resize(n);
  for (auto& t : pu_.times) make(&t.up0), make(&t.up1), make(&t.wait0), make(&t.wait1), make(&t.done);
  check(cudaEventRecord(pu_.t0, stream_), "event");
  pu_.timed_chunk = true, pu_.timed_tokens = T;
}

void ExpertTier::timeline_record(cudaEvent_t PrefillUpload::UnitTimes::*which, int u, cudaStream_t s) {
  if (u < 0 || static_cast<std::size_t>(u) >= pu_.times.size()) return;
  check(cudaEventRecord(pu_.times[u].*which, s), "event");
}

void ExpertTier::timeline_print() {
  pu_.timed_chunk = false;
  ++pu_.chunks_timed;
  // Each event was recorded in this chunk, on a stream that has drained
  // (end_chunk); one left unrecorded prints as -1.
  auto at = [&](cudaEvent_t e) {
    float ms = -1;
    if (cudaEventElapsedTime(&ms, pu_.t0, e) != cudaSuccess) cudaGetLastError(), ms = -1;
    return ms;
  };
  const std::size_t n = std::min(pu_.units.size(), pu_.times.size());
  std::fprintf(stderr, "coli prefill timeline: chunk %d, %d tokens, %zu units (ms from the chunk's start)\n", pu_.chunks_timed, pu_.timed_tokens, n);
  std::fprintf(stderr, "%5s %5s %9s %7s %8s %8s %8s %8s %8s\n", "unit", "layer", "experts", "copied", "up0", "up1", "wait0", "wait1", "done");
  double busy = 0, waited = 0, first = 1e30, last = 0, end = 0;
  for (std::size_t u = 0; u < n; ++u) {
    const PrefillUpload::Unit& un = pu_.units[u];
    int copied = 0;
    const uint8_t* on_cpu = pu_.on_cpu.data() + static_cast<std::size_t>(un.layer) * s_.num_experts;
    for (int e = un.e0; e < un.e1; ++e) copied += !plan_.is_resident(un.layer, e) && !on_cpu[e];
    const PrefillUpload::UnitTimes& t = pu_.times[u];
    const float up0 = at(t.up0), up1 = at(t.up1), w0 = at(t.wait0), w1 = at(t.wait1), done = at(t.done);
    std::fprintf(stderr, "%5zu %5d %4d-%-4d %7d %8.3f %8.3f %8.3f %8.3f %8.3f\n", u, un.layer, un.e0, un.e1, copied, up0, up1, w0, w1, done);
    if (up0 >= 0 && up1 >= 0) busy += up1 - up0, first = std::min<double>(first, up0), last = std::max<double>(last, up1);
    if (w0 >= 0 && w1 >= 0) waited += w1 - w0;
    end = std::max<double>(end, done);
  }
  if (last > first)
    std::fprintf(stderr, "copies busy %.3f ms of %.3f from the first copy to the last (%.0f %%); GPU waited %.3f ms; last unit done at %.3f ms\n", busy,
                 last - first, 100.0 * busy / (last - first), waited, end);
}

void ExpertTier::timeline_free() {
  for (auto& t : pu_.times)
    for (cudaEvent_t e : {t.up0, t.up1, t.wait0, t.wait1, t.done})
      if (e) cudaEventDestroy(e);
  pu_.times.clear();
  if (pu_.t0) cudaEventDestroy(pu_.t0), pu_.t0 = nullptr;
}

}  // namespace coli::cuda::detail
