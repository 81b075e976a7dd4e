// Hybrid prefill's uploads (CudaOptions::prefill_upload; expert_tier.cuh:
// PrefillUpload). A prompt chunk's experts outside the tier come to the
// device a whole layer at a time, one layer ahead, into two alternating
// staging areas, and run with the residents as one grouped GEMM.
#include <algorithm>
#include <thread>
#include <cstdint>
#include <vector>

#include "expert_tier.cuh"
#include "prefill_stager.cuh"

namespace coli::cuda::detail {

// Staging slots per area (the VRAM ledger's prefill_stage_slots): without
// a ring the most experts a layer leaves out, plus one per swap in flight
// (a swap evicts its victim before the candidate's copy lands, and swaps
// stay within a layer: SwapPolicyOptions::within_layer); with one at most
// kPrefillRingSlots, a layer then coming in groups.
void ExpertTier::init_prefill_upload(int stage_slots, bool ring) {
  const int L = s_.num_layers, E = s_.num_experts;
  const int most = stage_slots;
  pu_.stage_slots = most, pu_.ring = ring;
  {
    BudgetScope scope(budget_, "the prefill staging areas");
    pu_.stage.resize(2 * static_cast<std::size_t>(most) * slot_bytes_);
  }
  {
    BudgetScope scope(budget_, "the prefill expert tables");
    pu_.gate.resize(L), pu_.up.resize(L), pu_.down.resize(L);
    for (int l = 0; l < L; ++l) pu_.gate[l].resize(E + 1), pu_.up[l].resize(E + 1), pu_.down[l].resize(E + 1);
  }
  check(cudaStreamCreateWithFlags(&pu_.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  // Pageable sources go through the stager's pinned ring on host threads of
  // its own (the host computes no experts while a chunk uploads); registered
  // ones straight.
  std::vector<std::pair<const void*, std::size_t>> pinned;
  for (auto [p, n] : pinned_) pinned.push_back({p, n});
  const int threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()) - 1, 1, 8);
  pu_.stager = std::make_unique<PrefillStager>(opt_.device, pu_.stream, threads, std::size_t(8) << 20, std::move(pinned));
  for (int b = 0; b < 2; ++b) {
    check(cudaEventCreateWithFlags(&pu_.uploaded[b], cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventCreateWithFlags(&pu_.used[b], cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventRecord(pu_.used[b], stream_), "event");  // nothing uses an area yet
    check(cudaEventRecord(pu_.uploaded[b], pu_.stream), "event");
  }
  pu_.on = true;
}

void ExpertTier::free_prefill_upload() {
  pu_.stager.reset();
  for (auto [a, z] : pu_.wait_ev) cudaEventDestroy(a), cudaEventDestroy(z);
  pu_.wait_ev.clear();
  if (pu_.stream) cudaStreamSynchronize(pu_.stream), cudaStreamDestroy(pu_.stream), pu_.stream = nullptr;
  for (int b = 0; b < 2; ++b) {
    if (pu_.uploaded[b]) cudaEventDestroy(pu_.uploaded[b]), pu_.uploaded[b] = nullptr;
    if (pu_.used[b]) cudaEventDestroy(pu_.used[b]), pu_.used[b] = nullptr;
  }
}

void ExpertTier::refresh_prefill_tables() {
  if (pu_.residency_gen == residency_gen_) return;
  // Kernels of an earlier chunk may still read the tables.
  check(cudaStreamSynchronize(stream_), "prefill expert tables");
  const int L = s_.num_layers, E = s_.num_experts, A = pu_.stage_slots;
  std::vector<const uint8_t*> g(E + 1), u(E + 1), d(E + 1);
  pu_.units.clear();
  pu_.first_unit.assign(L, -1), pu_.unit_count.assign(L, 0);
  for (int l = 0; l < L; ++l) {
    if (layer_full_[l]) continue;
    const int missing = E - plan_.resident_in_layer(l);
    if (!pu_.ring && missing > A) continue;  // its misses go to the host, as in a decode step
    // Units: ranges of expert ids, each holding at most A non-residents
    // (without a ring one unit, the whole layer).
    pu_.first_unit[l] = static_cast<int>(pu_.units.size());
    int e0 = 0, rank = 0;
    for (int e = 0; e < E; ++e) {
      const long long slot = slot_of_[static_cast<std::size_t>(l) * E + e];
      const bool res = plan_.is_resident(l, e) && slot >= 0;
      if (!res && rank == A) pu_.units.push_back({l, e0, e}), e0 = e, rank = 0;
      const int area = static_cast<int>(pu_.units.size()) % 2;
      const uint8_t* base = res ? slot_address(slot) : pu_.stage.get() + (static_cast<std::size_t>(area) * A + rank) * slot_bytes_;
      rank += !res;
      g[e] = base, u[e] = base + slot_up_, d[e] = base + slot_down_;
    }
    pu_.units.push_back({l, e0, E});
    pu_.unit_count[l] = static_cast<int>(pu_.units.size()) - pu_.first_unit[l];
    g[E] = shared_[l][0], u[E] = shared_[l][1], d[E] = shared_[l][2];
    check(cudaMemcpy(pu_.gate[l].get(), g.data(), (E + 1) * sizeof(void*), cudaMemcpyHostToDevice), "prefill expert table");
    check(cudaMemcpy(pu_.up[l].get(), u.data(), (E + 1) * sizeof(void*), cudaMemcpyHostToDevice), "prefill expert table");
    check(cudaMemcpy(pu_.down[l].get(), d.data(), (E + 1) * sizeof(void*), cudaMemcpyHostToDevice), "prefill expert table");
  }
  pu_.residency_gen = residency_gen_;
}

void ExpertTier::upload_unit(int u) {
  const PrefillUpload::Unit& unit = pu_.units[static_cast<std::size_t>(u)];
  const int l = unit.layer, b = u % 2;
  uint8_t* area = pu_.stage.get() + static_cast<std::size_t>(b) * pu_.stage_slots * slot_bytes_;
  // One copy per contiguous run: an expert's gate, up and down are one
  // blob in the container and the mirror, and a slot keeps their layout
  // when their sizes are 256-byte multiples. A copy costs the copy engine
  // a few microseconds of its own, so a few large ones beat many small.
  std::vector<PrefillStager::Copy> pieces;
  auto add = [&](uint8_t* dst, const uint8_t* src, std::size_t n) {
    if (!pieces.empty() && pieces.back().dst + pieces.back().n == dst && pieces.back().src + pieces.back().n == src) pieces.back().n += n;
    else pieces.push_back({dst, src, n});
  };
  int rank = 0;
  for (int e = unit.e0; e < unit.e1; ++e) {
    if (plan_.is_resident(l, e)) continue;
    const ExpertWeights& x = model_.layer(l).moe.experts[e];
    uint8_t* dst = area + static_cast<std::size_t>(rank++) * slot_bytes_;
    add(dst, x.gate.data, x.gate.bytes());
    add(dst + slot_up_, x.up.data, x.up.bytes());
    add(dst + slot_down_, x.down.data, x.down.bytes());
    pu_.bytes += expert_bytes_, ++pu_.experts;
  }
  pu_.copies += static_cast<long long>(pieces.size());
  // After every kernel that read this area for the unit two before; then
  // the area's event, which the unit's experts wait for.
  pu_.ticket[b] = pu_.stager->post(std::move(pieces), pu_.used[b], pu_.uploaded[b]);
}

}  // namespace coli::cuda::detail
