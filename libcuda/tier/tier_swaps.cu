// The expert tier's background swaps (expert_tier.cuh: SwapJob). Placement
// changes speed, never results: a swapped expert is computed by the host
// until the step after its slot holds it, then by the device.
#include <algorithm>
#include <cstring>

#include "expert_tier.cuh"

namespace coli::cuda::detail {

namespace {

// Blobs staged per step: the main thread copies them while it would wait
// for the device (about 0.25 ms each at the int4 model's 1.77 MB per expert,
// inside a hybrid step of 1-2 ms).
constexpr int kStagedPerStep = 2;

__global__ void set_entry_kernel(const uint8_t** gate, const uint8_t** up, const uint8_t** down, uint8_t* flags, int e, const uint8_t* g,
                                 const uint8_t* u, const uint8_t* d, uint8_t flag) {
  gate[e] = g, up[e] = u, down[e] = d, flags[e] = flag;
}

}  // namespace

void ExpertTier::init_swaps() {
  const int L = s_.num_layers, E = s_.num_experts;
  if (opt_.swap_window < 1) throw Error("CUDA backend: swap_window must be at least 1 token");
  SwapPolicyOptions po = opt_.swap_policy;
  po.max_swaps = std::min(po.max_swaps, kSwapsInFlight);
  if (pu_.on) po.within_layer = true;  // the staging areas are sized for each layer's count of non-residents
  swap_policy_ = std::make_unique<SwapPolicy>(L, E, po);
  swap_busy_.assign(static_cast<std::size_t>(L) * E, 0);
  heat_host_.assign(static_cast<std::size_t>(L) * E, 0);
  check(cudaMallocHost(&h_heat_, heat_host_.size() * sizeof(unsigned long long)), "cudaMallocHost (routing heat window)");
  check(cudaEventCreateWithFlags(&heat_ev_, cudaEventDisableTiming), "cudaEventCreate");
  check(cudaStreamCreateWithFlags(&swap_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  swap_jobs_.resize(kSwapsInFlight);
  for (SwapJob& j : swap_jobs_) {
    check(cudaMallocHost(&j.staging, slot_bytes_), "cudaMallocHost (swap staging)");
    check(cudaEventCreateWithFlags(&j.evicted, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventCreateWithFlags(&j.copied, cudaEventDisableTiming), "cudaEventCreate");
  }
}

void ExpertTier::free_swaps() {
  if (swap_stream_) cudaStreamSynchronize(swap_stream_);
  for (SwapJob& j : swap_jobs_) {
    if (j.staging) cudaFreeHost(j.staging);
    if (j.evicted) cudaEventDestroy(j.evicted);
    if (j.copied) cudaEventDestroy(j.copied);
  }
  swap_jobs_.clear();
  if (h_heat_) cudaFreeHost(h_heat_), h_heat_ = nullptr;
  if (heat_ev_) cudaEventDestroy(heat_ev_), heat_ev_ = nullptr;
  if (swap_stream_) cudaStreamDestroy(swap_stream_), swap_stream_ = nullptr;
}

void ExpertTier::set_entry(int pair, const uint8_t* slot, bool resident) {
  const int E = s_.num_experts, l = pair / E, e = pair % E;
  DevExperts& x = experts_[l];
  set_entry_kernel<<<1, 1, 0, stream_>>>(x.gate_ptrs.get(), x.up_ptrs.get(), x.down_ptrs.get(), resident_[l].get(), e, slot, slot + slot_up_,
                                         slot + slot_down_, resident ? 1 : 0);
  check(cudaGetLastError(), "expert tier entry");
  // The one-token table the same (a swap's candidate may have been read
  // over PCIe: now from its slot; its victim is read over PCIe from now on
  // when its bytes are registered, else the host's).
  if (!one_resident_.empty()) {
    const ExpertWeights& w = model_.layer(l).moe.experts[e];
    const bool pcie = !resident && in_pinned_memory(w);
    const uint8_t *g = slot, *u = slot + slot_up_, *d = slot + slot_down_;
    if (pcie) g = mapped(w.gate.data), u = mapped(w.up.data), d = mapped(w.down.data);
    set_entry_kernel<<<1, 1, 0, stream_>>>(x.one_gate_ptrs.get(), x.one_up_ptrs.get(), x.one_down_ptrs.get(), one_resident_[l].get(), e, g, u, d,
                                           resident ? 1 : pcie ? 2 : 0);
    check(cudaGetLastError(), "expert tier entry");
  }
}

void ExpertTier::drain_heat_window() {
  if (!heat_pending_) return;
  check(cudaEventSynchronize(heat_ev_), "routing heat window");
  heat_pending_ = false;
  static_assert(sizeof(unsigned long long) == sizeof(uint64_t));
  for (std::size_t i = 0; i < heat_host_.size(); ++i) heat_host_[i] += h_heat_[i];
  swap_policy_->observe(reinterpret_cast<const uint64_t*>(h_heat_));
}

void ExpertTier::swap_tick() {
  if (!swap_policy_) return;
  // Copies that finished: the candidates take their slots from this step on.
  for (SwapJob& j : swap_jobs_) {
    if (j.state != SwapJob::kCopying) continue;
    const cudaError_t q = cudaEventQuery(j.copied);
    if (q == cudaErrorNotReady) continue;
    check(q, "expert swap copy");
    set_entry(j.candidate, slot_address(j.slot), true);
    plan_.resident[j.candidate] = 1, slot_of_[j.candidate] = j.slot;
    ++residency_gen_;
    swap_busy_[j.victim] = swap_busy_[j.candidate] = 0;
    j.state = SwapJob::kFree;
    ++swaps_done_, swap_bytes_ += expert_bytes_;
  }
  // Staged blobs: evict the victim (the host computes it from this step
  // on), then copy once every step before has finished with the slot.
  for (SwapJob& j : swap_jobs_) {
    if (j.state != SwapJob::kStaged) continue;
    set_entry(j.victim, slot_address(0), false);
    plan_.resident[j.victim] = 0, slot_of_[j.victim] = -1;
    ++residency_gen_;
    check(cudaEventRecord(j.evicted, stream_), "event");
    check(cudaStreamWaitEvent(swap_stream_, j.evicted), "wait event");
    check(cudaMemcpyAsync(slot_address(j.slot), j.staging, slot_bytes_, cudaMemcpyHostToDevice, swap_stream_), "expert swap copy");
    check(cudaEventRecord(j.copied, swap_stream_), "event");
    j.state = SwapJob::kCopying;
  }
  // A window's counts on the host: new swaps when none is in flight.
  if (heat_pending_ && cudaEventQuery(heat_ev_) == cudaSuccess) {
    drain_heat_window();
    const bool idle = std::all_of(swap_jobs_.begin(), swap_jobs_.end(), [](const SwapJob& j) { return j.state == SwapJob::kFree; });
    if (idle) {
      std::vector<uint8_t> frozen(layer_full_.begin(), layer_full_.end());
      // A dense layer never swaps: its counts stay 0 and it has no resident to evict (victims come from the candidate's layer).
      const std::vector<ExpertSwap> picked = swap_policy_->choose(plan_.resident, frozen, swap_busy_);
      for (std::size_t i = 0; i < picked.size(); ++i) {
        SwapJob& j = swap_jobs_[i];
        j.victim = picked[i].victim, j.candidate = picked[i].candidate, j.slot = slot_of_[j.victim];
        swap_busy_[j.victim] = swap_busy_[j.candidate] = 1;
        j.state = SwapJob::kStaging;
      }
    }
  }
  // The next window: its counts come off the device after the steps so far.
  if (!heat_pending_ && tokens_ - window_start_ >= opt_.swap_window) {
    const std::size_t bytes = heat_host_.size() * sizeof(unsigned long long);
    check(cudaMemcpyAsync(h_heat_, heat_, bytes, cudaMemcpyDeviceToHost, stream_), "copy routing heat");
    check(cudaMemsetAsync(heat_, 0, bytes, stream_), "cudaMemset");
    heat_cleared();  // the prefill's routing shares count from here
    check(cudaEventRecord(heat_ev_, stream_), "event");
    heat_pending_ = true;
    window_start_ = tokens_;
  }
}

void ExpertTier::stage_swaps() {
  const int E = s_.num_experts;
  int staged = 0;
  for (SwapJob& j : swap_jobs_) {
    if (j.state != SwapJob::kStaging) continue;
    if (staged++ == kStagedPerStep) break;
    const ExpertWeights& x = model_.layer(j.candidate / E).moe.experts[j.candidate % E];
    std::memcpy(j.staging, x.gate.data, x.gate.bytes());
    std::memcpy(j.staging + slot_up_, x.up.data, x.up.bytes());
    std::memcpy(j.staging + slot_down_, x.down.data, x.down.bytes());
    j.state = SwapJob::kStaged;
  }
}

}  // namespace coli::cuda::detail
