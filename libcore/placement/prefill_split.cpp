#include "placement/prefill_split.h"

#include <cmath>
#include <algorithm>
#include <numeric>

#include "util/error.h"

namespace coli {

PrefillLayerPlan plan_prefill_layer(const std::vector<int>& tokens, const std::vector<uint8_t>& resident, const PrefillCosts& c) {
  if (tokens.size() != resident.size()) throw Error("prefill split: token counts and residency flags differ in size (internal)");
  if (!(c.upload_s >= 0 && c.gpu_token_s >= 0 && c.cpu_read_s >= 0 && c.cpu_token_s >= 0) || c.staging < 0)
    throw Error("prefill split: costs must be non-negative");
  const int E = static_cast<int>(tokens.size());
  PrefillLayerPlan p;
  p.place.assign(E, ExpertPlace::kNone);
  long long gpu_pairs = 0;
  std::vector<int> misses;  // routed, not resident: most tokens first
  for (int e = 0; e < E; ++e) {
    if (tokens[e] < 0) throw Error("prefill split: negative token count (internal)");
    if (tokens[e] == 0) continue;
    if (resident[e]) {
      p.place[e] = ExpertPlace::kResident, ++p.resident, gpu_pairs += tokens[e];
    } else {
      misses.push_back(e);
    }
  }
  std::stable_sort(misses.begin(), misses.end(), [&](int a, int b) { return tokens[a] > tokens[b]; });
  // Suffix sums of the CPU's cost: CPU takes misses[k..].
  const int n = static_cast<int>(misses.size());
  std::vector<double> cpu_from(n + 1, 0.0);
  for (int i = n - 1; i >= 0; --i) cpu_from[i] = cpu_from[i + 1] + c.cpu_read_s + tokens[misses[i]] * c.cpu_token_s;
  int best = 0;
  double best_span = -1, best_gpu = 0;
  long long pairs = gpu_pairs;
  for (int k = 0; k <= std::min(n, c.staging); ++k) {
    if (k > 0) pairs += tokens[misses[k - 1]];
    const double gpu = std::max(k * c.upload_s, pairs * c.gpu_token_s);
    const double span = std::max(gpu, cpu_from[k] + (k < n ? c.cpu_fixed_s : 0.0));
    if (best_span < 0 || span < best_span) best = k, best_span = span, best_gpu = gpu;
  }
  for (int i = 0; i < n; ++i) p.place[misses[i]] = i < best ? ExpertPlace::kUpload : ExpertPlace::kCpu;
  p.uploads = best, p.cpu = n - best;
  p.gpu_s = best_gpu, p.cpu_s = cpu_from[best] + (best < n ? c.cpu_fixed_s : 0.0);
  return p;
}

namespace {

// A split the model says saves less than this share of the layer's time
// without one is not taken: the host's side costs what the model does not
// see (its pages, the handoff's rows competing with the uploads for PCIe,
// a prompt's hot experts), and call T3 (docs/perf/families.md) lost 8 %
// on qwen3_moe to 2-3 host experts a layer that the model said gained
// under 1 %.
constexpr double kCpuMinGain = 0.05;

int worth_it(int best, double best_span, double none_span) { return best > 0 && best_span <= (1 - kCpuMinGain) * none_span ? best : 0; }

}  // namespace

int prefill_cpu_count(int missing, double pairs_per_expert, double layer_pairs, const PrefillCosts& c) {
  if (missing <= 0) return 0;
  if (!(pairs_per_expert >= 0 && layer_pairs >= 0 && c.upload_s >= 0 && c.gpu_token_s >= 0 && c.cpu_read_s >= 0 && c.cpu_token_s >= 0 &&
        c.cpu_fixed_s >= 0 && c.handoff_gpu_s >= 0 && c.gpu_head_s >= 0))
    throw Error("prefill split: costs must be non-negative");
  const double cpu_one = c.cpu_read_s + pairs_per_expert * c.cpu_token_s;
  int best = 0;
  double best_span = -1, none_span = 0;
  for (int cpu = 0; cpu <= missing; ++cpu) {  // ascending: ties keep the fewer
    const double gpu = std::max(std::max(0.0, (missing - cpu) * c.upload_s - c.gpu_head_s), std::max(0.0, layer_pairs - cpu * pairs_per_expert) * c.gpu_token_s) +
                       (cpu > 0 ? c.handoff_gpu_s : 0.0);
    const double span = std::max(gpu, cpu > 0 ? c.cpu_fixed_s + cpu * cpu_one : 0.0);
    if (cpu == 0) none_span = span;
    if (best_span < 0 || span < best_span) best = cpu, best_span = span;
  }
  return worth_it(best, best_span, none_span);
}

int prefill_cpu_count(const std::vector<double>& pairs, double layer_pairs, const PrefillCosts& c) {
  const int missing = static_cast<int>(pairs.size());
  if (missing == 0) return 0;
  if (!(layer_pairs >= 0 && c.upload_s >= 0 && c.gpu_token_s >= 0 && c.cpu_read_s >= 0 && c.cpu_token_s >= 0 && c.cpu_fixed_s >= 0 &&
        c.handoff_gpu_s >= 0 && c.gpu_head_s >= 0))
    throw Error("prefill split: costs must be non-negative");
  for (int i = 0; i < missing; ++i)
    if (!(pairs[i] >= 0) || (i > 0 && pairs[i] < pairs[i - 1])) throw Error("prefill split: expected pairs must be non-negative and ascending (internal)");
  int best = 0;
  double best_span = -1, none_span = 0, host = 0, taken = 0;
  for (int cpu = 0; cpu <= missing; ++cpu) {  // ascending: ties keep the fewer
    if (cpu > 0) {
      const double p = pairs[cpu - 1];
      host += c.cpu_read_s * std::min(1.0, p) + p * c.cpu_token_s, taken += p;
    }
    const double gpu = std::max(std::max(0.0, (missing - cpu) * c.upload_s - c.gpu_head_s), std::max(0.0, layer_pairs - taken) * c.gpu_token_s) +
                       (cpu > 0 ? c.handoff_gpu_s : 0.0);
    const double span = std::max(gpu, cpu > 0 ? c.cpu_fixed_s + host : 0.0);
    if (cpu == 0) none_span = span;
    if (best_span < 0 || span < best_span) best = cpu, best_span = span;
  }
  return worth_it(best, best_span, none_span);
}

std::vector<int> prefill_cpu_order(const std::vector<uint8_t>& resident, const std::vector<double>& share) {
  const int E = static_cast<int>(resident.size());
  if (!share.empty() && share.size() != resident.size()) throw Error("prefill split: shares and residency flags differ in size (internal)");
  std::vector<int> order;
  for (int e = E - 1; e >= 0; --e)
    if (!resident[e]) order.push_back(e);
  if (!share.empty()) std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return share[a] < share[b]; });
  return order;
}

