#include "cuda_util.cuh"
#include "device_math.cuh"
#include "kernels.cuh"

namespace coli::cuda {

namespace {

template <Kind K>
__global__ void embed_kernel(DevMatrix E, const int* ids, float* x) {
  const int t = blockIdx.x, r = ids[t];
  constexpr int per = K == Kind::kF32 ? 4 : K == Kind::kI8 ? 16 : K == Kind::kI4 ? 32 : 8;
  const int chunks = (E.cols + per - 1) / per;
  for (int ch = threadIdx.x; ch < chunks; ch += blockDim.x) {
    float vals[per];
    int c0, n;
    load_chunk<K>(E, r, ch, vals, &c0, &n);
    for (int i = 0; i < n; ++i) x[static_cast<long long>(t) * E.cols + c0 + i] = vals[i];
  }
}

__global__ void rms_norm_kernel(const float* x, const float* w, int n, float eps, bool plus_one, float* y) {
  const float* xr = x + static_cast<long long>(blockIdx.x) * n;
  float* yr = y + static_cast<long long>(blockIdx.x) * n;
  float ss = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  const float r = rsqrtf(block_sum(ss) / n + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * r * (plus_one ? 1.0f + w[i] : w[i]);
}

__global__ void add_rms_norm_kernel(float* x, const float* a, const float* b, const float* b_gate, const float* w, int n, float eps, float* y) {
  const long long o = static_cast<long long>(blockIdx.x) * n;
  const float g = b_gate ? sigmoidf(b_gate[blockIdx.x]) : 1.0f;
  float ss = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = x[o + i] + a[o + i] + (b ? g * b[o + i] : 0.0f);
    x[o + i] = v;
    ss += v * v;
  }
  if (!y) return;
  const float r = rsqrtf(block_sum(ss) / n + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) y[o + i] = x[o + i] * r * (1.0f + w[i]);
}

__global__ void silu_mul_kernel(const float* g, const float* u, float* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    out[i] = g[i] * sigmoidf(g[i]) * u[i];
}

int grid_for(std::size_t n) { return static_cast<int>(std::min<std::size_t>((n + 255) / 256, 4096)); }

}  // namespace

void embed_rows(const DevMatrix& E, const int* ids, int T, float* x, cudaStream_t s) {
  dispatch_kind(E.kind, [&]<Kind K>() { embed_kernel<K><<<T, 256, 0, s>>>(E, ids, x); });
  check(cudaGetLastError(), "embed launch");
}

void rms_norm(const float* x, const float* w, int rows, int n, float eps, bool plus_one, float* y, cudaStream_t s) {
  rms_norm_kernel<<<rows, 256, 0, s>>>(x, w, n, eps, plus_one, y);
  check(cudaGetLastError(), "rms_norm launch");
}

void add_rms_norm(float* x, const float* a, const float* b, const float* b_gate, const float* w, int rows, int n, float eps, float* y,
                  cudaStream_t s) {
  add_rms_norm_kernel<<<rows, 256, 0, s>>>(x, a, b, b_gate, w, n, eps, y);
  check(cudaGetLastError(), "add_rms_norm launch");
}

void silu_mul(const float* g, const float* u, float* out, std::size_t n, cudaStream_t s) {
  silu_mul_kernel<<<grid_for(n), 256, 0, s>>>(g, u, out, n);
  check(cudaGetLastError(), "silu_mul launch");
}

}  // namespace coli::cuda
