#include <cooperative_groups.h>

#include <algorithm>
#include <string>

#include "cuda_util.cuh"
#include "device_math.cuh"
#include "kernels.cuh"

namespace coli::cuda {

namespace {

template <Kind K>
__global__ void embed_kernel(DevMatrix E, const int* ids, float* x) {
  griddep_wait();
  const int t = blockIdx.x, r = ids ? ids[t] : t;  // no ids: row t holds token t's (a host embedding's staged rows)
  constexpr int per = K == Kind::kF32 ? 4 : K == Kind::kI8 ? 16 : K == Kind::kI4 ? 32 : 8;
  const int chunks = (E.cols + per - 1) / per;
  for (int ch = threadIdx.x; ch < chunks; ch += blockDim.x) {
    float vals[per];
    int c0, n;
    load_chunk<K>(E, r, ch, vals, &c0, &n);
    for (int i = 0; i < n; ++i) x[static_cast<long long>(t) * E.cols + c0 + i] = vals[i];
  }
}

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

// kCluster (sm_90): a row is split over the gridDim.x blocks of a thread
// block cluster, each owning n / gridDim.x values (a multiple of 32); the
// blocks' sums of squares meet through distributed shared memory, added in
// block order (deterministic). A decode step's row then spreads over 8 SMs.
template <int kPer, bool kCluster>
__global__ void norm_kernel(NormArgs p) {
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
        val = val + p.a[o + i] + (p.b ? g * p.b[o + i] : 0.0f);
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

bool clusters_supported() {
  return device_cc_major() >= 9;
}

void launch_norm(const NormArgs& a, int rows, cudaStream_t s) {
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
    launch_cluster(norm_kernel<1, true>, dim3(nb, rows), dim3(a.n / nb), 0, s, nb, a);
    return;
  }
  const int per = a.n <= 8 * 1024 ? 8 : 32;
  if (a.n > per * 1024) throw Error("CUDA: norm of a row of " + std::to_string(a.n) + " values is too long");
  const int threads = std::min(1024, std::max(32, ((a.n + per - 1) / per + 31) / 32 * 32));
  if (per == 8) launch(norm_kernel<8, false>, rows, threads, 0, s, a);
  else launch(norm_kernel<32, false>, rows, threads, 0, s, a);
}

__global__ void silu_mul_kernel(const float* g, const float* u, float* out, std::size_t n) {
  griddep_wait();
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    out[i] = g[i] * sigmoidf(g[i]) * u[i];
}

int grid_for(std::size_t n) { return static_cast<int>(std::min<std::size_t>((n + 255) / 256, 4096)); }

}  // namespace

void embed_rows(const DevMatrix& E, const int* ids, int T, float* x, cudaStream_t s) {
  dispatch_kind(E.kind, [&]<Kind K>() { launch(embed_kernel<K>, T, 256, 0, s, E, ids, x); });
  check(cudaGetLastError(), "embed launch");
}

void rms_norm(const float* x, const float* w, int rows, int n, float eps, bool plus_one, float* y, cudaStream_t s, const QuantX* q, bool nibble) {
  launch_norm(NormArgs{const_cast<float*>(x), nullptr, nullptr, nullptr, w, n, eps, plus_one, y, q ? *q : QuantX{}, q != nullptr, nibble}, rows, s);
}

void add_rms_norm(float* x, const float* a, const float* b, const float* b_gate, const float* w, int rows, int n, float eps, float* y,
                  cudaStream_t s, const QuantX* q, bool nibble) {
  launch_norm(NormArgs{x, a, b, b_gate, w, n, eps, true, y, q ? *q : QuantX{}, q != nullptr && y != nullptr, nibble}, rows, s);
}

void silu_mul(const float* g, const float* u, float* out, std::size_t n, cudaStream_t s) {
  launch(silu_mul_kernel, grid_for(n), 256, 0, s, g, u, out, n);
  check(cudaGetLastError(), "silu_mul launch");
}

}  // namespace coli::cuda
