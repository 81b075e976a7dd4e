#include <cooperative_groups.h>

#include <algorithm>
#include <string>

#include "cuda_util.cuh"
#include "device_math.cuh"
#include "kernels.cuh"
#include "norm.cuh"

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
                  cudaStream_t s, const QuantX* q, bool nibble, bool plus_one) {
  launch_norm(add_norm_args(x, a, b, b_gate, w, n, eps, y, q, nibble, plus_one), rows, s);
}

void silu_mul(const float* g, const float* u, float* out, std::size_t n, cudaStream_t s) {
  launch(silu_mul_kernel, grid_for(n), 256, 0, s, g, u, out, n);
  check(cudaGetLastError(), "silu_mul launch");
}

}  // namespace coli::cuda
