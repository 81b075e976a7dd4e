// PrefillSplit: where a prompt chunk's routed experts of one layer run
// under a VRAM budget (hybrid prefill, issue 18). Pure arithmetic over the
// chunk's routing counts and measured rates, so CPU-only tests reach it;
// the device backend applies it.
//
// Every expert the chunk routes to runs in one of three places:
//   resident  in a tier slot already: the GPU computes it;
//   upload    copied from pinned host memory to a staging slot on the copy
//             stream (one expert blob each), then the GPU computes it;
//   cpu       the host computes it from host memory, meanwhile.
// The GPU side (residents, then uploads as they arrive) and the CPU side
// run at the same time, so a layer takes about the longer of the two:
//   gpu = max(uploads * upload_s, compute of residents and uploads)
//   cpu = sum over cpu experts of (read_s + tokens * cpu_token_s)
// plan_prefill_layer() sends the experts with the most tokens to the GPU
// (an upload costs the same for 1 token or 500; the CPU's cost grows with
// the tokens) and picks the split that minimises that longer side. At most
// `staging` experts upload per layer (the staging slots); ties go to the
// lower expert index. Deterministic.
#pragma once
#include <cstdint>
#include <vector>

namespace coli {

struct PrefillCosts {
  double upload_s = 0;      // one expert blob over PCIe from pinned memory
  double gpu_token_s = 0;   // the GPU's time per (token, expert) pair
  double cpu_read_s = 0;    // the CPU reading one expert's weights once
  double cpu_token_s = 0;   // the CPU's time per (token, expert) pair beyond the read
  int staging = 0;          // staging slots: at most this many uploads per layer
  double cpu_fixed_s = 0;   // the CPU side's fixed cost of a layer it takes any expert of (the handoff's round trip)
  // The GPU side's cost of a layer with a handoff: its normed rows down to
  // the host and the host's partial sums up, over PCIe on the compute
  // stream (2 T hidden floats), which nothing overlaps.
  double handoff_gpu_s = 0;
  // Uploads of the layer that overlap its work before the router (the
  // mixer: the staging's first units come then), before the CPU can start.
  double gpu_head_s = 0;
};

enum class ExpertPlace : uint8_t { kNone, kResident, kUpload, kCpu };

struct PrefillLayerPlan {
  std::vector<ExpertPlace> place;  // [experts]; kNone: no token routed to it
  int uploads = 0, cpu = 0, resident = 0;
  double gpu_s = 0, cpu_s = 0;     // the model's two sides
  double makespan_s() const { return gpu_s > cpu_s ? gpu_s : cpu_s; }
};

// tokens[e]: the chunk's tokens routed to expert e; resident[e]: in a slot.
PrefillLayerPlan plan_prefill_layer(const std::vector<int>& tokens, const std::vector<uint8_t>& resident, const PrefillCosts& c);

// Before the routing is known (the device backend decides which experts
// to upload a layer ahead, before the layer's router runs): how many of a
// layer's `missing` non-resident experts the CPU takes when each expects
// `pairs_per_expert` of the layer's `layer_pairs` (T k) pairs. The GPU's
// side with c on the CPU: max((missing - c) upload_s, (layer_pairs - c
// pairs_per_expert) gpu_token_s) less gpu_head_s of uploads made before
// the router (the CPU starts after it), plus handoff_gpu_s when c > 0; the
// CPU's: cpu_fixed_s + c (cpu_read_s + pairs_per_expert cpu_token_s). The
// count that minimises the longer side (ties: fewer on the CPU); 0 when
// missing <= 0. A chunk whose GPU is bound by its compute, not by the
// uploads, gains nothing from the CPU and keeps every expert; so does one
// whose best split saves less than 5 % of the layer's time without one
// (the model's errors are of that order).
int prefill_cpu_count(int missing, double pairs_per_expert, double layer_pairs, const PrefillCosts& c);

// The same count when each non-resident's pairs are expected apart (from
// the routing of earlier chunks): `pairs` holds them in ascending order and
// the CPU takes a prefix of it, the least routed. An expert expected to
// get p < 1 pairs costs the host p of its read (it reads only experts a
// pair came to); the GPU's compute loses the prefix's pairs. Same costs,
// same ties (the shorter prefix); 0 for an empty list.
int prefill_cpu_count(const std::vector<double>& pairs, double layer_pairs, const PrefillCosts& c);

// Which of a layer's non-residents the host takes, before the routing of
// the chunk is known: the ones expected to get the fewest pairs, from each
// expert's share of the layer's pairs in the chunks so far.
//
// prefill_cpu_order: the non-residents (resident[e] 0) in the order the
// host takes them: ascending share, ties (and an empty share: no routing
// seen yet) the higher id first.
std::vector<int> prefill_cpu_order(const std::vector<uint8_t>& resident, const std::vector<double>& share);
// The host's n: the first n of order, unless `current` (flags [experts])
// holds n non-residents expected to bring it at most 10 % more of the
// layer's pairs than those, plus 0.2 % of the layer's pairs: then current (the
// shares move a little with every chunk, and a new choice costs the
// device's tables a copy). Flags [experts].
std::vector<uint8_t> prefill_cpu_choice(const std::vector<int>& order, int n, const std::vector<double>& share, const std::vector<uint8_t>& current);
// A layer's shares after a chunk routed counts[e] of its pairs to expert
// e: halfway to the chunk's own (the first chunk's as they are: `known`
// false). Returns false, share untouched, when the chunk routed none.
bool update_routing_share(std::vector<double>& share, bool known, const std::vector<uint64_t>& counts);

// How far the shares predict the next chunk's routing ("trust", 0..1), and
// the pairs an expert is expected to get from it: the mean (layer_pairs /
// experts) plus `trust` of its share's difference from the mean. A share
// learned from one prompt may say nothing of the next (another text routes
// elsewhere; a short first chunk leaves most experts at share 0), so the
// host's count starts from the mean (trust 0, the id order's count) and
// trusts the shares as far as chunks bear them out.
double expected_pairs(double share, double layer_pairs, int experts, double trust);
// After a chunk whose host experts the shares expected `expected` pairs of
// in all (`mean` by the mean) and `came` came: the chunk's own trust,
// (came - mean) / (expected - mean) clamped to [0, 1], averaged with the
// old one (halfway); unchanged when the shares' expectation lies within
// 10 % of the mean (the chunk says nothing of them) or mean is 0.
double update_routing_trust(double trust, double came, double expected, double mean);

// The measured correction of prefill_cpu_count's counts (experts a layer,
// <= 0), after a chunk that handed experts to the host: its layers' GPU
// waited `wait_s` each on average for the host. A wait of more than 20 us
// moves half of wait_s / (cpu_expert_s + upload_s) experts a layer back to
// the GPU (each one the host gives up shortens its side by cpu_expert_s
// and lengthens the GPU's by upload_s; half: one chunk's waits are noisy);
// a chunk with no such wait gives half an expert back, up to 0, so that
// the split finds the cost model's count again when the wait came from a
// passing disturbance. At most half of the `host_experts` a layer the host
// had go back per chunk: a process's first chunk waits for a cold host
// (threads, pages) many times what the host's share explains, and a bias
// that takes every expert off the host would have no wait to learn from.
double prefill_cpu_bias(double bias, double wait_s, double cpu_expert_s, double upload_s, double host_experts);

}  // namespace coli
