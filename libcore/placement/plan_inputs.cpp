#include "placement/plan_inputs.h"

#include <algorithm>

#include "quant/format.h"

namespace coli {

DeviceNeeds device_needs(const Container& c, const ModelSpec& s, int ctx, int chunk) {
  DeviceNeeds d;
  for (const Blob& b : c.manifest().blobs)
    if (b.kind == "tensor") d.trunk += b.bytes;
  const uint64_t attn = static_cast<uint64_t>(s.num_attention_layers());
  d.kv = attn * 2 * uint64_t(s.num_kv_heads) * s.head_dim * uint64_t(std::max(ctx, 1)) * 4;
  const uint64_t deltanet = uint64_t(s.num_layers) - attn;
  d.state = deltanet * (uint64_t(s.linear_num_value_heads) * s.linear_key_head_dim * s.linear_value_head_dim * 4 +
                        uint64_t(s.linear_key_dim() * 2 + s.linear_value_dim()) * 4 * 4);
  // Per token of a chunk, the CUDA backend's buffers (ensure_buffers): the
  // hidden rows, the mixers' projections, the router's logits, the shared
  // and routed experts' activations and the grouped GEMM's rows (k x hidden).
  const uint64_t H = s.hidden_size, K = s.num_experts_per_tok, I = s.moe_intermediate_size, Is = s.shared_expert_intermediate_size;
  const uint64_t mixer = uint64_t(std::max(s.linear_key_dim() * 2 + s.linear_value_dim(), s.num_heads * s.head_dim * 2));
  const uint64_t per_token = 4 * (6 * H + K * H + (K + 1) * I + 2 * Is + uint64_t(s.num_experts) + 3 * mixer);
  const uint64_t T = uint64_t(std::max(chunk, 1));
  d.activations = per_token * T;
  // Attention scratch at the context size (at most one row per head and position) and the last row's logits.
  if (attn) d.activations += T * uint64_t(s.num_heads) * uint64_t(std::max(ctx, 1)) * 4;
  d.activations += uint64_t(s.vocab_size) * 4;
  d.fixed = uint64_t(8) << 20;  // decode graphs, allocation rounding
  return d;
}

std::string expert_format_name(const Container& c) {
  for (const Blob& b : c.manifest().blobs)
    if (b.kind == "expert" && !b.parts.empty()) return format_name(b.parts[0].format);
  return "";
}

PlannerInputs planner_inputs(const Container& c, const ModelSpec& s, uint64_t vram_budget, uint64_t ram_budget, int ctx, int chunk, bool prefill_upload) {
  PlannerInputs in;
  in.fingerprint = c.fingerprint();
  in.layers = s.num_layers, in.experts = s.num_experts, in.k = s.num_experts_per_tok;
  for (const Blob& b : c.manifest().blobs)
    if (b.kind == "expert") in.expert_bytes = std::max(in.expert_bytes, b.bytes);
  in.vram_budget = vram_budget, in.ram_budget = ram_budget;
  const uint64_t need = device_needs(c, s, ctx, chunk).total();
  in.vram_bytes = vram_budget > need ? vram_budget - need : 0;
  in.ram_bytes = ram_budget;
  in.prefill_staging_extra = prefill_upload ? 8 : -1;  // the CUDA backend's kSwapsInFlight (staging slots kept for swaps)
  return in;
}

}  // namespace coli
