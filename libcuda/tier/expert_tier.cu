// ExpertTier: the tables, the slots' first fill, the PCIe-read set and a
// layer's step (see expert_tier.cuh). Swaps, prefill staging and decode
// uploads live in their own files.
#include "expert_tier.cuh"

#include <algorithm>
#include <cstring>

#include "placement/prefill_split.h"
#include "decode_upload.cuh"
#include "prefill_stager.cuh"
#include "staged_upload.cuh"

namespace coli::cuda::detail {

ExpertTier::ExpertTier(const Setup& su, std::vector<LayerInput> layers)
    : model_(*su.model), s_(su.model->spec()), opt_(*su.opt), budget_(su.budget), stream_(su.stream), pinned_(*su.pinned), pins_pending_(su.pins_pending) {
  // The layers given: the model's, then the MTP layer's when it runs on
  // the device (its experts in the arena, or under a tier on the host:
  // only described here; the tier's slots, plans and heat cover the
  // model's layers).
  const int L = static_cast<int>(layers.size());
  tiered_ = vram_settings(opt_).tiered();
  experts_.resize(L);
  shared_.resize(L);
  for (int l = 0; l < L; ++l) {
    experts_[l].table = layers[l].formats;
    experts_[l].shared_at_E = layers[l].shared_at_E;
    shared_[l] = layers[l].shared;
  }
  if (!tiered_) {  // every expert in the weight arena
    BudgetScope scope(budget_, "the weights outside the routed experts");
    for (int l = 0; l < L; ++l) set_tables(l, std::move(layers[l].gate), std::move(layers[l].up), std::move(layers[l].down));
    return;
  }
  build(*su.uploader);
}

// The device pointer tables of a layer's experts: entry e -> its gate / up
// / down bytes, then entry E: the shared expert, when it folds in.
// one_token: the one-token steps' table instead (DevExperts::one_table),
// whose entry E + 1 is the zero expert (zero: its gate, up and down; entry
// E too when the shared expert does not fold in); the main table is set
// too whenever it is, so one_table defaults to it.
void ExpertTier::set_tables(int layer, std::vector<const uint8_t*> gp, std::vector<const uint8_t*> upp, std::vector<const uint8_t*> dp, bool one_token,
                            const std::array<const uint8_t*, 3>& zero) {
  DevExperts& x = experts_[layer];
  const auto& sh = shared_[layer];
  if (x.shared_at_E) gp.push_back(sh[0]), upp.push_back(sh[1]), dp.push_back(sh[2]);
  else if (one_token) gp.push_back(zero[0]), upp.push_back(zero[1]), dp.push_back(zero[2]);
  if (one_token) gp.push_back(zero[0]), upp.push_back(zero[1]), dp.push_back(zero[2]);  // entry E + 1
  const std::size_t np = gp.size();
  auto& g = one_token ? x.one_gate_ptrs : x.gate_ptrs;
  auto& u = one_token ? x.one_up_ptrs : x.up_ptrs;
  auto& w = one_token ? x.one_down_ptrs : x.down_ptrs;
  g.resize(np), u.resize(np), w.resize(np);
  check(cudaMemcpy(g.get(), gp.data(), np * sizeof(void*), cudaMemcpyHostToDevice), "expert table");
  check(cudaMemcpy(u.get(), upp.data(), np * sizeof(void*), cudaMemcpyHostToDevice), "expert table");
  check(cudaMemcpy(w.get(), dp.data(), np * sizeof(void*), cudaMemcpyHostToDevice), "expert table");
  ExpertTable& t = one_token ? x.one_table : x.table;
  t = x.table;  // format and shape
  t.gate_ptrs = g.get(), t.up_ptrs = u.get(), t.down_ptrs = w.get();
  if (!one_token && !x.one_gate_ptrs.get()) x.one_table = t;
}

// The device address of host bytes in a registered range: the same
// address where the device can use host pointers (host_ptrs_, asked once
// by pcie_read_set), else the driver's.
const uint8_t* ExpertTier::mapped(const uint8_t* host) const {
  if (host_ptrs_) return host;
  void* d = nullptr;
  check(cudaHostGetDevicePointer(&d, const_cast<uint8_t*>(host), 0), "cudaHostGetDevicePointer (PCIe reads)");
  return static_cast<const uint8_t*>(d);
}

// Which experts outside the tier one-token steps may read over PCIe in
// place (CudaOptions::pcie_read_share): those whose three matrices lie in a
// registered range; each step's split post picks among a layer's misses.
// Empty: none (off, or nothing registered).
std::vector<uint8_t> ExpertTier::pcie_read_set() {
  const int L = s_.num_layers, E = s_.num_experts;
  pcie_read_ = 0;
  if (!(opt_.pcie_read_share > 0) || plan_.all() || pinned_.empty()) return {};
  if (opt_.decode_upload_max > 0) throw Error("CUDA backend: pcie_read_share and decode_upload_max are two ways to the same misses: choose one");
  std::vector<uint8_t> set(static_cast<std::size_t>(L) * E, 0);
  for (int l = 0; l < L; ++l)
    for (int e = 0; e < (plan_.has_experts(l) ? E : 0); ++e) {
      const std::size_t i = static_cast<std::size_t>(l) * E + e;
      if (!plan_.resident[i] && in_pinned_memory(model_.layer(l).moe.experts[e])) set[i] = 1, ++pcie_read_;
    }
  if (!pcie_read_) return {};
  int same = 0;
  host_ptrs_ = cudaDeviceGetAttribute(&same, cudaDevAttrCanUseHostPointerForRegisteredMem, opt_.device) == cudaSuccess && same;
  cudaGetLastError();
  return set;
}

void ExpertTier::write_one_table(int l, const std::vector<uint8_t>& pcie) {
  if (!plan_.has_experts(l)) return;  // a dense layer: no routed experts, no tables (plan_layer never asks)
  const int E = s_.num_experts;
  const MoeWeights& moe = model_.layer(l).moe;
  const uint8_t* zero = slot_address(0);  // a tier that misses experts has the zero expert in slot 0
  std::vector<const uint8_t*> og(E), ou(E), od(E);
  std::vector<uint8_t> of(E);
  for (int e = 0; e < E; ++e) {
    const std::size_t i = static_cast<std::size_t>(l) * E + e;
    if (slot_of_[i] >= 0) {
      const uint8_t* at = slot_address(slot_of_[i]);
      og[e] = at, ou[e] = at + slot_up_, od[e] = at + slot_down_, of[e] = 1;
    } else if (pcie[i]) {  // read over PCIe at its host bytes
      const ExpertWeights& x = moe.experts[e];
      og[e] = mapped(x.gate.data), ou[e] = mapped(x.up.data), od[e] = mapped(x.down.data), of[e] = 2;
    } else {
      og[e] = zero, ou[e] = zero + slot_up_, od[e] = zero + slot_down_;
    }
  }
  BudgetScope scope(budget_, "the expert tables");
  one_resident_[l].resize(E);
  check(cudaMemcpy(one_resident_[l].get(), of.data(), E, cudaMemcpyHostToDevice), "expert tier flags");
  set_tables(l, std::move(og), std::move(ou), std::move(od), true, {zero, zero + slot_up_, zero + slot_down_});
}

void ExpertTier::adopt_pins() {
  if (!pins_pending_) return;
  pins_pending_ = false;
  if (!tiered_ || plan_.all()) return;
  if (pinned_.empty()) {  // refused
    pu_.on = false;
    return;
  }
  if (pu_.stager)
    for (auto [p, n] : pinned_) pu_.stager->add_pinned(p, n);
  const std::vector<uint8_t> pcie = pcie_read_set();
  if (!pcie.empty()) {
    one_resident_.resize(s_.num_layers);
    for (int l = 0; l < s_.num_layers; ++l) write_one_table(l, pcie);
  }
  if (handoff_ && opt_.decode_upload_max > 0 && !decode_upload_) {
    decode_upload_ = std::make_unique<DecodeUpload>(*this);
    if (decode_upload_->any_pinned()) handoff_->set_device_part(decode_upload_.get(), decode_upload_->out());
    else decode_upload_.reset();
  }
}

bool ExpertTier::in_pinned_memory(const ExpertWeights& x) const {
  auto pinned = [&](const Matrix& m) { return within_any(pinned_, m.data, m.bytes()); };
  return pinned(x.gate) && pinned(x.up) && pinned(x.down);
}

void ExpertTier::build(StagedUploader& uploader) {
  const int L = s_.num_layers, E = s_.num_experts;
  // A slot holds one expert's gate, up and down, each 256-byte aligned.
  const ExpertParts parts = expert_parts_of(model_);
  const ExpertSlot es = expert_slot(parts);
  const std::size_t pg = es.gate, pu = es.up, slot = es.bytes();
  expert_bytes_ = parts.gate + parts.up + parts.down;
  if (!opt_.heat.empty() && opt_.heat.size() != std::size_t(L) * E)
    throw Error("CUDA backend: the heat has " + std::to_string(opt_.heat.size()) + " counts, the model " + std::to_string(L * E) + " experts");
  // What the run will charge later (KV cache, state, scratch, logits, the
  // levers' tables and slots) and the zero expert must fit now, or the run
  // would fail part-way; the rest holds slots (and hybrid prefill's two
  // staging areas come out of them): the VRAM ledger's arithmetic.
  const VramSettings run = vram_settings(opt_);
  TierFillInputs in;
  in.layers = L, in.experts = E, in.avail = budget_->available(), in.reserve = coli::runtime_reserve(s_, run, slot).total(), in.slot = slot;
  in.expert_slots = opt_.expert_slots, in.prefill_upload = opt_.prefill_upload, in.swap = opt_.swap, in.prefill_ring = prefill_ring_min(parts.grouped, run);
  // The ledger's formats test and the kernels' must agree: a ring's layers
  // run as grouped GEMMs over expert ranges.
  if (parts.grouped != moe_grouped_supported(experts_[s_.first_sparse_layer()].table))
    throw Error("CUDA backend: the VRAM ledger and the grouped kernels disagree about the experts' formats (internal)");
  in.heat = opt_.heat.empty() ? nullptr : &opt_.heat;
  in.sparse = s_.sparse_layers.empty() ? nullptr : &s_.sparse_layers;
  const TierFill fill = fill_tier(in);
  if (!fill.fits)
    throw Error("--vram-budget " + format_bytes(budget_->limit()) + " exceeded: the KV cache for " + std::to_string(run.context_tokens()) +
                " tokens, the recurrent state and the scratch need " + format_bytes(fill.need) + " with " + format_bytes(budget_->in_use()) +
                " already in use by the trunk and the activations");
  plan_ = fill.plan;
  slot_bytes_ = slot;
  const bool prefill = fill.prefill;
  if (!plan_.all() && !opt_.expert_host)
    throw Error("CUDA backend: the expert tier holds " + std::to_string(plan_.count) + " of " + std::to_string(plan_.pairs()) +
                " experts and no host computes the others (CudaOptions::expert_host)");
  {
    BudgetScope scope(budget_, "the expert slots");
    slots_.resize(fill.slot_array);
  }
  uint8_t* next = slots_.get();
  const uint8_t* zero = nullptr;
  slot_bytes_ = slot, slot_up_ = pg, slot_down_ = pg + pu;
  slot_of_.assign(static_cast<std::size_t>(L) * E, -1);
  if (!plan_.all()) {  // slot 0: the zero expert every miss reads on the device
    check(cudaMemset(next, 0, slot), "zero expert");
    zero = next, next += slot;
  }
  resident_.resize(L);
  layer_full_.assign(L, 0);
  const std::vector<uint8_t> pcie = pcie_read_set();
  if (!pcie.empty()) one_resident_.resize(L);
  for (int l = 0; l < L; ++l) {
    if (!plan_.has_experts(l)) {  // a dense layer: its MLP is in the arena; never handed off
      layer_full_[l] = 1;
      continue;
    }
    const MoeWeights& moe = model_.layer(l).moe;
    std::vector<const uint8_t*> gp(E), upp(E), dp(E);
    std::vector<uint8_t> flags(E);
    for (int e = 0; e < E; ++e) {
      flags[e] = plan_.is_resident(l, e);
      if (!flags[e]) {
        gp[e] = zero, upp[e] = zero + pg, dp[e] = zero + pg + pu;
        continue;
      }
      const ExpertWeights& x = moe.experts[e];
      uploader.add(next, x.gate.data, x.gate.bytes());
      uploader.add(next + pg, x.up.data, x.up.bytes());
      uploader.add(next + pg + pu, x.down.data, x.down.bytes());
      gp[e] = next, upp[e] = next + pg, dp[e] = next + pg + pu;
      slot_of_[static_cast<std::size_t>(l) * E + e] = (next - slots_.get()) / static_cast<std::ptrdiff_t>(slot);
      next += slot;
    }
    layer_full_[l] = plan_.resident_in_layer(l) == E;
    full_layers_ += layer_full_[l];
    BudgetScope scope(budget_, "the expert tables");
    resident_[l].resize(E);
    check(cudaMemcpy(resident_[l].get(), flags.data(), E, cudaMemcpyHostToDevice), "expert tier flags");
    set_tables(l, std::move(gp), std::move(upp), std::move(dp));
  }
  for (int l = 0; l < L && !pcie.empty(); ++l) write_one_table(l, pcie);
  if (!plan_.all()) {
    handoff_ = std::make_unique<ExpertHandoff>(*opt_.expert_host, std::max(1, opt_.max_chunk), s_.num_experts_per_tok, s_.hidden_size, E,
                                               opt_.serve_handoff_inline);
    if (opt_.decode_upload_max > 0) {
      decode_upload_ = std::make_unique<DecodeUpload>(*this);
      if (decode_upload_->any_pinned()) handoff_->set_device_part(decode_upload_.get(), decode_upload_->out());
      else decode_upload_.reset();  // no expert in pinned memory (no registered mirror): nothing to upload from
    }
  }
  if (prefill) init_prefill_upload(fill.stage_slots, parts.grouped);
  if (!plan_.all() && opt_.swap && plan_.count > 0) init_swaps();  // after: its policy depends on the prefill uploads
}

ExpertTier::~ExpertTier() {
  free_swaps();
  if (stream_) cudaStreamSynchronize(stream_);  // a pending chunk's joins need the handoff's thread
  handoff_.reset();  // its thread calls the decode upload
  decode_upload_.reset();
  free_prefill_upload();
}

void ExpertTier::begin_chunk(int T) {
  swap_tick();  // swaps' table updates go before this chunk's kernels
  if (handoff_) handoff_->begin();  // its host thread serves the chunk's posts from now on
  // Counted as the backend's launch did: the handoff counts the layers it serves.
  full_layer_pairs_ += static_cast<long long>(handoff_ ? full_layers_ : s_.num_sparse_layers()) * T * s_.num_experts_per_tok;  // the handoff counts the others
  tokens_ += T;
}

void ExpertTier::abandon_chunk() {
  pu_.waits = 0;  // the failed chunk's waits are not counted
  pu_.timed_chunk = false;
  if (!handoff_) return;
  try {
    handoff_->end();
  } catch (...) {
  }
}

void ExpertTier::end_chunk() {
  // The stream has drained: the units' waits for their copies.
  for (std::size_t i = 0; i < pu_.waits; ++i) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, pu_.wait_ev[i].first, pu_.wait_ev[i].second) == cudaSuccess) pu_.wait_ms += ms;
    else cudaGetLastError();
  }
  pu_.waits = 0;
  if (pu_.timed_chunk) timeline_print();
  if (handoff_) handoff_->end();
  measure_prefill_cpu();
  observe_prefill_routing();
}

