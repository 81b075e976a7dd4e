#include "host_probe.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "cpu_expert_host.h"

namespace coli::cpu {

namespace {
using clock = std::chrono::steady_clock;
double since(clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); }
int resolve(int threads) { return threads > 0 ? threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) - 1); }
}  // namespace

double measure_read_gbs(std::size_t bytes, int threads, double seconds) {
  const int n = resolve(threads);
  const std::size_t words = std::max<std::size_t>(bytes / 8, std::size_t(n) * 1024);
  std::vector<uint64_t> buf(words);
  for (std::size_t i = 0; i < words; ++i) buf[i] = i * 0x9E3779B97F4A7C15ull;
  std::vector<uint64_t> sums(static_cast<std::size_t>(n) * 8);
  double best = 0;
  const auto start = clock::now();
  do {
    const auto t0 = clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < n; ++t)
      pool.emplace_back([&, t] {
        const std::size_t a = words * t / n, b = words * (t + 1) / n;
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        std::size_t i = a;
        for (; i + 4 <= b; i += 4) s0 += buf[i], s1 += buf[i + 1], s2 += buf[i + 2], s3 += buf[i + 3];
        for (; i < b; ++i) s0 += buf[i];
        sums[static_cast<std::size_t>(t) * 8] = s0 + s1 + s2 + s3;  // a cache line each: no false sharing
      });
    for (std::thread& th : pool) th.join();
    best = std::max(best, double(words) * 8 / since(t0) / 1e9);
  } while (since(start) < seconds);
  return best;
}

double measure_expert_gbs(const Model& model, int threads, double seconds) {
  const ModelSpec& s = model.spec();
  CpuExpertHost host(model, resolve(threads));
  const int K = s.num_experts_per_tok, H = s.hidden_size;
  const int l0 = s.first_sparse_layer();
  const ExpertWeights& x0 = model.layer(l0).moe.experts[0];
  const double expert_bytes = double(x0.gate.bytes() + x0.up.bytes() + x0.down.bytes());
  std::vector<float> hn(H), out(H);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : hn) v = nd(rng);
  std::vector<ExpertPair> pairs(K);
  std::vector<double> rates;
  const auto start = clock::now();
  host.hold(true);
  do {
    const auto t0 = clock::now();
    long long reads = 0;
    for (int l = 0; l < s.num_layers; ++l) {
      if (!s.is_sparse(l)) continue;
      std::vector<int> ids(s.num_experts);
      for (int e = 0; e < s.num_experts; ++e) ids[e] = e;
      std::shuffle(ids.begin(), ids.end(), rng);  // k distinct experts, not the ones the last layer warmed
      for (int i = 0; i < K; ++i) pairs[i] = {0, ids[i], 1.0f / K};
      host.compute(l, pairs.data(), K, hn.data(), 1, out.data());
      reads += K;
    }
    rates.push_back(reads * expert_bytes / since(t0) / 1e9);
  } while (since(start) < seconds);
  host.hold(false);
  // The median pass: the planner predicts a typical token. The best pass
  // of a 2 s probe on the GPU machine said 87.5 GB/s where hybrid decode
  // ran its experts at 65-69 (docs/perf/place.md).
  std::nth_element(rates.begin(), rates.begin() + rates.size() / 2, rates.end());
  return rates[rates.size() / 2];
}

}  // namespace coli::cpu
