#include "placement/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "placement/device_sizes.h"
#include "placement/heat.h"
#include "placement/vram_ledger.h"
#include "util/error.h"

namespace coli {

namespace {

// The routing probabilities p(l, e): heat with a light prior (one token's
// worth spread evenly), so an expert the heat never saw keeps a small
// chance instead of none.
std::vector<double> route_probabilities(const PlannerInputs& in) {
  const std::size_t n = static_cast<std::size_t>(in.layers) * in.experts;
  const double even = double(in.k) / in.experts;
  std::vector<double> p(n, even);
  if (in.heat.empty()) return p;
  uint64_t total = 0;
  for (uint64_t c : in.heat) total += c;
  const double tokens = in.heat_tokens ? double(in.heat_tokens) : std::max(1.0, double(total) / (double(in.layers) * in.k));
  for (std::size_t i = 0; i < n; ++i) p[i] = std::min(1.0, (double(in.heat[i]) + even) / (tokens + 1.0));
  return p;
}

void check_inputs(const PlannerInputs& in) {
  if (in.layers < 1 || in.experts < 1 || !expert_table_shape_ok(uint64_t(in.layers), uint64_t(in.experts)))
    throw Error("planner: " + std::to_string(in.layers) + " layers x " + std::to_string(in.experts) + " experts is outside the plan format's bounds");
  if (in.k < 1 || in.k > in.experts) throw Error("planner: " + std::to_string(in.k) + " experts per token of " + std::to_string(in.experts));
  if (in.expert_bytes == 0) throw Error("planner: experts of 0 bytes");
  if (!in.heat.empty() && in.heat.size() != static_cast<std::size_t>(in.layers) * in.experts)
    throw Error("planner: heat of " + std::to_string(in.heat.size()) + " counts for " + std::to_string(in.layers * in.experts) + " experts");
  const MachineRates& r = in.rates;
  for (double v : {r.host_expert_gbs, r.disk_gbs, r.pcie_gbs, r.pcie_read_gbs})
    if (!(v > 0) || !std::isfinite(v)) throw Error("planner: a transfer rate must be a positive number of GB/s");
  for (double v : {r.gpu_layer_s, r.gpu_expert_s, r.handoff_s})
    if (!(v >= 0) || !std::isfinite(v)) throw Error("planner: a time must be a non-negative number of seconds");
  for (double v : {r.token_fixed_s, r.prefill_layer_token_s})  // what makes a token's and a chunk's time more than 0
    if (!(v > 0) || !std::isfinite(v)) throw Error("planner: token_fixed_s and prefill_layer_token_s must be positive numbers of seconds");
  if (!(in.pcie_read_share >= 0 && in.pcie_read_share <= 1)) throw Error("planner: the PCIe reads' share must be from 0 to 1");
  if (!(in.pcie_read_offset >= 0 && in.pcie_read_offset <= 64)) throw Error("planner: the PCIe reads' offset must be from 0 to 64 experts");
  if (in.chunks.empty()) throw Error("planner: no prefill chunk size to pick from");
  for (int c : in.chunks)
    if (c < 1 || c > (1 << 20)) throw Error("planner: prefill chunk of " + std::to_string(c) + " tokens");
}

// Seconds the CPU spends per token on an expert in tier t, per unit of p.
double read_s(const PlannerInputs& in, Tier t) {
  if (t == Tier::kVram) return 0;
  const double gbs = t == Tier::kRam ? in.rates.host_expert_gbs : in.rates.disk_gbs;
  return double(in.expert_bytes) / (gbs * 1e9);
}

// The GPU's expert work of a layer, which runs while the CPU computes.
double gpu_part(const PlannerInputs& in) { return in.k * in.rates.gpu_expert_s; }

// misses: the expected number of the layer's routed experts outside VRAM
// per token. The round trip is paid by the tokens that have one or more
// (Poisson: 1 - e^-misses); a layer whose misses are rare mostly skips it.
double layer_time(const PlannerInputs& in, double cpu, double misses) {
  return in.rates.gpu_layer_s + std::max(gpu_part(in), cpu) + in.rates.handoff_s * -std::expm1(-std::max(0.0, misses));
}

// With the runs' PCIe reads (planner.h): the split's expected pairs for
// the GPU and the host over the step's misses M ~ Binomial(k, misses / k)
// (ram_misses of the expected misses lie in RAM, readable over PCIe), then
// the GPU's part against the host's with its round trip, which the GPU's
// own reads hide. *pcie: the expected pairs the GPU reads.
double split_layer_time(const PlannerInputs& in, double cpu, double misses, double ram_misses, double* pcie, bool* gpu_bound) {
  const int k = in.k;
  const double q = std::clamp(misses / k, 0.0, 1.0), per_miss = misses > 0 ? cpu / misses : 0, f = misses > 0 ? ram_misses / misses : 0;
  const double read = double(in.expert_bytes) / (in.rates.pcie_read_gbs * 1e9), s = in.pcie_read_share, o = in.pcie_read_offset;
  double gpu_pairs = 0, host_pairs = 0, host_any = 0;
  for (int M = 0; M <= k; ++M) {
    // C(k, M) q^M (1 - q)^(k - M), exact at q = 0 and q = 1.
    const double prob = q == 0 ? (M == 0) : q == 1 ? (M == k)
                                           : std::exp(std::lgamma(k + 1.0) - std::lgamma(M + 1.0) - std::lgamma(k - M + 1.0) + M * std::log(q) +
                                                      (k - M) * std::log1p(-q));
    const int g = std::min({static_cast<int>(std::floor(f * M + 0.5)), static_cast<int>(std::floor(s * (M + o) + 0.5)), M});
    gpu_pairs += prob * g, host_pairs += prob * (M - g), host_any += M > g ? prob : 0;
  }
  *pcie = gpu_pairs;
  const double gpu = gpu_part(in) + gpu_pairs * read, host = host_pairs * per_miss + host_any * in.rates.handoff_s;
  *gpu_bound = gpu >= host;
  return in.rates.gpu_layer_s + std::max(gpu, host);
}

double pick_time(const PlannerInputs& in, double cpu) {
  return in.rates.gpu_layer_s + std::max(gpu_part(in), cpu) + (cpu > 0 ? in.rates.handoff_s : 0);
}

// Times equal to a relative 1e-9 are a tie: sums over different layers
// round differently.
constexpr double kTie = 1e-9;
int compare(double a, double b) {
  const double tol = kTie * std::max(std::fabs(a), std::fabs(b)) + 1e-18;
  return a > b + tol ? 1 : a < b - tol ? -1 : 0;
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

}  // namespace

Prediction predict(const PlannerInputs& in, const Plan& plan) {
  check_inputs(in);
  if (plan.layers != in.layers || plan.experts != in.experts || plan.tier.size() != static_cast<std::size_t>(in.layers) * in.experts)
    throw Error("planner: a plan of " + std::to_string(plan.layers) + " x " + std::to_string(plan.experts) + " for a model of " +
                std::to_string(in.layers) + " x " + std::to_string(in.experts));
  const std::vector<double> p = route_probabilities(in);
  const double B = double(in.expert_bytes);
  Prediction r;
  double token = in.rates.token_fixed_s, vram_p = 0, all_p = 0, ram_s = 0, disk_s = 0, pcie_pairs = 0;
  for (int l = 0; l < in.layers; ++l) {
    double cpu = 0, misses = 0, ram_misses = 0;
    for (int e = 0; e < in.experts; ++e) {
      const std::size_t i = static_cast<std::size_t>(l) * in.experts + e;
      const Tier t = plan.tier[i];
      all_p += p[i];
      if (t != Tier::kVram) misses += p[i];
      if (t == Tier::kRam) ram_misses += p[i];
      if (t == Tier::kVram) vram_p += p[i], r.vram_bytes_per_token += p[i] * B;
      if (t == Tier::kRam) r.ram_bytes_per_token += p[i] * B, ram_s += p[i] * read_s(in, t);
      if (t == Tier::kDisk) r.disk_bytes_per_token += p[i] * B, disk_s += p[i] * read_s(in, t);
      cpu += p[i] * read_s(in, t);
    }
    if (in.pcie_read_share > 0 && ram_misses > 0) {
      double pcie = 0;
      bool gpu_bound = false;
      token += split_layer_time(in, cpu, misses, ram_misses, &pcie, &gpu_bound);
      pcie_pairs += pcie;
      (gpu_bound ? r.gpu_bound_layers : r.cpu_bound_layers) += 1;
    } else {
      token += layer_time(in, cpu, misses);
      (cpu > gpu_part(in) ? r.cpu_bound_layers : r.gpu_bound_layers) += 1;
    }
  }
  r.hit_rate = all_p > 0 ? vram_p / all_p : 1;
  r.pcie_read_pairs = all_p > 0 ? pcie_pairs / all_p : 0;
  r.decode_tok_s = 1.0 / token;
  r.decode_bound = r.cpu_bound_layers == 0 ? (pcie_pairs > 0 ? "gpu (with its reads over PCIe)" : "gpu")
                   : disk_s > ram_s ? "disk reads" : "host RAM reads (CPU experts)";
  // Prefill: a chunk uploads every non-resident expert of each layer one
  // layer ahead of its compute (the routing of a layer is not known before
  // it runs), so a layer takes the longer of its compute and the next
  // layer's upload, and the first layer's upload is not hidden. Measured:
  // a 40-layer skewed model's chunks upload all its non-residents, not the
  // ones they route to (docs/perf/place.md).
  std::vector<double> out_bytes(in.layers, 0);
  for (std::size_t i = 0; i < p.size(); ++i)
    if (plan.tier[i] != Tier::kVram) out_bytes[i / in.experts] += B;
  double best = -1;
  for (int c : in.chunks) {
    const double compute = c * in.rates.prefill_layer_token_s;
    double chunk_s = out_bytes[0] / (in.rates.pcie_gbs * 1e9), upload = chunk_s, busy = 0;
    for (int l = 0; l < in.layers; ++l) {
      const double next = l + 1 < in.layers ? out_bytes[l + 1] / (in.rates.pcie_gbs * 1e9) : 0;
      chunk_s += std::max(compute, next), upload += next, busy += compute;
    }
    const double tps = chunk_s > 0 ? c / chunk_s : 0;
    if (tps > best) best = tps, r.prefill_chunk = c, r.prefill_bound = upload > busy ? "pcie" : "gpu";
  }
  r.prefill_tok_s = best;
  return r;
}

Plan plan_placement(const PlannerInputs& in, Prediction* predicted) {
  check_inputs(in);
  const int L = in.layers, E = in.experts;
  const std::size_t n = static_cast<std::size_t>(L) * E;
  const std::vector<double> p = route_probabilities(in);
  Plan plan;
  plan.fingerprint = in.fingerprint, plan.layers = L, plan.experts = E;
  plan.vram_budget = in.vram_budget, plan.ram_budget = in.ram_budget;
  // Where the experts start: in RAM when it holds them all (the VRAM pass
  // then saves RAM reads), else on disk.
  const uint64_t slot = in.slot_bytes ? in.slot_bytes : in.expert_bytes;
  const uint64_t slots_total = in.vram_bytes / slot, ram_slots = in.ram_bytes / in.expert_bytes;
  // With the prefill uploads' staging: the slots their tables leave.
  const uint64_t staged_total = (in.vram_bytes - std::min(in.vram_bytes, in.prefill_table_bytes)) / slot;
  const Tier start = ram_slots >= n ? Tier::kRam : Tier::kDisk;
  plan.tier.assign(n, start);
  // Each layer's experts, most routed first (ties: lower index).
  std::vector<std::vector<int>> order(L);
  for (int l = 0; l < L; ++l) {
    order[l].resize(E);
    for (int e = 0; e < E; ++e) order[l][e] = e;
    const double* pl = p.data() + static_cast<std::size_t>(l) * E;
    std::stable_sort(order[l].begin(), order[l].end(), [&](int a, int b) { return pl[a] > pl[b]; });
  }
  std::vector<double> cpu(L, 0);
  for (int l = 0; l < L; ++l)
    for (int e = 0; e < E; ++e) cpu[l] += p[static_cast<std::size_t>(l) * E + e] * read_s(in, start);
  // Moves up to `room` experts into tier `to`, each time the one whose move
  // saves the most predicted time (then the most CPU time, then the layer
  // with the most CPU time left, then the lower layer): each layer's
  // candidate is its most routed expert not yet moved.
  auto fill = [&](Tier to, uint64_t room) {
    std::vector<std::size_t> cursor(L, 0);
    auto candidate = [&](int l) -> int {
      while (cursor[l] < order[l].size() && plan.tier[static_cast<std::size_t>(l) * E + order[l][cursor[l]]] >= to) ++cursor[l];
      return cursor[l] < order[l].size() ? order[l][cursor[l]] : -1;
    };
    for (uint64_t placed = 0; placed < room; ++placed) {
      int best_l = -1, best_e = -1;
      double best_gain = -1, best_cpu = -1;
      for (int l = 0; l < L; ++l) {
        const int e = candidate(l);
        if (e < 0) continue;
        const std::size_t i = static_cast<std::size_t>(l) * E + e;
        const double saved = p[i] * (read_s(in, plan.tier[i]) - read_s(in, to));
        // The pick goes by the makespan with the round trip charged to every
        // layer with misses (as predicted when they are common): charged by
        // its 1 - e^-m, the round trip would pull whole layers into VRAM
        // under even routing, which measured no faster than the spread on
        // the GPU machine (docs/perf/place.md).
        const double gain = pick_time(in, cpu[l]) - pick_time(in, std::max(0.0, cpu[l] - saved));
        // Ties (even routing; equal up to rounding, which differs between
        // layers with different sums): the expert that saves more CPU time,
        // then the layer with the most CPU time left, so that layers fill evenly.
        const int g = compare(gain, best_gain), c = compare(saved, best_cpu);
        const bool better = best_l < 0 || g > 0 || (g == 0 && (c > 0 || (c == 0 && cpu[l] > cpu[best_l] * (1 + kTie))));
        if (better) best_gain = gain, best_cpu = saved, best_l = l, best_e = e;
      }
      if (best_l < 0) return;
      const std::size_t i = static_cast<std::size_t>(best_l) * E + best_e;
      cpu[best_l] = std::max(0.0, cpu[best_l] - p[i] * (read_s(in, plan.tier[i]) - read_s(in, to)));
      plan.tier[i] = to;
    }
  };
  // Hybrid prefill's staging areas take two slots per expert the layer with
  // the most non-residents leaves out (plus the swaps in flight) and their
  // tables: fewer experts in VRAM until plan, staging and tables fit
  // together, in the backend's steps (VramLedger's fill_tier: a sixty-fourth
  // of the slots at a time, so that the run, given this plan as its heat,
  // meets the plan's count on its way down). When not even the staging
  // fits, the backend drops the uploads and fills every slot: so does the
  // plan.
  const std::vector<Tier> start_tier = plan.tier;
  const std::vector<double> start_cpu = cpu;
  const uint64_t full_room = std::min<uint64_t>(n, slots_total);
  uint64_t room = full_room;
  const int ring = prefill_ring_size(in.prefill_ring, static_cast<long long>(full_room));
  for (;;) {
    fill(Tier::kVram, room);
    if (in.prefill_staging_extra < 0) break;
    int64_t most_out = 0;
    for (int l = 0; l < L; ++l) most_out = std::max<int64_t>(most_out, E - plan.count(Tier::kVram, l));
    if (most_out == 0) break;  // every expert resident: no uploads, no staging
    const int64_t vram = plan.count(Tier::kVram);
    const uint64_t staging = ring > 0 ? 2 * uint64_t(std::min<int64_t>(most_out, ring))
                                             : 2 * uint64_t(std::min<int64_t>(E, most_out + (vram > 0 ? in.prefill_staging_extra : 0)));
    const uint64_t used = uint64_t(vram) + staging;
    if (used <= staged_total) break;
    plan.tier = start_tier, cpu = start_cpu;
    if (room == 0) {  // not even the staging fits: no prefill uploads, every slot filled
      fill(Tier::kVram, full_room);
      break;
    }
    room -= std::min(room, std::max<uint64_t>(1, room / 64));  // the backend's steps: the run then holds at least this plan's VRAM experts
  }
  if (start == Tier::kDisk) fill(Tier::kRam, std::min<uint64_t>(n, ram_slots));
  const Prediction r = predict(in, plan);
  plan.prefill_chunk = r.prefill_chunk;
  plan.comments = {
      "made by coli-place: " + std::to_string(plan.count(Tier::kVram)) + " experts in VRAM, " + std::to_string(plan.count(Tier::kRam)) + " in RAM, " +
          std::to_string(plan.count(Tier::kDisk)) + " on disk",
      "predicted: hit rate " + fmt("%.3f", r.hit_rate) + ", decode " + fmt("%.1f", r.decode_tok_s) + " tok/s (bound: " + r.decode_bound + "), prefill " +
          fmt("%.0f", r.prefill_tok_s) + " tok/s at chunks of " + std::to_string(r.prefill_chunk) + " (bound: " + r.prefill_bound + ")",
      "per token: " + fmt("%.1f", r.vram_bytes_per_token / 1e6) + " MB from VRAM, " + fmt("%.1f", r.ram_bytes_per_token / 1e6) + " MB from RAM, " +
          fmt("%.1f", r.disk_bytes_per_token / 1e6) + " MB from disk"};
  if (predicted) *predicted = r;
  return plan;
}

}  // namespace coli
