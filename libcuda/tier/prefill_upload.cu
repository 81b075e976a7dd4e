// Hybrid prefill's uploads (CudaOptions::prefill_upload; expert_tier.cuh:
// PrefillUpload). A prompt chunk's experts outside the tier come to the
// device a unit at a time (a whole layer, or with a ring a range of its
// experts), ahead, into two alternating staging areas, and run with the
// residents as grouped GEMMs; with a ring some of a layer's non-residents
// may go to the host instead (CudaOptions::prefill_cpu_experts).
#include <cmath>
#include <cstdio>
#include <algorithm>
#include <thread>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "expert_tier.cuh"
#include "placement/prefill_split.h"
#include "prefill_stager.cuh"

namespace coli::cuda::detail {

// Staging slots per area (the VRAM ledger's prefill_stage_slots): without
// a ring the most experts a layer leaves out, plus one per swap in flight
// (a swap evicts its victim before the candidate's copy lands, and swaps
// stay within a layer: SwapPolicyOptions::within_layer); with one at most
// kPrefillRingSlots, a layer then coming in groups.
void ExpertTier::init_prefill_upload(int stage_slots, bool ring) {
  const int L = s_.num_layers, E = s_.num_experts;
  const int most = stage_slots;
  pu_.stage_slots = most, pu_.ring = ring;
  {
    BudgetScope scope(budget_, "the prefill staging areas");
    pu_.stage.resize(2 * static_cast<std::size_t>(most) * slot_bytes_);
  }
  {
    BudgetScope scope(budget_, "the prefill expert tables");
    pu_.gate.resize(L), pu_.up.resize(L), pu_.down.resize(L), pu_.flags.resize(L);
    for (int l = 0; l < L; ++l) pu_.gate[l].resize(E + 1), pu_.up[l].resize(E + 1), pu_.down[l].resize(E + 1), pu_.flags[l].resize(E);
    {  // as the VRAM ledger counts them (prefill_table_bytes), used with a ring
      pu_.host.resize(L), pu_.host_at.resize(L);
      for (int l = 0; l < L; ++l) pu_.host[l].resize(E), pu_.host_at[l].resize(3 * static_cast<std::size_t>(E));
      pu_.hot.resize(1);
      check(cudaMemset(pu_.hot.get(), 0, sizeof(unsigned long long)), "prefill hot experts");
      int same = 0;  // registered memory at its host addresses (as pcie_read_set asks)
      if (!host_ptrs_) host_ptrs_ = cudaDeviceGetAttribute(&same, cudaDevAttrCanUseHostPointerForRegisteredMem, opt_.device) == cudaSuccess && same;
      cudaGetLastError();
    }
  }
  pu_.cpu_of.assign(L, 0);
  pu_.on_cpu.assign(static_cast<std::size_t>(L) * E, 0);
  pu_.share.assign(L, {});
  pu_.written.assign(L, {});
  // A heat from earlier runs says from the first chunk which experts the
  // routing leaves alone.
  if (opt_.prefill_cpu_by_routing && opt_.heat.size() == static_cast<std::size_t>(L) * E)
    for (int l = 0; l < L; ++l)
      update_routing_share(pu_.share[l], false, std::vector<uint64_t>(opt_.heat.begin() + static_cast<std::ptrdiff_t>(l) * E, opt_.heat.begin() + static_cast<std::ptrdiff_t>(l + 1) * E));
  check(cudaStreamCreateWithFlags(&pu_.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  // Pageable sources go through the stager's pinned ring on host threads of
  // its own (the host computes no experts while a chunk uploads); registered
  // ones straight.
  std::vector<std::pair<const void*, std::size_t>> pinned;
  for (auto [p, n] : pinned_) pinned.push_back({p, n});
  const int threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()) - 1, 1, 8);
  pu_.stager = std::make_unique<PrefillStager>(opt_.device, pu_.stream, threads, std::size_t(8) << 20, std::move(pinned));
  for (int b = 0; b < 2; ++b) {
    check(cudaEventCreateWithFlags(&pu_.uploaded[b], cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventCreateWithFlags(&pu_.used[b], cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventRecord(pu_.used[b], stream_), "event");  // nothing uses an area yet
    check(cudaEventRecord(pu_.uploaded[b], pu_.stream), "event");
  }
  pu_.on = true;
}

void ExpertTier::free_prefill_upload() {
  pu_.stager.reset();
  timeline_free();
  for (auto [a, z] : pu_.wait_ev) cudaEventDestroy(a), cudaEventDestroy(z);
  pu_.wait_ev.clear();
  if (pu_.stream) cudaStreamSynchronize(pu_.stream), cudaStreamDestroy(pu_.stream), pu_.stream = nullptr;
  for (int b = 0; b < 2; ++b) {
    if (pu_.uploaded[b]) cudaEventDestroy(pu_.uploaded[b]), pu_.uploaded[b] = nullptr;
    if (pu_.used[b]) cudaEventDestroy(pu_.used[b]), pu_.used[b] = nullptr;
  }
}

std::vector<int> ExpertTier::prefill_cpu_counts(int T) const {
  const int L = s_.num_layers, E = s_.num_experts, want = opt_.prefill_cpu_experts;
  std::vector<int> counts(L, 0);
  // Without a ring a layer's experts are one unit and may run as the
  // per-pair kernels, which do not take a null entry; from pageable memory
  // the stager's host threads fill the copies (the auto split stays off).
  if (!pu_.ring || want == 0 || !handoff_ || (want < 0 && pinned_.empty())) return counts;
  PrefillCosts c;
  c.upload_s = expert_upload_s();
  c.cpu_read_s = expert_host_read_s();
  c.cpu_token_s = pu_.pair_s > 0 ? pu_.pair_s : host_pair_floor_s();
  c.cpu_fixed_s = 40e-6;  // the handoff's round trip (MachineRates::handoff_s)
  // The GPU's expert work per pair: the measured prompt rate with every
  // expert resident per (token, layer) over its k pairs; and the
  // handoff's rows down and partial sums up, T hidden floats each way.
  c.gpu_token_s = opt_.prefill_layer_token_s / s_.num_experts_per_tok;
  c.handoff_gpu_s = 2.0 * T * s_.hidden_size * sizeof(float) / (std::max(opt_.pcie_gbs, 1e-3) * 1e9);
  // The mixer's time (about half a layer's), in which the layer's first
  // two units upload, at most two areas of them.
  c.gpu_head_s = std::min(0.5 * T * opt_.prefill_layer_token_s, 2.0 * pu_.stage_slots * c.upload_s);
  const double layer_pairs = static_cast<double>(T) * s_.num_experts_per_tok, pairs = layer_pairs / E;
  for (int l = 0; l < L; ++l) {
    if (layer_full_[l]) continue;
    const int missing = E - plan_.resident_in_layer(l);
    if (want > 0) {
      counts[l] = std::min(want, missing);
      continue;
    }
    int n = 0;
    if (!pu_.share[l].empty()) {  // the least routed first, each with the pairs its share expects
      std::vector<double> expect;
      for (int e : prefill_cpu_order(resident_flags(l), pu_.share[l])) expect.push_back(expected_pairs(pu_.share[l][e], layer_pairs, E, pu_.trust));
      n = prefill_cpu_count(expect, layer_pairs, c);
    } else {
      n = prefill_cpu_count(missing, pairs, layer_pairs, c);
    }
    counts[l] = std::max(0, n + static_cast<int>(std::lround(pu_.cpu_bias)));
  }
  return counts;
}

std::vector<uint8_t> ExpertTier::resident_flags(int l) const {
  std::vector<uint8_t> r(s_.num_experts);
  for (int e = 0; e < s_.num_experts; ++e) r[e] = plan_.is_resident(l, e) ? 1 : 0;
  return r;
}

void ExpertTier::observe_prefill_routing() {
  const int tokens = pu_.pass_tokens;
  pu_.pass_tokens = 0;
  if (!heat_ || tokens == 0 || !opt_.prefill_cpu_by_routing) return;
  // After the chunk drained: the routing counts since the last look (the
  // backend's read_heat and the swaps' windows clear them, and say so).
  const int L = s_.num_layers, E = s_.num_experts;
  const std::size_t n = static_cast<std::size_t>(L) * E;
  std::vector<uint64_t> now(n);
  static_assert(sizeof(unsigned long long) == sizeof(uint64_t));
  check(cudaMemcpy(now.data(), heat_, n * sizeof(uint64_t), cudaMemcpyDeviceToHost), "prefill routing counts");
  if (pu_.heat_seen.size() != n) pu_.heat_seen.assign(n, 0);
  std::vector<uint64_t> counts(E);
  for (int l = 0; l < L; ++l) {
    const std::size_t o = static_cast<std::size_t>(l) * E;
    for (int e = 0; e < E; ++e) counts[e] = now[o + e] - std::min(now[o + e], pu_.heat_seen[o + e]);
    update_routing_share(pu_.share[l], !pu_.share[l].empty(), counts);
  }
  pu_.heat_seen = std::move(now);
}

void ExpertTier::measure_prefill_cpu() {
  if (!handoff_) return;
  // The host's time per pair beyond reading the expert, from the prompt
  // posts since the last look (the third place's and, without uploads,
  // the prompts' misses): what the next chunks' split assumes.
  const ExpertHandoff::Stats h = handoff_->prompt_stats();
  const long experts = h.prompt_experts - pu_.seen.prompt_experts, pairs = h.prompt_misses - pu_.seen.prompt_misses;
  const double host_s = (h.prompt_host_ms - pu_.seen.prompt_host_ms) / 1e3;
  pu_.seen = h;
  const double read_s = expert_host_read_s();
  // Smoothed, and never below the unmeasured estimate (a chunk whose host
  // time hardly exceeds its reads would otherwise say the pairs cost
  // nothing, and the next chunk hand the host far too many). Only from
  // chunks of at least 4 pairs an expert: the least routed experts bring
  // the host one or two, and its fixed costs of a layer (the partial
  // sums' rows) spread over so few pairs would say a pair costs many
  // times what it does; the next chunk would hand the host fewer, then
  // none, and no chunk would measure again. (With the id order, as before.)
  const bool routed = opt_.prefill_cpu_by_routing;
  if (experts >= 4 && pairs > 0 && (!routed || pairs >= 4 * experts)) {
    const double now = std::max(host_pair_floor_s(), (host_s - experts * read_s) / static_cast<double>(pairs));
    pu_.pair_s = pu_.pair_s > 0 ? 0.5 * (pu_.pair_s + now) : now;
  }
  // The GPU's waits for the host in a chunk that handed it experts (auto
  // counts only): the next chunks' correction. A device read, after the
  // chunk drained; decode steps do not come here.
  const int layers = pu_.cpu_layers;
  pu_.cpu_layers = 0;
  const double wait_ms = handoff_->stats().prompt_wait_ms, waited_s = layers ? (wait_ms - pu_.seen_wait_ms) / 1e3 / layers : 0.0;
  pu_.seen_wait_ms = wait_ms;
  if (timeline() && pu_.pass_tokens > 0) {
    unsigned long long hot = 0;
    if (pu_.hot.get()) check(cudaMemcpy(&hot, pu_.hot.get(), sizeof hot, cudaMemcpyDeviceToHost), "prefill hot experts");
    std::fprintf(stderr, "coli prefill third place: %d layers, %ld experts (%.1f pairs expected, %.1f by share, %.1f by the mean, %ld came; %llu hot ones read over PCIe), the GPU waited %.3f ms a layer; %.2f us a pair, bias %.2f, trust %.2f\n",
                 layers, experts, pu_.pairs_per_expert * static_cast<double>(experts), pu_.expect_share, pu_.expect_mean, pairs, hot - pu_.hot_seen, waited_s * 1e3,
                 pu_.pair_s * 1e6, pu_.cpu_bias, pu_.trust);
    pu_.hot_seen = hot;
  }
  // By routing: how far the shares foretold what the host's experts got.
  if (routed && pu_.pass_tokens > 0 && pairs >= 0)
    pu_.trust = update_routing_trust(pu_.trust, static_cast<double>(pairs), pu_.expect_share, pu_.expect_mean);
  if (opt_.prefill_cpu_experts >= 0 || pu_.pass_tokens == 0) return;
  // By routing, a chunk that handed the host nothing waited for nothing:
  // the bias moves back as after a chunk without a wait, so that a bias
  // that took every expert from the host does not keep it so; and one
  // chunk moves at most half of the host's experts. With the id order the
  // correction is as measured before (call S1 of docs/perf/families.md).
  if (!routed && layers == 0) return;
  const double cpu_expert_s = read_s + pu_.pairs_per_expert * (pu_.pair_s > 0 ? pu_.pair_s : 0.0);
  const double host_experts = !routed ? std::numeric_limits<double>::infinity()
                              : layers ? std::accumulate(pu_.cpu_of.begin(), pu_.cpu_of.end(), 0.0) / layers
                                       : 0.0;
  pu_.cpu_bias = prefill_cpu_bias(pu_.cpu_bias, layers ? std::max(0.0, waited_s) : 0.0, cpu_expert_s, expert_upload_s(), host_experts);
}

void ExpertTier::refresh_prefill_tables(const std::vector<int>& cpu) {
  const int L = s_.num_layers, E = s_.num_experts, A = pu_.stage_slots;
  // The host's experts: per layer the first cpu[l] of prefill_cpu_order.
  // A layer keeps the ones it has while they are expected to bring the
  // host at most 10 % (and 0.2 % of the layer's pairs) more than the
  // least routed would: the shares move a little with every chunk, and a
  // new choice costs the tables' copies.
  const bool all = pu_.residency_gen != residency_gen_;
  std::vector<uint8_t> want(static_cast<std::size_t>(L) * E, 0);
  std::vector<uint8_t> dirty(L, all ? 1 : 0);  // a layer's choice changed
  for (int l = 0; l < L; ++l) {
    if (layer_full_[l] || !pu_.ring || cpu[l] == 0) continue;
    const auto row = pu_.on_cpu.begin() + static_cast<std::ptrdiff_t>(l) * E;
    // After a residency change the old choice may hold residents: choose anew.
    const std::vector<uint8_t> had = all ? std::vector<uint8_t>(E, 0) : std::vector<uint8_t>(row, row + E);
    const std::vector<uint8_t> w = prefill_cpu_choice(prefill_cpu_order(resident_flags(l), pu_.share[l]), cpu[l], pu_.share[l], had);
    std::copy(w.begin(), w.end(), want.begin() + static_cast<std::ptrdiff_t>(l) * E);
  }
  for (int l = 0; l < L; ++l)
    dirty[l] |= !std::equal(want.begin() + static_cast<std::ptrdiff_t>(l) * E, want.begin() + static_cast<std::ptrdiff_t>(l + 1) * E,
                            pu_.on_cpu.begin() + static_cast<std::ptrdiff_t>(l) * E);
  if (!all && pu_.cpu_of == cpu && std::none_of(dirty.begin(), dirty.end(), [](uint8_t x) { return x != 0; })) return;
  // Kernels of an earlier chunk may still read the tables.
  check(cudaStreamSynchronize(stream_), "prefill expert tables");
  std::vector<const uint8_t*> g(E + 1), u(E + 1), d(E + 1);
  std::vector<uint8_t> flags(E);
  pu_.units.clear();
  pu_.first_unit.assign(L, -1), pu_.unit_count.assign(L, 0);
  pu_.on_cpu = std::move(want);
  for (int l = 0; l < L; ++l) {
    if (layer_full_[l]) continue;
    const int missing = E - plan_.resident_in_layer(l);
    uint8_t* on_cpu = pu_.on_cpu.data() + static_cast<std::size_t>(l) * E;
    if (!pu_.ring && missing > A) {  // its misses go to the host, as in a decode step
      std::fill(on_cpu, on_cpu + E, 0);
      continue;
    }
    // Units: ranges of expert ids, each holding at most A uploads (without
    // a ring one unit, the whole layer).
    pu_.first_unit[l] = static_cast<int>(pu_.units.size());
    int e0 = 0, rank = 0;
    for (int e = 0; e < E; ++e) {
      const long long slot = slot_of_[static_cast<std::size_t>(l) * E + e];
      const bool res = plan_.is_resident(l, e) && slot >= 0;
      flags[e] = !on_cpu[e];
      if (on_cpu[e]) {  // a null entry: the grouped kernels give its pairs 0, the host adds its part
        g[e] = u[e] = d[e] = nullptr;
        continue;
      }
      if (!res && rank == A) pu_.units.push_back({l, e0, e}), e0 = e, rank = 0;
      const int area = static_cast<int>(pu_.units.size()) % 2;
      const uint8_t* base = res ? slot_address(slot) : pu_.stage.get() + (static_cast<std::size_t>(area) * A + rank) * slot_bytes_;
      rank += !res;
      g[e] = base, u[e] = base + slot_up_, d[e] = base + slot_down_;
    }
    pu_.units.push_back({l, e0, E});
    pu_.unit_count[l] = static_cast<int>(pu_.units.size()) - pu_.first_unit[l];
    g[E] = shared_[l][0], u[E] = shared_[l][1], d[E] = shared_[l][2];
    // Only what differs from the device's tables. A layer whose own choice
    // did not change may still move between the staging areas: a unit's
    // area is its index's parity, and an earlier layer's count of units
    // changes with its choice.
    PrefillUpload::Tables& was = pu_.written[l];
    // The host's choice and where the GPU would read each over PCIe when
    // the chunk makes it hot (read_hot_host_experts): registered bytes only.
    if (hot_on()) {
      std::vector<uint8_t> host(on_cpu, on_cpu + E);
      std::vector<const uint8_t*> at(3 * static_cast<std::size_t>(E), nullptr);
      for (int e = 0; e < E; ++e) {
        const ExpertWeights& x = model_.layer(l).moe.experts[e];
        if (host[e] && in_pinned_memory(x)) at[3 * e] = mapped(x.gate.data), at[3 * e + 1] = mapped(x.up.data), at[3 * e + 2] = mapped(x.down.data);
      }
      if (was.host != host || was.at != at) {
        check(cudaMemcpy(pu_.host[l].get(), host.data(), E, cudaMemcpyHostToDevice), "prefill host experts");
        check(cudaMemcpy(pu_.host_at[l].get(), at.data(), at.size() * sizeof(void*), cudaMemcpyHostToDevice), "prefill host experts");
        was.host = std::move(host), was.at = std::move(at);
      }
    }
    if (was.g == g && was.u == u && was.d == d && was.flags == flags) continue;
    check(cudaMemcpy(pu_.gate[l].get(), g.data(), (E + 1) * sizeof(void*), cudaMemcpyHostToDevice), "prefill expert table");
    check(cudaMemcpy(pu_.up[l].get(), u.data(), (E + 1) * sizeof(void*), cudaMemcpyHostToDevice), "prefill expert table");
    check(cudaMemcpy(pu_.down[l].get(), d.data(), (E + 1) * sizeof(void*), cudaMemcpyHostToDevice), "prefill expert table");
    check(cudaMemcpy(pu_.flags[l].get(), flags.data(), E, cudaMemcpyHostToDevice), "prefill expert flags");
    was.g = g, was.u = u, was.d = d, was.flags = flags;
  }
  pu_.residency_gen = residency_gen_;
  pu_.cpu_of = cpu;
}

void ExpertTier::upload_unit(int u) {
  const PrefillUpload::Unit& unit = pu_.units[static_cast<std::size_t>(u)];
  const int l = unit.layer, b = u % 2;
  uint8_t* area = pu_.stage.get() + static_cast<std::size_t>(b) * pu_.stage_slots * slot_bytes_;
  // One copy per contiguous run: an expert's gate, up and down are one
  // blob in the container and the mirror, and a slot keeps their layout
  // when their sizes are 256-byte multiples. A copy costs the copy engine
  // a few microseconds of its own, so a few large ones beat many small.
  std::vector<PrefillStager::Copy> pieces;
  auto add = [&](uint8_t* dst, const uint8_t* src, std::size_t n) {
    if (!pieces.empty() && pieces.back().dst + pieces.back().n == dst && pieces.back().src + pieces.back().n == src) pieces.back().n += n;
    else pieces.push_back({dst, src, n});
  };
  int rank = 0;
  const uint8_t* on_cpu = pu_.on_cpu.data() + static_cast<std::size_t>(l) * s_.num_experts;
  for (int e = unit.e0; e < unit.e1; ++e) {
    if (plan_.is_resident(l, e) || on_cpu[e]) continue;
    const ExpertWeights& x = model_.layer(l).moe.experts[e];
    uint8_t* dst = area + static_cast<std::size_t>(rank++) * slot_bytes_;
    add(dst, x.gate.data, x.gate.bytes());
    add(dst + slot_up_, x.up.data, x.up.bytes());
    add(dst + slot_down_, x.down.data, x.down.bytes());
    pu_.bytes += expert_bytes_, ++pu_.experts;
  }
  pu_.copies += static_cast<long long>(pieces.size());
  // After every kernel that read this area for the unit two before; then
  // the area's event, which the unit's experts wait for.
  const bool timed = pu_.timed_chunk && static_cast<std::size_t>(u) < pu_.times.size();
  pu_.ticket[b] = pu_.stager->post(std::move(pieces), pu_.used[b], pu_.uploaded[b], timed ? pu_.times[u].up0 : nullptr, timed ? pu_.times[u].up1 : nullptr);
}

}  // namespace coli::cuda::detail
