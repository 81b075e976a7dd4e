// The RMS norm kernel and its launch, with a hook for what must happen
// between waiting for the previous kernel and reading the residual: the
// tier's join (tier/expert_handoff.cu) waits there for the host's experts
// and adds their partial sums into the residual add, one launch where the
// join kernel and the norm were two. elementwise.cu's rms_norm /
// add_rms_norm take it with no hook.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "cuda_util.cuh"
#include "device_math.cuh"
#include "kernels.cuh"

namespace coli::cuda {

// Block per row, kPer values per thread kept in registers: the optional
// residual add (x += a + g b, written back), the RMS norm into y, and the
// optional int8 quantization of the normed row for the next matmul
// (warp_quantize_block, one warp per block of 32).
struct NormArgs {
  float* x;
  const float *a, *b, *b_gate, *w;
  int n;
  float eps;
  bool plus_one;
  float* y;
  QuantX q;
  bool quant, nibble;
};

// A hook: wait() runs in every thread of every block after griddep_wait()
// and returns a mode (the same in all of a block's threads); with a mode
// other than 0, a[i] + add(i, mode) stands for a[i] in the residual add.
struct NoNormHook {
  __device__ int wait() const { return 0; }
  __device__ float add(long long, int) const { return 0.0f; }
};

// kCluster (sm_90): a row is split over the gridDim.x blocks of a thread
// block cluster, each owning n / gridDim.x values (a multiple of 32); the
// blocks' sums of squares meet through distributed shared memory, added in
// block order (deterministic). A decode step's row then spreads over 8 SMs.
template <int kPer, bool kCluster, class Hook>
__global__ void norm_kernel(NormArgs p, Hook hook) {
  const int row = kCluster ? blockIdx.y : blockIdx.x;
  const int len = kCluster ? p.n / gridDim.x : p.n, i0 = kCluster ? blockIdx.x * len : 0;
  // The norm's weights do not depend on the kernels this one waits for:
  // read while they still run.
  float wv[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int i = i0 + threadIdx.x + k * blockDim.x;
    wv[k] = p.w && i < i0 + len ? p.w[i] : 0.0f;
  }
  griddep_wait();
  const int mode = hook.wait();
  const long long o = static_cast<long long>(row) * p.n;
  const float g = p.b_gate ? sigmoidf(p.b_gate[row]) : 1.0f;
  float v[kPer];
  float ss = 0;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int i = i0 + threadIdx.x + k * blockDim.x;
    v[k] = 0.0f;
    if (i < i0 + len) {
      float val = p.x[o + i];
      if (p.a) {
        // Rounded step by step (no contraction into an FMA, which the
        // compiler may choose differently per instantiation): with or
        // without a hook, the same sums bit for bit.
        float av = p.a[o + i];
        if (mode) av = __fadd_rn(av, hook.add(o + i, mode));
        val = __fadd_rn(__fadd_rn(val, av), p.b ? __fmul_rn(g, p.b[o + i]) : 0.0f);
        p.x[o + i] = val;
      }
      v[k] = val;
      ss += val * val;
    }
  }
  if (!p.y && !p.quant) return;
  ss = block_sum(ss);
  if constexpr (kCluster) ss = cluster_sum(ss);
  const float r = rsqrtf(ss / p.n + p.eps);
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int i = i0 + threadIdx.x + k * blockDim.x;
    if (i < i0 + len) {
      v[k] = v[k] * r * (p.plus_one ? 1.0f + wv[k] : wv[k]);
      if (p.y) p.y[o + i] = v[k];
    }
  }
  if (!p.quant) return;
  const int lane = threadIdx.x & 31, nb = p.n / 32;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int b0 = threadIdx.x - lane + k * blockDim.x;  // this warp's block of 32 within the slice
    if (b0 >= len) break;
    warp_quantize_block(v[k], p.nibble, p.q, static_cast<long long>(row) * nb + (i0 + b0) / 32);
  }
}

inline bool clusters_supported() { return device_cc_major() >= 9; }

template <class Hook = NoNormHook>
void launch_norm(const NormArgs& a, int rows, cudaStream_t s, Hook hook = {}) {
  if (a.quant && a.n % 32) throw Error("CUDA: quantized norm of a row of " + std::to_string(a.n) + " (needs a multiple of 32)");
  // Few rows (decode): a cluster of up to 8 blocks per row, 256 values each.
  int nb = 1;
  const int max_cluster = launch_tuning().norm_cluster;
  if (rows <= 16 && clusters_supported())
    for (int c : {8, 4, 2})
      if (c <= max_cluster && a.n % (32 * c) == 0 && a.n / c >= 128 && a.n / c <= 1024) {
        nb = c;
        break;
      }
  if (nb > 1) {
    launch_cluster(norm_kernel<1, true, Hook>, dim3(nb, rows), dim3(a.n / nb), 0, s, nb, a, hook);
    return;
  }
  const int per = a.n <= 8 * 1024 ? 8 : 32;
  if (a.n > per * 1024) throw Error("CUDA: norm of a row of " + std::to_string(a.n) + " values is too long");
  const int threads = std::min(1024, std::max(32, ((a.n + per - 1) / per + 31) / 32 * 32));
  if (per == 8) launch(norm_kernel<8, false, Hook>, rows, threads, 0, s, a, hook);
  else launch(norm_kernel<32, false, Hook>, rows, threads, 0, s, a, hook);
}

// add_rms_norm's arguments (kernels.cuh).
inline NormArgs add_norm_args(float* x, const float* a, const float* b, const float* b_gate, const float* w, int n, float eps, float* y,
                              const QuantX* q, bool nibble, bool plus_one = true) {
  return NormArgs{x, a, b, b_gate, w, n, eps, plus_one, y, q ? *q : QuantX{}, q != nullptr && y != nullptr, nibble};
}

}  // namespace coli::cuda
