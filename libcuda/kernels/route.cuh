// The router's device code: the softmax and top-K of one token on one warp
// (route_one), the block that does it while its other warps compute the
// shared expert's 1-row gate (route_block), and a decode step's router in
// one launch (router_route_kernel): the router's rows, then in the block
// that finishes last the routing, then an optional tail in that same block
// (the tier's post: tier/expert_handoff.cu). One launch instead of two or
// three on the path every decoded token waits on; the arithmetic is the
// separate kernels' (matmul_kernel's warp_row_dot per row, route_warp_kernel's
// routing), so the routing is bit for bit theirs.
#pragma once
#include <cuda_runtime.h>

#include "cuda_util.cuh"
#include "device_math.cuh"
#include "dev_matrix.cuh"

namespace coli::cuda {

// Softmax over E logits of token t and top-K, on one warp (E <= 32 PER).
// The logits are read past L1 (__ldcg): in router_route_kernel other blocks
// wrote them in this launch.
template <int PER>
__device__ __forceinline__ void route_one(const float* logits, int E, int K, int ks, int t, int* idx, float* w, unsigned long long* counts) {
  const int lane = threadIdx.x & 31;
  const float* lt = logits + static_cast<long long>(t) * E;
  float p[PER];
  float m = -INFINITY;
#pragma unroll
  for (int k = 0; k < PER; ++k) {
    const int e = lane + 32 * k;
    p[k] = e < E ? __ldcg(lt + e) : -INFINITY;
    m = fmaxf(m, p[k]);
  }
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  double sum = 0;
#pragma unroll
  for (int k = 0; k < PER; ++k)
    if (lane + 32 * k < E) p[k] = expf(p[k] - m), sum += p[k];
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const float inv = static_cast<float>(1.0 / sum);
#pragma unroll
  for (int k = 0; k < PER; ++k) p[k] = lane + 32 * k < E ? p[k] * inv : -3.0f;
  float picked_sum = 0;
  for (int kk = 0; kk < K; ++kk) {
    float v = -1.0f;
    int bi = E;
#pragma unroll
    for (int k = 0; k < PER; ++k)
      if (p[k] > v) v = p[k], bi = lane + 32 * k;  // ascending e: ties keep the lower index
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, v, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > v || (ov == v && oi < bi)) v = ov, bi = oi;
    }
#pragma unroll
    for (int k = 0; k < PER; ++k)
      if (lane + 32 * k == bi) p[k] = -2.0f;  // taken
    if (lane == 0) {
      idx[t * ks + kk] = bi, w[t * ks + kk] = v;
      if (counts) atomicAdd(counts + bi, 1ull);  // routing heat
    }
    picked_sum += v;
  }
  __syncwarp();
  if (lane == 0)
    for (int kk = 0; kk < K; ++kk) w[t * ks + kk] /= picked_sum;
}

// Block of kRouteWarps warps per token: warp 0 does route_one; with a gate,
// the other warps meanwhile compute gate_out[t] = gate row 0 . hn[t] (the
// shared expert's 1-row gate, folded in to save a launch), and with
// with_shared the shared expert becomes pair K (expert E, weight
// sigmoid(gate_out[t])). Ends with the block's writes visible to the block.
constexpr int kRouteWarps = 8;

struct RouteArgs {
  float* logits;      // [T, E]: read by route_block, written by router_route_kernel
  int E, K;
  int* idx;
  float* w;
  DevMatrix gate;     // rows 0: no gate
  const float* hn;
  float* gate_out;    // null: no gate
  bool with_shared;
  unsigned long long* counts;
};

