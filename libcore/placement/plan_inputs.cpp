#include "placement/plan_inputs.h"

#include <algorithm>

#include "quant/format.h"

namespace coli {

namespace {

VramSettings settings_for(uint64_t vram_budget, int ctx, int chunk, bool prefill_upload) {
  VramSettings run;
  run.budget = vram_budget;
  run.n_ctx = std::max(ctx, 0);
  run.max_chunk = chunk;
  run.prefill_upload = prefill_upload;
  run.swap = true;  // the tools' runs swap unless --no-swap
  return run;
}

}  // namespace

DeviceNeeds device_needs(const VramLedger& ledger) {
  DeviceNeeds d;
  const RuntimeReserve& r = ledger.reserve();
  d.trunk = ledger.arena() + ledger.inv_freq();
  d.kv = r.kv;
  d.state = r.state;
  d.activations = ledger.buffers().bytes() + r.attention_scratch + r.logits;
  d.fixed = r.fixed + r.pcie_read_tables + r.decode_upload + ledger.slot().bytes();
  return d;
}

DeviceNeeds device_needs(const Container& c, const ModelSpec& s, int ctx, int chunk) {
  VramSettings run = settings_for(0, ctx, chunk, false);
  run.expert_slots = 0;  // tiered: the trunk without the routed experts
  return device_needs(VramLedger(c, s, run));
}

std::string expert_format_name(const Container& c) {
  for (const Blob& b : c.manifest().blobs)
    if (b.kind == "expert" && !b.parts.empty()) return format_name(b.parts[0].format);
  return "";
}

PlannerInputs planner_inputs(const Container& c, const ModelSpec& s, const VramSettings& run, uint64_t ram_budget) {
  PlannerInputs in;
  in.fingerprint = c.fingerprint();
  in.layers = s.num_layers, in.experts = s.num_experts, in.k = s.num_experts_per_tok;
  for (const Blob& b : c.manifest().blobs)
    if (b.kind == "expert") in.expert_bytes = std::max(in.expert_bytes, b.bytes);
  in.vram_budget = run.budget, in.ram_budget = ram_budget;
  VramSettings tiered = run;
  if (tiered.budget == 0 && tiered.expert_slots < 0) tiered.expert_slots = 0;  // sized as a tiered run (a budget of 0 holds no slot)
  const VramLedger ledger(c, s, tiered);
  const uint64_t need = device_needs(ledger).total();
  in.slot_bytes = ledger.slot().bytes();
  in.vram_bytes = run.budget > need ? run.budget - need : 0;
  in.ram_bytes = ram_budget;
  if (run.prefill_upload) {
    in.prefill_staging_extra = run.swap ? kTierSwapsInFlight : 0;
    in.prefill_table_bytes = prefill_table_bytes(s.num_layers, s.num_experts);
    in.prefill_ring = ledger.prefill_ring();
  }
  return in;
}

PlannerInputs planner_inputs(const Container& c, const ModelSpec& s, uint64_t vram_budget, uint64_t ram_budget, int ctx, int chunk, bool prefill_upload) {
  return planner_inputs(c, s, settings_for(vram_budget, ctx, chunk, prefill_upload), ram_budget);
}

}  // namespace coli