void ExpertTier::start_pass(int T) {
  if (!prefill_uploads(T)) return;
  // The first two units' experts (one per area), while the trunk starts;
  // each unit's group_done posts the unit two ahead.
  const std::vector<int> cpu = prefill_cpu_counts(T);
  refresh_prefill_tables(cpu);
  pu_.cpu_layers = static_cast<int>(std::count_if(cpu.begin(), cpu.end(), [](int n) { return n > 0; }));
  pu_.pass_tokens = T;
  // The pairs an expert the host takes is expected to bring (the measured
  // correction's cost of one): the mean, or where its share is known the
  // mean moved towards it as far as the shares are trusted; and by the
  // share and the mean alone, which the chunk's pairs will measure the
  // trust against.
  const double layer_pairs = static_cast<double>(T) * s_.num_experts_per_tok, mean = layer_pairs / s_.num_experts;
  double expect = 0;
  int taken = 0;
  pu_.expect_share = pu_.expect_mean = 0;
  for (int l = 0; l < s_.num_layers; ++l)
    for (int e = 0; e < s_.num_experts; ++e)
      if (pu_.on_cpu[static_cast<std::size_t>(l) * s_.num_experts + e]) {
        const bool known = !pu_.share[l].empty();
        ++taken, pu_.expect_mean += mean;
        pu_.expect_share += known ? pu_.share[l][e] * layer_pairs : mean;
        expect += known ? expected_pairs(pu_.share[l][e], layer_pairs, s_.num_experts, pu_.trust) : mean;
      }
  pu_.pairs_per_expert = taken ? expect / taken : mean;
  if (timeline()) timeline_start(T);
  for (int u = 0; u < 2 && u < static_cast<int>(pu_.units.size()); ++u) upload_unit(u);
}