template <int PER, Kind KG>
__device__ __forceinline__ void route_block(const RouteArgs& a, int t) {
  __shared__ float gate_part[kRouteWarps];
  const int ks = a.K + a.with_shared;  // idx / w row stride
  const int lane = threadIdx.x & 31, wid = threadIdx.x / 32;
  if (wid > 0) {
    if (a.gate_out) {
      constexpr int per = KG == Kind::kF32 ? 4 : KG == Kind::kI8 ? 16 : KG == Kind::kI4 ? 32 : 8;
      const int chunks = (a.gate.cols + per - 1) / per;
      float acc[1] = {0.0f};
      const float* x = a.hn + static_cast<long long>(t) * a.gate.cols;
#pragma unroll 4
      for (int ch = (wid - 1) * 32 + lane; ch < chunks; ch += (kRouteWarps - 1) * 32) chunk_dot<KG, 1>(a.gate, 0, ch, x, a.gate.cols, acc);
      const float part = warp_sum(acc[0]);
      if (lane == 0) gate_part[wid] = part;
    }
  } else {
    route_one<PER>(a.logits, a.E, a.K, ks, t, a.idx, a.w, a.counts);
  }
  __syncthreads();
  if (a.gate_out && threadIdx.x == 0) {
    float g = 0;
    for (int i = 1; i < kRouteWarps; ++i) g += gate_part[i];
    a.gate_out[t] = g;
    if (a.with_shared) a.idx[t * ks + a.K] = a.E, a.w[t * ks + a.K] = sigmoidf(g);  // the shared expert as pair K
  }
  __syncthreads();
}

// A decode step's router in one launch: block b's warps compute router rows
// 8b .. 8b + 7 of the one token (warp_row_dot, as matmul_kernel does), the
// last block to finish (a ticket, reset by it for the next launch) routes
// (route_block) and then runs tail() with all kRouteWarps warps: the tier's
// post, or nothing.
struct NoRouteTail {
  __device__ void operator()() const {}
};

template <int PER, Kind KR, Kind KG, class Tail>
__global__ void __launch_bounds__(kRouteWarps * 32) router_route_kernel(DevMatrix router, RouteArgs a, unsigned* ticket, Tail tail) {
  const int wid = threadIdx.x / 32, lane = threadIdx.x & 31, r = blockIdx.x * kRouteWarps + wid;
  if (r < a.E) prefetch_row_l2(router, r);
  griddep_wait();
  if (r < a.E) {
    float acc[1];
    warp_row_dot<KR, 1>(router, r, a.hn, router.cols, acc);
    if (lane == 0) a.logits[r] = acc[0];
  }
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();  // this block's logits before its ticket
    last = atomicAdd(ticket, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  route_block<PER, KG>(a, 0);
  if (threadIdx.x == 0) *ticket = 0;
  tail();
}

// Whether router_route can take a step: one token, E <= 512, a float router
// and (when given) a gate in f32 or the router's format.
inline bool router_route_supported(const DevMatrix& router, int T, int E, const DevMatrix* gate) {
  const bool float_kind = router.kind == Kind::kF32 || router.kind == Kind::kBF16 || router.kind == Kind::kF16;
  return T == 1 && E <= 32 * 16 && router.rows == E && float_kind && (!gate || gate->kind == router.kind || gate->kind == Kind::kF32);
}

// Launches router_route_kernel (router_route_supported must hold); ticket:
// one device word, 0 before the first launch and after each.
template <class Tail>
void router_route(const DevMatrix& router, const RouteArgs& a, unsigned* ticket, Tail tail, cudaStream_t s) {
  const int blocks = (a.E + kRouteWarps - 1) / kRouteWarps;
  const bool f32_gate = a.gate_out && a.gate.kind == Kind::kF32;
  auto run = [&]<int PER>() {
    auto go = [&]<Kind K>() {
      if (f32_gate) launch(router_route_kernel<PER, K, Kind::kF32, Tail>, blocks, kRouteWarps * 32, 0, s, router, a, ticket, tail);
      else launch(router_route_kernel<PER, K, K, Tail>, blocks, kRouteWarps * 32, 0, s, router, a, ticket, tail);
    };
    switch (router.kind) {
      case Kind::kF32: go.template operator()<Kind::kF32>(); break;
      case Kind::kBF16: go.template operator()<Kind::kBF16>(); break;
      default: go.template operator()<Kind::kF16>(); break;
    }
  };
  if (a.E <= 64) run.template operator()<2>();
  else if (a.E <= 128) run.template operator()<4>();
  else if (a.E <= 256) run.template operator()<8>();
  else run.template operator()<16>();
  check(cudaGetLastError(), "router launch");
}

// router_route with no tail (moe.cu): rows, softmax and top-K in one launch.
void router_route_topk(const DevMatrix& router, const RouteArgs& a, unsigned* ticket, cudaStream_t s);

}  // namespace coli::cuda
