#include "common/run_setup.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "common/run_options.h"
#include "common/run_plan.h"
#include "cuda_device.h"
#include "formats/container.h"
#include "placement/device_budget.h"
#include "placement/plan.h"
#include "placement/vram_ledger.h"
#include "util/error.h"
#include "util/parse.h"

namespace coli::cli {

namespace {

std::string gib(uint64_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f GiB", b / double(1ull << 30));
  return s;
}

std::string mib(uint64_t b) { return std::to_string(b >> 20) + " MiB"; }

// The machine's memory in bytes (0 when unknown).
uint64_t physical_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : 0;
}

// The planner's tier for the budget at one chunk size.
Plan plan_at(const Container& c, const ModelSpec& spec, const RunRequest& r, uint64_t budget, int chunk, bool upload, bool pinned,
             Prediction* pr, std::string* rates_from, uint64_t* heat_tokens) {
  const RunFlags& f = *r.flags;
  PlanRequest q;
  q.vram_budget = budget, q.ctx = r.n_ctx > 0 ? r.n_ctx : 4096, q.chunk = chunk, q.chunks = {chunk};
  q.prefill_upload = upload;
  q.pcie_read = pinned ? f.tier.pcie_read : 0, q.pcie_read_offset = f.tier.pcie_read_offset;
  q.heat = f.heat, q.mirror = r.mirror;
  const PlannerInputs in = plan_inputs(c, spec, q, rates_from);
  *heat_tokens = in.heat.empty() ? 0 : in.heat_tokens;
  return plan_placement(in, pr);
}

// The tier's plan under a budget (a container's model): at the chunk
// given, else at the largest of kChunkChoices whose activations cost the
// predicted decode at most kChunkDecodeCost (prompts that upload gain
// from larger chunks; the CPU's prompt path does not, and keeps 512).
void plan_tier(RunSetup& s, const RunRequest& r, const std::string& container, bool upload, bool pinned) {
  const Container c(container);
  const ModelSpec& spec = r.model->spec();
  std::vector<int> sizes = {r.chunk > 0 ? r.chunk : kDefaultChunk};
  if (r.chunk <= 0 && upload) sizes.assign(std::begin(kChunkChoices), std::end(kChunkChoices));
  std::vector<Plan> plans;
  std::vector<Prediction> preds(sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    plans.push_back(plan_at(c, spec, r, s.fit.budget, sizes[i], upload, pinned, &preds[i], &s.rates_from, &s.heat_tokens));
    // The backend's own test (the VRAM ledger): do the uploads' staging
    // areas fit beside this plan's experts at this chunk? If not, prompts
    // run their missing experts on the CPU, which larger chunks do not
    // speed up: only their activations' cost is left.
    VramSettings v;
    v.budget = s.fit.budget, v.n_ctx = r.n_ctx, v.sequences = r.sequences, v.max_chunk = sizes[i], v.prefill_upload = upload, v.swap = r.flags->tier.swap;
    v.pcie_read_share = run_pcie_read_share(r.flags->tier, pinned);
    v.decode_upload_max = r.flags->tier.decode_upload;
    v.prefill_ring_slots = r.env.prefill_ring_slots;
    v.mtp = r.env.mtp;
    const std::vector<uint64_t> heat = plan_as_heat(plans.back());
    if (upload && !VramLedger(*r.model, v).fill(s.fit.budget, &heat).prefill) preds[i].prefill_tok_s = 0;
  }
  s.rates = rates_of(c, "");
  const std::size_t pick = pick_chunk(preds);
  s.plan = plans[pick], s.predicted = preds[pick], s.chunk = sizes[pick];
  s.plan_source = s.heat_tokens > 0 ? "heat" : "even";
}

// Where the weights outside VRAM are read from under a budget, and whether
// they are pinned: a mirror is; a container's mapping is registered when
// it fits the machine's RAM comfortably; a checkpoint directory is not.
bool choose_host_memory(RunSetup& s, const RunRequest& r, const std::string& container, std::pair<const void*, std::size_t>* span) {
  if (r.mirror) {
    s.host_memory = "mirror " + r.mirror->name();
    return true;
  }
  s.host_memory = "pageable";
  if (container.empty()) {
    s.pageable_why = "a checkpoint directory: convert it with coli-convert, or start coli-pin";
    return false;
  }
  const auto sp = host_span(*r.model);
  std::error_code ec;
  const uintmax_t file = std::filesystem::file_size(container, ec);
  const uint64_t ram = physical_memory();
  if (!sp.first || ec || sp.second > file + uint64_t(::sysconf(_SC_PAGESIZE))) {
    s.pageable_why = "the weights are not all in the container's mapping";
    return false;
  }
  // Pinning keeps the whole file in RAM while the run lives: a quarter of
  // the machine's memory stays for everything else.
  if (ram && sp.second > ram / 4 * 3) {
    s.pageable_why = "the container (" + gib(sp.second) + ") is more than 3/4 of this machine's " + gib(ram) + " of RAM";
    return false;
  }
  // Pinned here, before the backend is made, so that a refusal (the
  // process may not lock that much memory: RLIMIT_MEMLOCK, a cgroup's
  // limit) turns the paths that need pinned memory off rather than
  // sending prompts through the slow pageable uploads. The backend takes
  // a reference on this registration.
  s.container_bytes = sp.second;
  if (r.pin_in_background) {
    // The backend starts pageable and switches over when this is done
    // (CudaOptions::pending_pin); a refusal turns the pinned paths off then.
    auto ms = std::make_shared<std::atomic<double>>(0.0);
    s.pin_future_ms = ms;
    s.pin_future = std::async(std::launch::async, [sp, ms] {
                     const auto t0 = std::chrono::steady_clock::now();
                     cuda::HostPin pin(sp.first, sp.second, true);
                     ms->store(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
                     return pin;
                   }).share();
    *span = sp;
    s.host_memory = "container";
    return true;
  }
  const auto t0 = std::chrono::steady_clock::now();
  s.container_pin = cuda::HostPin(sp.first, sp.second, true);
  s.pin_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (s.container_pin.bytes() == 0) {
    s.container_pin = {};
    s.pageable_why = "the driver refused to pin the container's mapping (" + gib(sp.second) +
                     "; too little lockable memory? see ulimit -l and the cgroup's memory limit)";
    return false;
  }
  *span = sp;
  s.host_memory = "container";
  return true;
}

}  // namespace

DeviceFit fit_device(uint64_t free, uint64_t margin, uint64_t whole, uint64_t floor) {
  DeviceFit f;
  f.free = free, f.margin = margin, f.whole = whole, f.floor = floor;
  const uint64_t avail = free > margin ? free - margin : 0;
  if (whole <= avail) {
    f.kind = DeviceFit::Kind::kWhole;
  } else if (floor <= avail) {
    f.kind = DeviceFit::Kind::kTier, f.budget = avail, f.budget_auto = true;
  } else {
    f.why = "the GPU has " + gib(free) + " free (" + gib(avail) + " after the " + mib(margin) + " --vram-margin); the model needs " + gib(whole) +
            " on it whole and " + gib(floor) + " without its routed experts";
  }
  return f;
}

std::size_t pick_chunk(const std::vector<Prediction>& at) {
  double best_decode = 0;
  for (const Prediction& p : at) best_decode = std::max(best_decode, p.decode_tok_s);
  std::size_t pick = 0;
  bool any = false;
  for (std::size_t i = 0; i < at.size(); ++i) {
    if (at[i].decode_tok_s < (1 - kChunkDecodeCost) * best_decode) continue;
    if (!any || at[i].prefill_tok_s > at[pick].prefill_tok_s) pick = i;
    any = true;
  }
  return pick;
}

RunSetup setup_run(const RunRequest& r) {
  const RunFlags& f = *r.flags;
  const Model& m = *r.model;
  RunSetup s;
  std::string why;
  s.gpu_present = f.device != "cpu" && cuda::device_count(&why) > 0;
  const std::string container = container_file_of(r.model_path);
  s.chunk = r.chunk > 0 ? r.chunk : kDefaultChunk;
  if (s.gpu_present) {
    const uint64_t free = cuda::device_free_bytes(), total = cuda::device_total_bytes();
    if (f.vram_margin >= total) throw UsageError("--vram-margin " + gib(f.vram_margin) + " is not less than the device's " + gib(total));
    VramSettings whole;
    whole.n_ctx = r.n_ctx, whole.max_chunk = s.chunk, whole.mtp = r.env.mtp, whole.sequences = r.sequences;
    VramSettings tier = whole;
    tier.budget = 1;
    const uint64_t whole_need = VramLedger(m, whole).device_floor(), floor = VramLedger(m, tier).device_floor();
    if (r.vram_budget == kBudgetAuto) {
      s.fit = fit_device(free, f.vram_margin, whole_need, floor);
    } else {
      if (r.vram_budget > total) throw UsageError("--vram-budget " + gib(r.vram_budget) + " is more than the device's " + gib(total));
      s.fit.kind = DeviceFit::Kind::kTier, s.fit.budget = r.vram_budget, s.fit.free = free, s.fit.whole = whole_need, s.fit.floor = floor;
    }
  } else if (f.device == "cuda") {
    throw Error("CUDA backend: no usable device: " + why);
  }
  BackendTarget t;
  t.model = &m, t.mirror = r.mirror, t.threads = r.threads, t.expert_spare = r.expert_spare, t.heat = r.start_heat;
  if (s.fit.kind == DeviceFit::Kind::kTier) {
    t.vram_budget = s.fit.budget;
    t.n_ctx = r.n_ctx, t.sequences = r.sequences;
    const bool pinned = choose_host_memory(s, r, container, &t.container_span);
    t.container_pin = s.pin_future;
    // Prompts upload the experts the tier lacks when the weights are
    // pinned (55 GB/s: 3x the CPU's prompt path at every budget measured,
    // docs/perf/zero-config.md); from pageable memory the copies run at
    // 14-19 GB/s, no faster than the CPU computing them, unless asked.
    t.prefill_upload = pinned;
    const bool upload = pinned || f.tier.prefill_upload;
    if (r.plan_file) {
      s.plan = *r.plan_file, s.plan_source = "file";
      if (r.chunk <= 0 && r.plan_file->prefill_chunk > 0) s.chunk = r.plan_file->prefill_chunk;
    } else if (!container.empty()) {
      plan_tier(s, r, container, upload, pinned);
    } else {
      s.plan_source = "order";
    }
    if (s.plan) t.plan = &*s.plan;
    t.pcie_gbs = s.rates.pcie_gbs, t.host_expert_gbs = s.rates.host_expert_gbs, t.prefill_layer_token_s = s.rates.prefill_layer_token_s;
  }
  t.max_chunk = s.chunk;
  const cuda::CudaOptions co = cuda_options(r.env, f, t);
  std::string device = f.device;
  if (!s.gpu_present && device == "auto") device = "cpu", s.fallback = why;  // no device: the CPU, said with -v
  if (!s.gpu_present && device == "cpu" && f.device != "cpu" && r.vram_budget != kBudgetAuto)
    s.budget_ignored = "--vram-budget " + gib(r.vram_budget) + " ignored: no usable GPU (" + why + "); running on the CPU";
  if (s.fit.kind == DeviceFit::Kind::kCpu && s.gpu_present) {
    if (device == "cuda") throw Error("CUDA backend: " + s.fit.why);
    device = "cpu";
  }
  s.backend = make_backend(device, m, co, cpu::CpuOptions{r.threads, r.fast_cpu}, &s.fallback);
  const TierStats ts = s.backend->tier_stats();
  if (s.host_memory == "container" && ts.tiered && ts.pinned_host_bytes == 0 && !ts.pin_pending) {
    s.host_memory = "pageable";
    s.pageable_why = "the driver did not register the container's mapping (too little lockable memory?)";
  }
  return s;
}

std::string notice(const RunSetup& s) {
  if (!s.gpu_present) return s.budget_ignored;
  if (s.fit.kind == DeviceFit::Kind::kCpu) return "not enough GPU memory: " + s.fit.why + ": running on the CPU";
  if (!s.fallback.empty()) return "the GPU is not used (" + s.fallback + "): running on the CPU";
  const TierStats t = s.backend->tier_stats();
  if (s.fit.kind != DeviceFit::Kind::kTier || !t.tiered) return "";
  std::string l = "VRAM budget " + gib(s.fit.budget);
  l += s.fit.budget_auto ? " (" + gib(s.fit.free) + " free less the " + mib(s.fit.margin) + " --vram-margin)" : " (--vram-budget)";
  char share[64];
  std::snprintf(share, sizeof share, "%lld of %lld experts in VRAM (%.1f %%)", t.resident, t.experts, t.experts ? 100.0 * t.resident / t.experts : 0.0);
  l += ": " + std::string(share);
  if (t.resident < t.experts) {
    l += ", the others on the CPU";
    if (t.pcie_read) {
      std::snprintf(share, sizeof share, " (the GPU reads %.0f %% of their decode misses over PCIe)", 100 * t.pcie_read_share);
      l += share;
    }
  }
  if (s.host_memory == "container" && t.pin_pending) l += "; weights being pinned in the background (the container, " + format_bytes(s.container_bytes) + "; until then pageable)";
  else if (s.host_memory == "container") l += "; weights pinned (the container registered, " + format_bytes(t.pinned_host_bytes) + ")";
  else if (s.host_memory.rfind("mirror ", 0) == 0) l += "; weights pinned (coli-pin " + s.host_memory + ")";
  else l += "; weights pageable (" + s.pageable_why + ")";
  l += t.prefill_upload || t.resident == t.experts ? "; prompts on the GPU" : "; prompts' missing experts on the CPU";
  l += " in chunks of " + std::to_string(s.chunk);
  if (s.plan_source == "file") l += "; tier from the --plan file";
  else if (s.plan_source == "heat") l += "; tier planned from routing heat of " + std::to_string(s.heat_tokens) + " tokens";
  else if (s.plan_source == "even") l += "; tier planned evenly (no routing heat yet)";
  else l += "; tier in the heat's order";
  return l;
}

std::string pin_outcome(RunSetup& s, bool* refused) {
  *refused = false;
  if (!s.pin_future.valid()) return "";
  const cuda::HostPin& pin = s.pin_future.get();
  s.pin_ms = s.pin_future_ms ? s.pin_future_ms->load() : 0;
  const TierStats t = s.backend ? s.backend->tier_stats() : TierStats{};
  char ms[32];
  std::snprintf(ms, sizeof ms, "%.0f ms", s.pin_ms);
  if (pin.bytes() == 0) {
    *refused = true;
    s.host_memory = "pageable";
    s.pageable_why = "the driver refused to pin the container's mapping (" + gib(s.container_bytes) +
                     "; too little lockable memory? see ulimit -l and the cgroup's memory limit)";
    return "weights pageable: " + s.pageable_why + "; the run stayed on the pageable path (no PCIe reads, prompts' missing experts on the CPU)";
  }
  std::string l = "pinned the container (" + format_bytes(pin.bytes()) + ") in the background in " + std::string(ms);
  if (t.pin_switch_tokens >= 0) l += "; the run switched to it after " + std::to_string(t.pin_switch_tokens) + " tokens";
  else l += "; the run ended before it switched";
  if (t.pin_wait_ms > 0) {
    std::snprintf(ms, sizeof ms, "%.0f ms", t.pin_wait_ms);
    l += " (a prompt chunk waited " + std::string(ms) + " for it)";
  }
  return l;
}

nlohmann::json record_fields(const RunSetup& s) {
  nlohmann::json v = nlohmann::json::object();
  const TierStats t = s.backend ? s.backend->tier_stats() : TierStats{};
  const bool tier = s.fit.kind == DeviceFit::Kind::kTier && t.tiered;
  if (s.gpu_present) v["vram_free_mb"] = s.fit.free >> 20;
  if (tier) {
    v["vram_budget_mb"] = double(s.fit.budget) / (1 << 20);
    v["vram_budget_auto"] = s.fit.budget_auto ? 1 : 0;
    if (s.fit.budget_auto) v["vram_margin_mb"] = s.fit.margin >> 20;
    v["tier_experts"] = t.resident;
    v["host_memory"] = s.host_memory.rfind("mirror ", 0) == 0 ? "mirror" : s.host_memory;
    v["plan_source"] = s.plan_source;
  }
  const bool gpu = s.backend && s.backend->name() == "cuda" && (tier || s.fit.kind == DeviceFit::Kind::kWhole);
  v["prefill_path"] = !gpu ? "cpu" : (!tier || t.prefill_upload || t.resident == t.experts) ? "gpu" : "cpu-experts";
  return v;
}

}  // namespace coli::cli
