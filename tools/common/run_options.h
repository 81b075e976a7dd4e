// The run-options layer of coli-run and coli-bench: their checked flags
// (run_flags.h) and what only the loaded model tells (its mirror, the
// budget of this configuration, the context, the tier's first experts)
// turned into the CUDA backend's options, and the backend --device asks
// for, with the CPU's as the fallback.
//
// Contract:
//  - cuda_options() starts from `base` (the COLI_* variables,
//    env_options.h) and sets what the flags say, so that a flag wins over a
//    variable. Under a budget: vram_budget, n_ctx, swap, decode-upload,
//    the PCIe-read share (auto: kPcieReadAutoShare with pinned weights, a
//    mirror or the container's span, and no --decode-upload) and offset,
//    prefill-upload (the flag or the target's choice), the tier's heat (a
//    plan's VRAM experts first), the container's span as a read-only host
//    region, and a CPU expert host (when the device may be a GPU and one
//    is there). With a mirror: its pages as host_regions, and its device
//    twin without a budget. Nothing else of base changes.
//  - make_backend() never returns null: the CUDA backend (cuda, or auto
//    when it can be made), else the CPU backend; *why says why auto fell
//    back (empty otherwise). A cuda device that cannot be made throws.
// The options hold shared pointers (the expert host) and the mirror's
// addresses: the model and the mirror must outlive the backend made from
// them, as they must for the backend itself.
#pragma once
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "common/run_flags.h"
#include "cpu_backend.h"
#include "cuda_backend.h"
#include "engine/backend.h"
#include "mirror/mirror.h"
#include "model/weights.h"
#include "placement/plan.h"

namespace coli::cli {

// What one backend is made for, besides the flags.
struct BackendTarget {
  const Model* model = nullptr;
  const MirrorAttachment* mirror = nullptr;  // the weights' coli-pin mirror, or null
  uint64_t vram_budget = 0;                  // bytes; 0: no tier
  int n_ctx = 0;                             // tokens the tier's KV cache is sized for (0: the backend's 4096)
  int sequences = 1;                         // sessions alive at once, each its cache (CudaOptions::sequences)
  int max_chunk = 512;                       // most tokens per forward chunk
  int threads = 0;                           // the CPU's, as -t asked (0: the default)
  int expert_spare = 1;                      // without -t: hardware threads the device's expert host leaves to the tool's own
  std::vector<uint64_t> heat;                // routing counts the tier fills from, hottest first (heat_flag.h tier_start_heat)
  const Plan* plan = nullptr;                // a coli-place plan: its VRAM experts first, then the heat (plan_as_heat)
  // Without a mirror, under a budget: the container's mapping holding the
  // weights (host_span), registered read-only so that copies from it and
  // the PCIe reads run at the pinned rate; {nullptr, 0}: none.
  std::pair<const void*, std::size_t> container_span{nullptr, 0};
  // That span's pin being made on another thread (run_setup.h): the
  // backend starts pageable and switches over (CudaOptions::pending_pin).
  std::shared_future<cuda::HostPin> container_pin;
  bool prefill_upload = false;               // prompts upload the tier's misses (--prefill-upload, or run_setup's choice)
  double pcie_gbs = 55, host_expert_gbs = 60, prefill_layer_token_s = 2.5e-6;  // the machine's rates (the planner's) for the prompts' CPU share
};

// The PCIe-read share a tier run takes: --pcie-read as given, auto
// (kPcieReadAutoShare) when the weights are pinned (a mirror, or the
// container registered) and no --decode-upload takes the misses, else 0.
double run_pcie_read_share(const TierFlags& f, bool pinned);

// The device's CPU expert threads: -t's count when given (threads > 0),
// else the hardware threads less the tool's own (spare, at least 1), at
// least one.
int expert_host_threads(int threads, int spare, int hardware_threads);

// The host bytes [first, first + second) that hold every matrix of the
// model (its routed experts among them), page-aligned: for a model read
// from a container, inside the container's one mapping.
std::pair<const void*, std::size_t> host_span(const Model& model);

cuda::CudaOptions cuda_options(const cuda::CudaOptions& base, const RunFlags& flags, const BackendTarget& target);

std::unique_ptr<Backend> make_backend(const std::string& device, const Model& model, const cuda::CudaOptions& co, const cpu::CpuOptions& cpu,
                                      std::string* why);

}  // namespace coli::cli
