#include "common/run_options.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <thread>

#include "cpu_expert_host.h"
#include "cuda_device.h"
#include "model/layer_tensors.h"
#include "util/parse.h"

namespace coli::cli {

namespace {

// The expert tier: what the budget leaves after the trunk, the KV cache and
// the activations holds the hottest experts; the CPU computes the others
// while the GPU computes the rest.
void set_tier(cuda::CudaOptions& co, const RunFlags& flags, const BackendTarget& t) {
  const TierFlags& f = flags.tier;
  co.vram_budget = t.vram_budget;
  co.n_ctx = t.n_ctx, co.sequences = t.sequences;
  co.swap = f.swap;
  co.decode_upload_max = f.decode_upload;
  // auto: with pinned weights (a mirror or the container, registered at the
  // start: 0.05-0.1 s per GB), unless --decode-upload takes the misses.
  co.pcie_read_share = run_pcie_read_share(f, t.mirror != nullptr || t.container_span.first != nullptr);
  co.pcie_read_offset = f.pcie_read_offset;
  co.prefill_upload = f.prefill_upload || t.prefill_upload;
  co.prefill_cpu_experts = f.prefill_cpu;
  co.pcie_gbs = t.pcie_gbs, co.host_expert_gbs = t.host_expert_gbs, co.prefill_layer_token_s = t.prefill_layer_token_s;
  if (!t.mirror && t.container_span.first) co.read_only_host_regions.push_back(t.container_span), co.pending_pin = t.container_pin;
  co.heat = t.plan ? plan_as_heat(*t.plan, t.heat) : t.heat;
  // The CPU's expert threads: -t when given, else all cores but the tool's
  // own (expert_spare). Workers spin through a decode step: one preempted by
  // a thread past the cores holds up the layer's join (coli-serve at 1.75G,
  // 16 cores, H100: one client 312 and 297 tok/s with 15 threads, 387 with
  // 14, 405 with 13; 16 clients 542-612, 598, 653; docs/perf/serve.md).
  const int expert_threads = expert_host_threads(t.threads, t.expert_spare, static_cast<int>(std::thread::hardware_concurrency()));
  if (flags.device != "cpu" && cuda::device_count() > 0) co.expert_host = std::make_shared<cpu::CpuExpertHost>(*t.model, expert_threads);
}

// The mirror's pages: registered with the device when an option copies
// experts from them during the run.
void set_mirror(cuda::CudaOptions& co, const MirrorAttachment& m, uint64_t vram_budget) {
  co.host_regions.push_back({m.base(), m.size()});
  // coli-pin start --gpu: the keeper's device copy, read in place. Whole
  // runs only for now: a tier filled from it has not passed its GPU test.
  const uint8_t* data = nullptr;
  if (!vram_budget && m.twin(&data, &co.twin.bytes, &co.twin.device, co.twin.handle)) co.twin.host = data;
}

}  // namespace

int expert_host_threads(int threads, int spare, int hardware_threads) {
  return threads > 0 ? threads : std::max(1, hardware_threads - std::max(1, spare));
}

double run_pcie_read_share(const TierFlags& f, bool pinned) { return pcie_read_share(f.pcie_read, pinned, f.decode_upload > 0); }

std::pair<const void*, std::size_t> host_span(const Model& model) {
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  auto add = [&](const Matrix& m) {
    if (!m.data || !m.bytes()) return;
    lo = std::min(lo, reinterpret_cast<uintptr_t>(m.data));
    hi = std::max(hi, reinterpret_cast<uintptr_t>(m.data) + m.bytes());
  };
  add(model.embed()), add(model.lm_head());
  for (int l = 0; l < model.spec().num_layers; ++l)
    for (const TensorDesc& t : layer_tensors(model.spec(), l))
      if (t.form != TensorForm::kVector) add(matrix_of(model, t));
  if (lo >= hi) return {nullptr, 0};
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  lo &= ~(page - 1), hi = (hi + page - 1) & ~(page - 1);  // a mapping covers whole pages
  return {reinterpret_cast<const void*>(lo), std::size_t(hi - lo)};
}

cuda::CudaOptions cuda_options(const cuda::CudaOptions& base, const RunFlags& flags, const BackendTarget& target) {
  cuda::CudaOptions co = base;
  co.max_chunk = target.max_chunk;
  if (target.vram_budget) set_tier(co, flags, target);
  if (target.mirror) set_mirror(co, *target.mirror, target.vram_budget);
  return co;
}

std::unique_ptr<Backend> make_backend(const std::string& device, const Model& model, const cuda::CudaOptions& co, const cpu::CpuOptions& cpu,
                                      std::string* why) {
  if (auto b = cuda::make_device_backend(device, model, co, why)) return b;
  return std::make_unique<cpu::CpuBackend>(model, cpu);
}

}  // namespace coli::cli