ExpertTier::Step ExpertTier::plan_layer(int l, int T, bool pair_kernels) {
  Step st;
  const DevExperts& x = experts_[l];
  // A prompt chunk's non-residents come uploaded (prefill_upload.cu); else
  // the host computes them, as in a decode step.
  st.upload = tiered_ && uploads_layer(l, T);
  // With the CPU as third place an uploading layer hands its host experts
  // off too (their flags 0 in the prefill flags).
  const int on_cpu = st.upload ? pu_.cpu_of[l] : 0;
  st.handoff = hands_off(l) && (!st.upload || on_cpu > 0);
  if (st.upload && !st.handoff) upload_pairs_ += static_cast<long long>(T) * s_.num_experts_per_tok;  // the handoff counts its layers'
  if (st.upload) {
    const int resident = plan_.resident_in_layer(l);
    pu_.placed[0] += resident, pu_.placed[1] += s_.num_experts - resident - on_cpu, pu_.placed[2] += on_cpu;
  }
  // Steps of a few tokens whose experts go pair by pair (one-token decode,
  // a rows step, a verify window) read the PCIe experts in place
  // (pcie_read_share): their table and flags; prompt chunks the tier's.
  const bool few = pair_kernels && T <= opt_.tuning.pcie_rows_max && T * (s_.num_experts_per_tok + 1) <= kSplitPostPairs && s_.num_experts <= kSplitPostExperts;
  const bool one = (T == 1 || few) && !st.upload && !one_resident_.empty();
  st.table = one ? x.one_table : x.table;
  st.resident = one ? one_resident_[l].get() : st.upload && st.handoff ? pu_.flags[l].get() : st.handoff ? resident_[l].get() : nullptr;  // a whole model has no flags
  const bool rows_share = T > 1 && opt_.tuning.pcie_rows_share > 0 && opt_.pcie_read_share > 0;
  st.share = !one ? 0.0f : rows_share ? opt_.tuning.pcie_rows_share / 100.0f : static_cast<float>(opt_.pcie_read_share);
  if (st.share > 0 && st.handoff && split_inter() > 0 && T == 1) st.lim = handoff_->row_limits();
  if (st.upload) {
    st.table.gate_ptrs = pu_.gate[l].get(), st.table.up_ptrs = pu_.up[l].get(), st.table.down_ptrs = pu_.down[l].get();
    st.unit0 = pu_.first_unit[l], st.groups = pu_.unit_count[l];
  }
  return st;
}

