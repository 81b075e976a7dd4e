#include "placement/vram_ledger.h"

#include <algorithm>
#include <initializer_list>
#include <limits>
#include <memory>
#include <string>
#include <unordered_map>

#include "formats/container.h"
#include "model/weights.h"
#include "quant/format.h"
#include "util/error.h"

namespace coli {

namespace {

uint64_t elements(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

uint64_t matrix_bytes(QuantFormat f, const std::vector<int64_t>& shape, const std::string& name) {
  if (shape.size() != 2) throw Error("VRAM ledger: '" + name + "' is not a matrix (internal)");
  return layout_of(f, shape[0], shape[1]).total;
}

constexpr uint64_t kNoLimit = std::numeric_limits<uint64_t>::max();

}  // namespace

bool embedding_on_host(bool tiered, QuantFormat embed) { return tiered && (embed == QuantFormat::F32 || embed == QuantFormat::BF16 || embed == QuantFormat::F16); }

TensorBytes tensor_bytes_of(const Model& m) {
  return [&m](const TensorDesc& t) -> uint64_t {
    return t.form == TensorForm::kVector ? vector_of(m, t).size() * 4 : matrix_of(m, t).bytes();
  };
}

TensorBytes device_bytes(TensorBytes bytes, bool embed_on_host) {
  if (!embed_on_host) return bytes;
  return [bytes = std::move(bytes)](const TensorDesc& t) -> uint64_t { return t.role == TensorRole::kEmbed ? 0 : bytes(t); };
}

namespace {
QuantFormat embed_format_of(const Container& c) {
  for (const Blob& b : c.manifest().blobs)
    for (const BlobPart& p : b.parts)
      if (p.name == "model.embed_tokens.weight") return p.format;
  throw Error(c.where() + ": no tensor 'model.embed_tokens.weight'");
}
}  // namespace

TensorBytes tensor_bytes_of(const Container& c) {
  struct Entry {
    QuantFormat format;
    std::vector<int64_t> shape;
  };
  auto index = std::make_shared<std::unordered_map<std::string, Entry>>();
  for (const Blob& b : c.manifest().blobs)
    if (b.kind == "tensor" || b.kind == "expert")  // an expert blob's parts: its gate, up and down (an untiered run's arena)
      for (const BlobPart& p : b.parts) (*index)[p.name] = {p.format, p.shape};
  const std::string where = c.where();
  return [index, where](const TensorDesc& t) -> uint64_t {
    auto it = index->find(t.name);
    if (it == index->end() && t.role == TensorRole::kLmHead) it = index->find("model.embed_tokens.weight");  // tied
    if (it == index->end() && t.name.rfind("mtp.", 0) == 0) return uint64_t(0);  // a container without the MTP module: none bound
    if (it == index->end()) throw Error(where + ": no tensor '" + t.name + "'");
    return t.form == TensorForm::kVector ? elements(t.shape) * 4 : matrix_bytes(it->second.format, it->second.shape, t.name);
  };
}

bool grouped_expert_formats(QuantFormat gate, QuantFormat up, QuantFormat down, int64_t gate_cols, int64_t down_cols) {
  auto int8 = [](QuantFormat f) { return f == QuantFormat::I8; };
  auto takes = [&](QuantFormat f) { return int8(f) || is_int4(f); };
  return takes(gate) && takes(up) && takes(down) && int8(gate) == int8(up) && gate_cols % 32 == 0 && down_cols % 32 == 0;
}

ExpertParts expert_parts_of(const Model& m) {
  const ExpertWeights& x = m.layer(m.spec().first_sparse_layer()).moe.experts.at(0);
  ExpertParts p{x.gate.bytes(), x.up.bytes(), x.down.bytes()};
  p.grouped = grouped_expert_formats(x.gate.format, x.up.format, x.down.format, x.gate.cols, x.down.cols);
  return p;
}

ExpertParts expert_parts_of(const Container& c) {
  for (const Blob& b : c.manifest().blobs)
    if (b.kind == "expert" && b.expert == 0 && b.parts.size() == 3) {  // the first sparse layer's first expert
      ExpertParts p{matrix_bytes(b.parts[0].format, b.parts[0].shape, b.parts[0].name), matrix_bytes(b.parts[1].format, b.parts[1].shape, b.parts[1].name),
                    matrix_bytes(b.parts[2].format, b.parts[2].shape, b.parts[2].name)};
      auto cols = [](const std::vector<int64_t>& shape) { return shape.size() == 2 ? shape[1] : int64_t(0); };
      p.grouped = grouped_expert_formats(b.parts[0].format, b.parts[1].format, b.parts[2].format, cols(b.parts[0].shape), cols(b.parts[2].shape));
      return p;
    }
  throw Error(c.where() + ": no routed expert 0 of layer 0 (the VRAM ledger sizes the expert slots from it)");
}

ExpertSlot expert_slot(const ExpertParts& p) { return {device_padded(p.gate), device_padded(p.up), device_padded(p.down)}; }

uint64_t arena_bytes(const ModelSpec& s, const TensorBytes& bytes, bool tiered, bool mtp) {
  mtp = mtp && s.mtp_layers > 0;
  uint64_t total = 0;
  for (const TensorDesc& t : model_tensors(s, true))  // lm_head even when tied; the MTP module's fc and norms with mtp
    if (mtp || !is_mtp_tensor(s, t)) total += device_padded(bytes(t));
  for (int l = 0; l < (mtp ? s.num_layers_with_mtp() : s.num_layers); ++l)
    for (const TensorDesc& t : layer_tensors(s, l))
      if (!tiered || t.expert < 0) total += device_padded(bytes(t));
  return total;
}

uint64_t inv_freq_bytes(const ModelSpec& s) { return uint64_t(std::max(1, s.rotary_dim / 2)) * 4; }

namespace {
uint64_t aligned_sum(std::initializer_list<std::size_t> four_byte_counts) {
  uint64_t n = 0;
  for (std::size_t c : four_byte_counts) n += device_padded(uint64_t(c) * 4);
  return n;
}
}  // namespace

uint64_t ChunkBuffers::mixer_bytes() const { return aligned_sum({proj, z, b, a, conv_out, heads_out, k, v, gdn_work}); }
uint64_t ChunkBuffers::moe_bytes() const { return aligned_sum({rlogits, router_work, ridx, rw, sg, su, act, order, offsets, ey}); }

uint64_t ChunkBuffers::bytes() const {
  const uint64_t floats = x + hn + mix + sh + routed + sgate + qx_scale;
  return shared_bytes() + 4 * floats + 4 * qx_sum + qx_codes;
}

ChunkBuffers chunk_buffers(const ModelSpec& s, int T, bool chunked_gdn) {
  ChunkBuffers c;
  c.T = T;
  const std::size_t H = s.hidden_size, t = T;
  const std::size_t qg = std::size_t(s.num_heads) * s.head_dim * 2, cd = s.linear_conv_dim();
  const std::size_t heads_out = std::max<std::size_t>(std::size_t(s.num_heads) * s.head_dim, s.linear_value_dim());
  const std::size_t kv = std::size_t(s.num_kv_heads) * s.head_dim, K = s.num_experts_per_tok;
  c.x = c.hn = c.mix = c.sh = c.routed = t * H;
  c.proj = t * std::max(qg, cd);
  c.z = t * s.linear_value_dim(), c.b = c.a = t * s.linear_num_value_heads;
  c.conv_out = t * cd, c.heads_out = t * heads_out, c.k = c.v = t * kv;
  c.rlogits = t * s.num_experts, c.ridx = c.rw = t * (K + 1);
  c.sg = c.su = t * std::max(s.shared_expert_intermediate_size, s.intermediate_size), c.sgate = t;  // the shared expert, or a dense layer's MLP
  c.act = t * (K + 1) * s.moe_intermediate_size;
  c.order = t * K, c.offsets = 2 * (std::size_t(s.num_experts) + 1);
  c.ey = T >= kMoeGroupedMinTokens ? t * K * H : 1;
  if (T >= kFloatTiledMinTokens) c.router_work = float_tiled_work_floats(T, s.num_experts, s.hidden_size);
  if (chunked_gdn && s.num_attention_layers() < s.num_layers)
    c.gdn_work = gdn_chunk_workspace_floats(T, s.linear_num_value_heads, s.linear_key_head_dim, s.linear_value_head_dim);
  const std::size_t widest = std::max({H, std::size_t(s.linear_value_dim()), std::size_t(s.num_heads) * s.head_dim,
                                       std::size_t(s.moe_intermediate_size), std::size_t(s.shared_expert_intermediate_size),
                                       std::size_t(s.intermediate_size), s.mtp_layers > 0 ? 2 * H : H});  // the MTP's fc reads [embedding | hidden]
  const std::size_t qn = std::max(t * widest, t * (K + 1) * s.moe_intermediate_size) + 32;
  c.qx_codes = qn, c.qx_scale = c.qx_sum = qn / 32 + 1;
  return c;
}

RuntimeReserve runtime_reserve(const ModelSpec& s, const VramSettings& run, uint64_t slot) {
  RuntimeReserve r;
  const uint64_t n_ctx = run.context_tokens(), T = run.chunk_tokens();
  const uint64_t attn = s.num_attention_layers(), linear = uint64_t(s.num_layers) - attn;
  const uint64_t kv = uint64_t(s.num_kv_heads) * s.head_dim;
  const uint64_t seqs = run.sequence_count();
  r.kv = seqs * attn * n_ctx * kv * 2 * 4;  // K and V
  r.state = seqs * linear * (uint64_t(s.linear_conv_kernel - 1) * s.linear_conv_dim() +
                             uint64_t(s.linear_num_value_heads) * s.linear_key_head_dim * s.linear_value_head_dim) * 4;
  if (attn > 0) {  // at the context size (CudaBackend::prepare)
    const bool split = run.split_kv && attention_split_supported(s.head_dim);
    uint64_t scratch = 0;
    int kps = 0;
    for (uint64_t t : {uint64_t(1), T, seqs})  // a decode step, a prompt chunk, a rows step (one row a sequence)
      scratch = split ? std::max(scratch, t * s.num_heads * (s.head_dim + 2) * attention_splits(int(t), int(n_ctx), &kps))
                      : std::max(scratch, t * s.num_heads * n_ctx);
    r.attention_scratch = scratch * 4;
  }
  r.logits = seqs * (s.vocab_size * 4 + greedy_row_bytes());  // the last row's; a rows step's, one a sequence; their greedy ids
  r.fixed = uint64_t(8) << 20;  // decode graphs (measured 0.7 MiB), the allocations after the slots, rounding
  if (run.mtp && s.mtp_layers > 0) {
    const uint64_t cd = s.linear_conv_dim(), nv = s.linear_num_value_heads;
    r.mtp = n_ctx * kv * 2 * 4 + linear * (r.state / seqs / std::max<uint64_t>(linear, 1) + uint64_t(kRewindTokens) * (cd + 2 * nv) * 4) +
            3 * T * uint64_t(s.hidden_size) * 4 +        // a chunk's hidden rows, the fc's input [T, 2H]
            uint64_t(kRewindTokens - 1) * s.vocab_size * 4;  // a verify chunk's logits beyond the last row's
  }
  const uint64_t L = s.num_layers, E = s.num_experts;
  if (run.pcie_read_share > 0) r.pcie_read_tables = L * ((E + 2) * 3 * 8 + E + 3 * 256);
  if (run.decode_upload_max > 0) {
    const uint64_t k = run.decode_upload_max;
    r.decode_upload = k * slot + (k * s.moe_intermediate_size + s.hidden_size + k) * 4 * 3 + (uint64_t(2) << 20);
  }
  return r;
}

int prefill_stage_slots(const TierPlan& plan, bool swap, int ring) {
  int most = 0;
  for (int l = 0; l < plan.layers; ++l)
    if (plan.has_experts(l)) most = std::max(most, plan.experts - plan.resident_in_layer(l));
  // A ring's groups are made from the residency at each chunk's start (a
  // swap in flight included): no room kept for swaps.
  if (ring > 0) return std::min(most, ring);
  return std::min(plan.experts, most + (swap && plan.count > 0 ? kTierSwapsInFlight : 0));
}

int prefill_ring_min(bool grouped, const VramSettings& run) {
  return grouped ? (run.prefill_ring_slots > 0 ? run.prefill_ring_slots : kPrefillRingSlots) : 0;
}

int prefill_ring_size(int ring_min, long long room) {
  if (ring_min <= 0) return 0;
  return static_cast<int>(std::max<long long>(ring_min, std::min<long long>(room / 16, 1 << 20)));
}

uint64_t prefill_table_bytes(int layers, int experts) {
  // Per layer: the gate, up and down pointer tables (experts + 1: the
  // shared expert), the handoff's flags, the host's choice and its experts'
  // three host addresses (hot host experts); one counter of those.
  return uint64_t(layers) * ((uint64_t(experts) + 1) * 8 * 3 + 2 * uint64_t(experts) + 8 * 3 * uint64_t(experts)) + 8;
}

TierFill fill_tier(const TierFillInputs& in) {
  TierFill f;
  const int L = in.layers, E = in.experts;
  const uint64_t slot = in.slot;
  f.need = in.reserve + slot;
  // What the run charges later and the zero expert must fit now.
  if (in.avail != kNoLimit && in.avail < f.need) return f;
  f.fits = true;
  long long slots = in.expert_slots;
  if (slots < 0) slots = in.avail == kNoLimit || slot == 0 ? static_cast<long long>(L) * E : static_cast<long long>((in.avail - in.reserve) / slot) - 1;
  f.plan = plan_tier(L, E, slots, in.heat, in.sparse);
  // Hybrid prefill's staging areas and tables come out of the slots.
  bool prefill = in.prefill_upload && !f.plan.all();
  const int ring = prefill_ring_size(in.prefill_ring, std::min<long long>(slots, f.plan.pairs()));
  if (prefill && in.avail != kNoLimit) {
    const TierPlan full = f.plan;
    const long long full_slots = slots;
    f.prefill_tables = prefill_table_bytes(L, E);
    auto fits = [&] {
      return in.reserve + slot * (f.plan.count + 1) + 2 * uint64_t(prefill_stage_slots(f.plan, in.swap, ring)) * slot + f.prefill_tables <=
             in.avail;
    };
    while (!fits() && in.expert_slots < 0 && f.plan.count > 0) {
      slots = std::max(0LL, slots - std::max(1LL, slots / 64));
      f.plan = plan_tier(L, E, slots, in.heat, in.sparse);
    }
    prefill = fits();
    if (!prefill) f.plan = full, slots = full_slots, f.prefill_tables = 0;  // prompts hand their misses to the host as decode steps do
  }
  f.slots = slots;
  f.prefill = prefill;
  if (prefill) {
    f.stage_slots = prefill_stage_slots(f.plan, in.swap, ring);
    f.stage_bytes = 2 * uint64_t(f.stage_slots) * slot;
    f.prefill_tables = prefill_table_bytes(L, E);
  }
  f.slot_array = slot * (uint64_t(f.plan.count) + (f.plan.all() ? 0 : 1));
  return f;
}

VramLedger::VramLedger(const ModelSpec& s, const TensorBytes& bytes, const ExpertParts& expert, const VramSettings& run) : s_(s), run_(run) {
  arena_ = arena_bytes(s_, bytes, run_.tiered(), run_.mtp);
  inv_freq_ = inv_freq_bytes(s_);
  buffers_ = chunk_buffers(s_, run_.chunk_tokens(), run_.chunked_gdn);
  slot_ = expert_slot(expert);
  grouped_ = expert.grouped;
  reserve_ = runtime_reserve(s_, run_, slot_.bytes());
}

VramLedger::VramLedger(const Model& m, const VramSettings& run)
    : VramLedger(m.spec(), device_bytes(tensor_bytes_of(m), embedding_on_host(run.tiered(), m.embed().format)), expert_parts_of(m), run) {}

VramLedger::VramLedger(const Container& c, const ModelSpec& s, const VramSettings& run)
    : VramLedger(s, device_bytes(tensor_bytes_of(c), embedding_on_host(run.tiered(), embed_format_of(c))), expert_parts_of(c), run) {}

TierFill VramLedger::fill(uint64_t budget, const std::vector<uint64_t>* heat) const {
  TierFillInputs in;
  in.layers = s_.num_layers, in.experts = s_.num_experts;
  in.avail = budget == 0 ? kNoLimit : budget > before_slots() ? budget - before_slots() : 0;
  in.reserve = reserve_.total(), in.slot = slot_.bytes();
  in.expert_slots = run_.expert_slots;
  in.prefill_upload = run_.prefill_upload, in.swap = run_.swap, in.prefill_ring = prefill_ring();
  in.heat = heat;
  in.sparse = s_.sparse_layers.empty() ? nullptr : &s_.sparse_layers;
  return fill_tier(in);
}

long long VramLedger::expert_slots(uint64_t budget) const {
  if (budget == 0) return run_.expert_slots >= 0 ? run_.expert_slots : static_cast<long long>(s_.num_sparse_layers()) * s_.num_experts;
  if (budget < device_floor()) return -1;
  if (run_.expert_slots >= 0) return run_.expert_slots;
  if (slot_.bytes() == 0) return static_cast<long long>(s_.num_sparse_layers()) * s_.num_experts;
  return static_cast<long long>((budget - before_slots() - reserve_.total()) / slot_.bytes()) - 1;
}

}  // namespace coli
