// What a run of coli-run or coli-bench runs on, chosen without flags: the
// device's fit (the whole model on the GPU, a VRAM budget from the card's
// free memory, or the CPU), the tier's plan and prefill chunk, whether the
// weights are pinned (a coli-pin mirror, else the container's mapping
// registered) and so how prompts reach the GPU; then the backend, and the
// one line that says what was chosen. The flags (run_flags.h) override
// each choice; both tools call setup_run() with the same inputs and so
// make the same choice (a coli-bench record measures what a user gets).
//
// Contract:
//  - fit_device() is the budget's arithmetic alone (pure; tests reach it):
//    the whole model when it fits in free - margin, else a budget of
//    free - margin when that holds the model without its routed experts
//    (the VRAM ledger's floor), else the CPU with a reason.
//  - setup_run() reads the device's free and total memory (a device
//    context is made), plans the tier when the model is a coli container
//    (plan_inputs(): the heat file and a ready mirror's counters, this
//    machine's rates; without heat the plan is the even spread), and makes
//    the backend: --device cuda throws when it cannot be made, auto falls
//    back to the CPU's with RunSetup::fallback saying why. A --vram-budget
//    larger than the device's memory, or a --vram-margin not smaller, is
//    a UsageError (exit 2); with --device cpu both are ignored.
//  - notice() is the line a tool prints always (on stderr, with its name
//    in front) when the run is not the whole-GPU one: a budget (what it
//    holds and how the rest runs), the CPU in place of a present GPU, or a
//    --vram-budget given where there is no GPU; "" otherwise. record_fields() are the same facts for coli-bench.
// The backend keeps pointers into the model and the mirror: both outlive
// the RunSetup.
#pragma once
#include <atomic>
#include <cstdint>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/run_flags.h"
#include "cpu_backend.h"
#include "cuda_backend.h"
#include "cuda_device.h"
#include "engine/backend.h"
#include "mirror/mirror.h"
#include "model/weights.h"
#include "placement/plan.h"
#include "placement/planner.h"

namespace coli::cli {

// Prefill chunks a budget run picks from when no chunk is given: the
// largest whose activations cost the predicted decode speed at most
// kChunkDecodeCost (the planner's predictions at each size; a size whose
// prompt uploads do not fit beside the plan's experts gains nothing).
inline constexpr int kChunkChoices[] = {512, 1024, 2048, 4096};
inline constexpr double kChunkDecodeCost = 0.08;
inline constexpr int kDefaultChunk = 512;

struct DeviceFit {
  enum class Kind { kCpu, kWhole, kTier } kind = Kind::kCpu;
  uint64_t budget = 0;            // kTier: the VRAM budget in bytes
  bool budget_auto = false;       // taken from the card (else --vram-budget's)
  uint64_t free = 0, margin = 0;  // the device's free bytes at the start, the margin kept
  uint64_t whole = 0;             // bytes the model needs with every expert on the device
  uint64_t floor = 0;             // bytes it needs without its routed experts (the tier's floor)
  std::string why;                // kCpu with a device: why not the GPU
};

// free: the device's free bytes; whole, floor: the VRAM ledger's.
DeviceFit fit_device(uint64_t free, uint64_t margin, uint64_t whole, uint64_t floor);

// Of the planner's predictions at increasing chunk sizes, the index of the
// one with the most prefill speed among those whose decode is within
// kChunkDecodeCost of the best decode (ties: the smaller chunk).
std::size_t pick_chunk(const std::vector<Prediction>& at);

// What one run is made for.
struct RunRequest {
  const RunFlags* flags = nullptr;
  std::string model_path;                    // -m: a container, a directory holding one, or a checkpoint directory
  const Model* model = nullptr;
  const MirrorAttachment* mirror = nullptr;  // the weights' coli-pin mirror, or null
  uint64_t vram_budget = kBudgetAuto;        // one of flags->vram_budgets
  int n_ctx = 0;                             // tokens the KV cache is made for under a budget (0: 4096)
  int sequences = 1;                         // sessions alive at once (coli-serve --parallel): each its cache under a budget
  int chunk = 0;                             // prompt tokens per forward chunk as given; 0: chosen
  int threads = 0;                           // the CPU's, as -t asked (0: the default)
  // Without -t, the hardware threads a device's expert host (its CPU
  // threads for the misses) leaves to the tool's own: 1, the thread that
  // drives the device; coli-serve 3 (its scheduler and connections too).
  int expert_spare = 1;
  bool fast_cpu = true;                      // false: --reference (the scalar CPU backend)
  std::vector<uint64_t> start_heat;          // the tier's order when there is no plan (heat_flag.h tier_start_heat)
  const Plan* plan_file = nullptr;           // --plan FILE, read by the tool
  cuda::CudaOptions env;                     // the COLI_* variables (env_options.h)
  // Pin the container's mapping on a thread of its own while the backend
  // is made and the first tokens run (coli-run: the first token does not
  // wait for it); false: pinned before the backend is made (coli-bench:
  // a record measures the steady state).
  bool pin_in_background = false;
};

struct RunSetup {
  std::unique_ptr<Backend> backend;
  int chunk = kDefaultChunk;   // prompt tokens per forward chunk
  DeviceFit fit;
  bool gpu_present = false;    // a usable CUDA device
  std::string fallback;        // --device auto: why the CUDA backend was not made ("" when it was, or not tried)
  std::string budget_ignored;  // a --vram-budget given where no GPU is usable: the line that says so
  std::string host_memory;     // under a budget: "mirror NAME", "container" (its mapping registered) or "pageable"
  std::string pageable_why;    // "pageable": why
  cuda::HostPin container_pin; // "container": its mapping, pinned before the backend is made (which shares the registration)
  double pin_ms = 0;           // what pinning it took (in the background: once pin_outcome() has it)
  // "container" pinned in the background (RunRequest::pin_in_background):
  // the pin's outcome, which the backend takes over between two chunks.
  std::shared_future<cuda::HostPin> pin_future;
  std::shared_ptr<std::atomic<double>> pin_future_ms;  // what it took, set by its thread
  uint64_t container_bytes = 0;  // "container": the span of its mapping that holds the weights
  std::string plan_source;     // under a budget: "file", "heat" (the planner over routing heat), "even" (no heat), "order" (no container)
  uint64_t heat_tokens = 0;    // the heat the plan was made from
  std::optional<Plan> plan;    // the tier's plan (a file's or the planner's)
  Prediction predicted;        // the planner's, for -v
  std::string rates_from;      // the rates file the planner read ("" for the defaults)
  MachineRates rates;          // what it read (the backend's prompt split takes the PCIe and host rates)
};

RunSetup setup_run(const RunRequest& r);

// The line for stderr (without the tool's name), or "".
std::string notice(const RunSetup& s);
// A background pin's outcome, once the run is over (it waits for the pin):
// "" when there was none; a refusal: the line a tool prints always ("the
// driver refused to pin ...; the run stayed pageable"); else, for -v, what
// it pinned, in how long, and after how many tokens the run switched.
// *refused: whether it was refused.
std::string pin_outcome(RunSetup& s, bool* refused);
// The choice as coli-bench record fields: vram_free_mb, vram_margin_mb,
// vram_budget_auto, tier_experts, host_memory, prefill_path, plan_source.
nlohmann::json record_fields(const RunSetup& s);

}  // namespace coli::cli