void ExpertTier::post(const Step& st, int l, int* idx, const float* w, int ks, int T, const float* hn) {
  if (st.upload && T > 1) read_hot_host_experts(l, idx, ks, T);
  post_rows_ = hn;  // the decode upload's kernels read the same rows
  handoff_->post(l, idx, w, ks, T, st.resident, hn, stream_, st.share, static_cast<float>(opt_.pcie_read_offset), s_.num_experts + 1,
                 st.lim ? split_inter() : 0);
}

void ExpertTier::route_post(const Step& st, int l, const DevMatrix& router, const RouteArgs& r, unsigned* ticket) {
  post_rows_ = r.hn;
  handoff_->route_post(router, r, ticket, l, st.resident, stream_, st.share, static_cast<float>(opt_.pcie_read_offset), s_.num_experts + 1,
                       st.lim ? split_inter() : 0);
}

std::pair<int, int> ExpertTier::group_range(const Step& st, int g) const {
  if (!st.upload) return {0, s_.num_experts};
  const PrefillUpload::Unit& u = pu_.units.at(static_cast<std::size_t>(st.unit0 + g));
  return {u.e0, u.e1};
}

void ExpertTier::wait_group(const Step& st, int g) {
  if (!st.upload) return;
  // The unit's uploads: only its routed experts need them (the shared
  // expert and the earlier groups ran meanwhile). Its area's last job is
  // this unit's: the one two ahead is posted by this unit's group_done.
  const int b = (st.unit0 + g) % 2;
  pu_.stager->wait_issued(pu_.ticket[b]);
  if (pu_.waits == pu_.wait_ev.size()) {
    cudaEvent_t a = nullptr, z = nullptr;
    check(cudaEventCreate(&a), "cudaEventCreate");
    if (cudaEventCreate(&z) != cudaSuccess) cudaEventDestroy(a), check(cudaErrorMemoryAllocation, "cudaEventCreate");
    pu_.wait_ev.push_back({a, z});
  }
  const auto [before, after] = pu_.wait_ev[pu_.waits++];
  if (pu_.timed_chunk) timeline_record(&PrefillUpload::UnitTimes::wait0, st.unit0 + g, stream_);
  check(cudaEventRecord(before, stream_), "event");
  check(cudaStreamWaitEvent(stream_, pu_.uploaded[b]), "wait event");
  check(cudaEventRecord(after, stream_), "event");
  if (pu_.timed_chunk) timeline_record(&PrefillUpload::UnitTimes::wait1, st.unit0 + g, stream_);
}

