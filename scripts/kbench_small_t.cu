// Kernel microbenchmark: matmul_many and the routed experts (grouped and
// pair by pair) at T = 1..64 tokens on the 35B-A3B shapes, int4-g32
// weights of random bytes, device time per call (events over 50 calls).
// Arguments: CudaTuning::mma_min_tokens, mma_small and mma_split (default
// 8 16 3).
// Build after `make` (docs/perf/serve.md, session 22):
//   nvcc -std=c++20 -O2 -arch=sm_90a -Ilibcore -Ilibcuda/include -Ilibcuda/common \
//     -Ilibcuda/kernels scripts/kbench_small_t.cu build/lib/libcolicuda.a build/lib/libcolicore.a -o kbench
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <random>
#include <algorithm>
#include "kernels.cuh"
#include "cuda_util.cuh"
using namespace coli::cuda;
static uint8_t* dev_bytes(size_t n, uint32_t seed) {
  uint8_t* p; cudaMalloc(&p, n);
  std::vector<uint8_t> h(n); std::mt19937 r(seed); for (auto& b : h) b = r();
  cudaMemcpy(p, h.data(), n, cudaMemcpyHostToDevice); return p;
}
static DevMatrix mk4(int rows, int cols, uint32_t seed) {
  DevMatrix W; W.kind = Kind::kI4; W.rows = rows; W.cols = cols; W.row_stride = cols / 2;
  W.group = 32; W.group_shift = 0; W.f16_scales = true; W.asym = false; W.scale_row_bytes = cols / 32 * 2;
  W.scale_offset = (long long)rows * W.row_stride;
  size_t n = W.scale_offset + (size_t)rows * W.scale_row_bytes;
  W.data = dev_bytes(n, seed);
  // scales: fp16 0x2000 (small, finite)
  std::vector<uint16_t> s((size_t)rows * cols / 32, 0x2000);
  cudaMemcpy(const_cast<uint8_t*>(W.data) + W.scale_offset, s.data(), s.size() * 2, cudaMemcpyHostToDevice);
  return W;
}
int main(int argc, char** argv) {
  const int reps = 50;
  launch_tuning().mma_min_tokens = argc > 1 ? atoi(argv[1]) : 8;
  launch_tuning().mma_small = argc > 2 ? atoi(argv[2]) : 16;
  launch_tuning().mma_split = argc > 3 ? atoi(argv[3]) : 3;
  printf("mma_min %d mma_small %d mma_split %d\n", launch_tuning().mma_min_tokens, launch_tuning().mma_small, launch_tuning().mma_split);
  cudaStream_t s; cudaStreamCreate(&s);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  const int H = 2048, maxT = 64;
  float *x, *y; cudaMalloc(&x, maxT * 8192 * 4); cudaMalloc(&y, (size_t)maxT * 248320 * 4);
  cudaMemset(x, 0, maxT * 8192 * 4);
  QuantX q; cudaMalloc(&q.codes, maxT * 8192 * 8); cudaMalloc(&q.scale, maxT * 8192 * 4); cudaMalloc(&q.sum, maxT * 8192 * 4);
  struct Shape { const char* name; std::vector<std::pair<int,int>> m; };
  std::vector<Shape> shapes = {{"gdn_in(8192+4096+32+32)x2048", {{8192, 2048}, {4096, 2048}, {32, 2048}, {32, 2048}}},
                               {"gdn_out 2048x4096", {{2048, 4096}}},
                               {"shared gate+up 2x512x2048", {{512, 2048}, {512, 2048}}},
                               {"attn q+gate 8192x2048", {{8192, 2048}}},
                               {"shared down 2048x512", {{2048, 512}}},
                               {"lm_head part 62080x2048", {{62080, 2048}}}};
  const int Ts[] = {1, 2, 3, 4, 8, 12, 16, 32, 64};
  printf("%-32s %6s %10s %10s %8s\n", "matmul", "T", "us/call", "GB/s", "xT1");
  for (auto& sh : shapes) {
    std::vector<MatmulOut> outs; size_t bytes = 0; uint32_t seed = 1;
    for (auto [r, c] : sh.m) { DevMatrix W = mk4(r, c, seed++); outs.push_back({W, y, r}); bytes += (size_t)r * c / 2 + (size_t)r * c / 16; }
    double t1 = 0;
    for (int T : Ts) {
      for (int w = 0; w < 3; ++w) matmul_many(outs.data(), outs.size(), x, T, s, &q);
      cudaEventRecord(a, s);
      for (int i = 0; i < reps; ++i) matmul_many(outs.data(), outs.size(), x, T, s, &q);
      cudaEventRecord(b, s); cudaEventSynchronize(b);
      float ms; cudaEventElapsedTime(&ms, a, b);
      double us = 1000.0 * ms / reps; if (T == 1) t1 = us;
      printf("%-32s %6d %10.1f %10.0f %8.2f\n", sh.name, T, us, bytes / us / 1e3, us / t1);
    }
  }
  // Grouped experts: 256 experts of 512x2048 (gate, up) and 2048x512 (down), T tokens x 8 uniform picks.
  const int E = 256, K = 8, I = 512;
  DevMatrix g = mk4(I, H, 100), d = mk4(H, I, 101);
  size_t gb = g.scale_offset + (size_t)I * g.scale_row_bytes, db = d.scale_offset + (size_t)H * d.scale_row_bytes;
  uint8_t* pool = dev_bytes((gb * 2 + db) * E, 7);
  std::vector<const uint8_t*> gp(E), up(E), dp(E);
  for (int e = 0; e < E; ++e) gp[e] = pool + (gb * 2 + db) * e, up[e] = gp[e] + gb, dp[e] = up[e] + gb;
  const uint8_t **dg, **du, **dd; cudaMalloc(&dg, E * 8); cudaMalloc(&du, E * 8); cudaMalloc(&dd, E * 8);
  cudaMemcpy(dg, gp.data(), E * 8, cudaMemcpyHostToDevice); cudaMemcpy(du, up.data(), E * 8, cudaMemcpyHostToDevice); cudaMemcpy(dd, dp.data(), E * 8, cudaMemcpyHostToDevice);
  ExpertTable tab; tab.gate = g; tab.up = g; tab.down = d; tab.gate_ptrs = dg; tab.up_ptrs = du; tab.down_ptrs = dd;
  MoeScratch sc; cudaMalloc(&sc.order, maxT * K * 4); cudaMalloc(&sc.offsets, 2 * (E + 1) * 4); cudaMalloc(&sc.act, (size_t)maxT * K * I * 4); cudaMalloc(&sc.y, (size_t)maxT * K * H * 4);
  int* idx; float* wts; cudaMalloc(&idx, maxT * K * 4); cudaMalloc(&wts, maxT * K * 4);
  std::mt19937 rng(3);
  printf("%-32s %6s %10s %10s %8s %8s\n", "experts (grouped / decode)", "T", "us/call", "GB/s", "unique", "path");
  for (int T : Ts) {
    std::vector<int> hidx(T * K); std::vector<float> hw(T * K, 0.125f);
    std::vector<char> used(E, 0); int uniq = 0;
    for (int t = 0; t < T; ++t) { std::vector<int> p(E); for (int e = 0; e < E; ++e) p[e] = e; std::shuffle(p.begin(), p.end(), rng);
      for (int k = 0; k < K; ++k) { hidx[t * K + k] = p[k]; if (!used[p[k]]) used[p[k]] = 1, ++uniq; } }
    cudaMemcpy(idx, hidx.data(), T * K * 4, cudaMemcpyHostToDevice); cudaMemcpy(wts, hw.data(), T * K * 4, cudaMemcpyHostToDevice);
    const double bytes = uniq * (gb * 2.0 + db);
    for (int path = 0; path < 2; ++path) {
      if (path == 0 && T < 4) continue;
      auto run = [&] {
        if (path == 0) moe_grouped(tab, x, idx, wts, T, K, E, sc, y, s, q, false);
        else { moe_gate_up(tab, x, idx, T, K, sc.act, s, &q); moe_down(tab, sc.act, idx, wts, T, K, y, s, &q); }
      };
      for (int w = 0; w < 3; ++w) run();
      cudaEventRecord(a, s);
      for (int i = 0; i < reps; ++i) run();
      cudaEventRecord(b, s); cudaEventSynchronize(b);
      float ms; cudaEventElapsedTime(&ms, a, b);
      double us = 1000.0 * ms / reps;
      printf("%-32s %6d %10.1f %10.0f %8d %8s\n", "experts", T, us, bytes / us / 1e3, uniq, path ? "decode" : "grouped");
    }
  }
  // The router: bf16 256 x 2048 over T tokens (the float row dots below
  // kFloatTiledMinTokens; forward.cu's router_logits), then route_topk with
  // the 1-row shared-expert gate, as a rows step runs them.
  {
    auto bf16_matrix = [&](int rows, int cols, uint32_t seed) {
      DevMatrix W; W.kind = Kind::kBF16; W.rows = rows; W.cols = cols; W.row_stride = (long long)cols * 2;
      std::vector<uint16_t> h((size_t)rows * cols); std::mt19937 r(seed);
      for (auto& v : h) v = 0x3c00 | (r() & 0xff);  // small finite values
      uint8_t* p; cudaMalloc(&p, h.size() * 2); cudaMemcpy(p, h.data(), h.size() * 2, cudaMemcpyHostToDevice);
      W.data = p; return W;
    };
    DevMatrix R = bf16_matrix(E, H, 9), G = bf16_matrix(1, H, 10);
    float *rl, *go; cudaMalloc(&rl, (size_t)maxT * E * 4); cudaMalloc(&go, maxT * 4);
    printf("%-32s %6s %10s %10s\n", "router (bf16) / route_topk", "T", "matmul us", "route us");
    for (int T : Ts) {
      if (T >= kFloatTiledMinTokens) break;
      float us[2];
      for (int part = 0; part < 2; ++part) {
        auto run = [&] {
          if (part == 0) matmul(R, x, T, rl, E, s, &q);
          else route_topk(rl, T, E, K, idx, wts, s, &G, x, go, false, nullptr);
        };
        for (int w = 0; w < 3; ++w) run();
        cudaEventRecord(a, s);
        for (int i = 0; i < reps; ++i) run();
        cudaEventRecord(b, s); cudaEventSynchronize(b);
        float ms; cudaEventElapsedTime(&ms, a, b);
        us[part] = 1000.0f * ms / reps;
      }
      printf("%-32s %6d %10.1f %10.1f\n", "router", T, us[0], us[1]);
    }
  }
  cudaError_t e = cudaDeviceSynchronize();
  printf("status: %s\n", cudaGetErrorString(e));
  return e != cudaSuccess;
}
