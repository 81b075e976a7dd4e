#include "common/run_plan.h"

#include <unistd.h>

#include <cstdlib>

#include "model/weights.h"
#include "placement/machine_rates.h"
#include "placement/plan_inputs.h"
#include "util/error.h"
#include "util/parse.h"

namespace coli::cli {

std::string host_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "";
  return host;
}

namespace {

MachineRates rates_for(const std::string& file, const std::string& format, std::string* from) {
  if (!file.empty()) {
    if (from) *from = file;
    return load_rates(file);
  }
  return cached_rates_for(std::getenv("XDG_CACHE_HOME"), std::getenv("HOME"), host_name(), format, from);
}

// The sizes up to chunk: the VRAM holds that chunk's activations, not a larger one's.
std::vector<int> chunks_up_to(const std::vector<int>& sizes, int chunk) {
  std::vector<int> v;
  for (int c : sizes)
    if (c <= chunk) v.push_back(c);
  if (v.empty()) v.push_back(chunk);
  return v;
}

}  // namespace

MachineRates rates_of(const Container& c, const std::string& file, std::string* from) { return rates_for(file, expert_format_name(c), from); }

PlannerInputs plan_inputs(const Container& c, const ModelSpec& spec, const PlanRequest& r, std::string* rates_from) {
  // The VRAM the run's backend will have for slots, by the ledger it uses:
  // its reserve holds the PCIe reads' one-token tables when they are on.
  const double share = pcie_read_share(r.pcie_read, /*mirror=*/true, false);  // the RAM tier is the mirror the runs read
  VramSettings run;
  run.budget = r.vram_budget, run.n_ctx = r.ctx, run.max_chunk = r.chunk;
  run.prefill_upload = r.prefill_upload, run.swap = true;  // the runs swap unless --no-swap
  run.pcie_read_share = share;
  PlannerInputs in = planner_inputs(c, spec, run, r.ram_budget.value_or(0));
  if (!r.ram_budget) in.ram_budget = in.ram_bytes = uint64_t(in.layers) * in.experts * in.expert_bytes;
  const Heat h = planning_heat(r.heat, c, spec, r.mirror);
  if (h.tokens() > 0) in.heat.assign(h.counts().begin(), h.counts().end()), in.heat_tokens = h.tokens();
  in.rates = rates_for(r.rates_file, expert_format_name(c), rates_from);
  in.pcie_read_share = share;
  in.pcie_read_offset = r.pcie_read_offset;
  in.chunks = chunks_up_to(r.chunks, r.chunk);
  return in;
}

Plan plan_for_run(const std::string& model, const ModelSpec& spec, const RunFlags& flags, int n_ctx, int chunk, const MirrorAttachment* mirror,
                  Prediction* predicted, std::string* rates_from) {
  const std::string file = container_file_of(model);
  if (file.empty()) throw UsageError("--plan auto needs a coli container (a checkpoint directory has no expert blobs to place)");
  const Container c(file);
  PlanRequest r;
  r.vram_budget = flags.vram_budgets.at(0);
  r.ctx = n_ctx, r.chunk = chunk;
  r.prefill_upload = flags.tier.prefill_upload;
  r.pcie_read = flags.tier.pcie_read, r.pcie_read_offset = flags.tier.pcie_read_offset;
  r.heat = flags.heat;
  r.mirror = mirror;
  return plan_placement(plan_inputs(c, spec, r, rates_from), predicted);
}

}  // namespace coli::cli