void ExpertTier::group_done(const Step& st, int g) {
  if (!st.upload) return;
  const int u = st.unit0 + g;
  check(cudaEventRecord(pu_.used[u % 2], stream_), "event");  // the area is free once these kernels ran
  if (pu_.timed_chunk) timeline_record(&PrefillUpload::UnitTimes::done, u, stream_);
  if (u + 2 < static_cast<int>(pu_.units.size())) upload_unit(u + 2);
}

void ExpertTier::join(float* routed, int T) { handoff_->join(routed, T, stream_); }

void ExpertTier::join_norm(const NormArgs& a) { handoff_->join_norm(a, stream_); }

void ExpertTier::fill_stats(TierStats& t) const {
  t.tiered = tiered_;
  t.experts = static_cast<long long>(s_.num_sparse_layers()) * s_.num_experts;
  t.resident = tiered_ ? plan_.count : t.experts;
  t.pairs = full_layer_pairs_ + upload_pairs_;
  if (handoff_) {
    const ExpertHandoff::Stats h = handoff_->stats();
    t.pairs += h.pairs, t.misses = h.misses, t.handoffs = h.handoffs, t.device_misses = h.device_misses, t.pcie_misses = h.pcie_misses;
    t.host_experts_ms = h.host_ms, t.device_wait_ms = h.device_wait_ms, t.device_experts_ms = h.device_work_ms;
    // A decode post's misses are one expert each; a prompt post reads each
    // of its experts once for all of their pairs.
    t.host_expert_bytes = static_cast<uint64_t>(h.misses - h.device_misses - h.prompt_misses + h.prompt_experts) * expert_bytes_;
    t.pcie_expert_bytes = static_cast<uint64_t>(h.pcie_misses + h.device_misses) * expert_bytes_;
    // A split expert is a host miss; the device read its rows before the split.
    const uint64_t split_bytes = static_cast<uint64_t>(static_cast<double>(h.split_rows) / s_.moe_intermediate_size * expert_bytes_);
    t.pcie_expert_bytes += split_bytes, t.host_expert_bytes -= std::min(t.host_expert_bytes, split_bytes);
    t.split_misses = h.split_misses, t.prompt_misses = h.prompt_misses, t.prompt_experts = h.prompt_experts;
  }
  t.tokens = tokens_;
  t.swaps = swaps_done_, t.swap_bytes = swap_bytes_;
  t.prefill_upload_bytes = pu_.bytes;
  t.prefill_upload = pu_.on;
  t.prefill_wait_ms = pu_.wait_ms;
  t.prefill_placed_resident = pu_.placed[0], t.prefill_placed_uploaded = pu_.placed[1], t.prefill_placed_host = pu_.placed[2];
  if (pu_.hot.get()) {
    unsigned long long hot = 0;
    check(cudaMemcpy(&hot, pu_.hot.get(), sizeof hot, cudaMemcpyDeviceToHost), "prefill hot experts");
    t.prefill_hot_pcie = static_cast<long long>(hot);
  }
  if (handoff_) t.prefill_host_ms = handoff_->prompt_stats().prompt_host_ms;
  t.pcie_read = pcie_read_;
  t.pcie_read_share = pcie_read_ ? opt_.pcie_read_share : 0.0;
}

void ExpertTier::take_heat(std::vector<uint64_t>& counts) {
  if (!swap_policy_) return;  // what the swaps' windows took off the device
  drain_heat_window();
  for (std::size_t i = 0; i < counts.size(); ++i) counts[i] += heat_host_[i];
  std::fill(heat_host_.begin(), heat_host_.end(), 0);
}

}  // namespace coli::cuda::detail