std::vector<uint8_t> prefill_cpu_choice(const std::vector<int>& order, int n, const std::vector<double>& share, const std::vector<uint8_t>& current) {
  const std::size_t E = current.size();
  if (!share.empty() && share.size() != E) throw Error("prefill split: shares and flags differ in size (internal)");
  std::vector<uint8_t> want(E, 0);
  n = std::clamp(n, 0, static_cast<int>(order.size()));
  auto of = [&](int e) { return share.empty() ? 0.0 : share[static_cast<std::size_t>(e)]; };
  double best = 0;
  for (int i = 0; i < n; ++i) want.at(static_cast<std::size_t>(order[i])) = 1, best += of(order[i]);
  if (share.empty() || n == 0) return want;
  // current counts only over the non-residents (order holds them all).
  int had = 0;
  double kept = 0;
  for (int e : order)
    if (current.at(static_cast<std::size_t>(e))) ++had, kept += of(e);
  if (had == n && kept <= 1.1 * best + 0.002) {
    std::vector<uint8_t> keep(E, 0);
    for (int e : order) keep[static_cast<std::size_t>(e)] = current[static_cast<std::size_t>(e)];
    return keep;
  }
  return want;
}

bool update_routing_share(std::vector<double>& share, bool known, const std::vector<uint64_t>& counts) {
  if (known && share.size() != counts.size()) throw Error("prefill split: shares and counts differ in size (internal)");
  double sum = 0;
  for (uint64_t c : counts) sum += static_cast<double>(c);
  if (sum <= 0) return false;
  if (!known) share.assign(counts.size(), 0.0);
  for (std::size_t e = 0; e < counts.size(); ++e) {
    const double mine = static_cast<double>(counts[e]) / sum;
    share[e] = known ? 0.5 * (share[e] + mine) : mine;
  }
  return true;
}

double expected_pairs(double share, double layer_pairs, int experts, double trust) {
  if (!(experts > 0 && layer_pairs >= 0 && share >= 0 && trust >= 0 && trust <= 1))
    throw Error("prefill split: expected pairs need experts, non-negative pairs and share, trust in [0, 1] (internal)");
  const double mean = layer_pairs / experts;
  return std::max(0.0, mean + trust * (share * layer_pairs - mean));
}

double update_routing_trust(double trust, double came, double expected, double mean) {
  if (!(trust >= 0 && trust <= 1 && came >= 0 && expected >= 0 && mean >= 0))
    throw Error("prefill split: trust in [0, 1], pairs non-negative (internal)");
  if (mean <= 0 || std::abs(expected - mean) < 0.1 * mean) return trust;
  const double chunk = std::clamp((came - mean) / (expected - mean), 0.0, 1.0);
  return 0.5 * (trust + chunk);
}

double prefill_cpu_bias(double bias, double wait_s, double cpu_expert_s, double upload_s, double host_experts) {
  if (!(wait_s >= 0 && cpu_expert_s >= 0 && upload_s >= 0 && bias <= 0 && host_experts >= 0))
    throw Error("prefill split: the wait, the costs, the host's experts must be non-negative and the bias not positive");
  if (wait_s > 20e-6) return bias - std::min(0.5 * wait_s / std::max(cpu_expert_s + upload_s, 1e-9), 0.5 * host_experts);
  return std::min(0.0, bias + 0.5);
}

}  // namespace coli
