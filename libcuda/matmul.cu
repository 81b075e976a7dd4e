#include "cuda_util.cuh"
#include "kernels.cuh"

namespace coli::cuda {

namespace {

constexpr int kWarps = 8;  // rows per block of 256 threads

// One warp per row; tokens in groups of NT per pass over the row (a tail
// group reads the last token again and stores nothing for it).
template <Kind K, int NT>
__global__ void matmul_kernel(DevMatrix W, const float* __restrict__ x, int T, float* __restrict__ y, int ldy) {
  const int r = blockIdx.x * kWarps + threadIdx.x / 32;
  if (r >= W.rows) return;
  const int lane = threadIdx.x & 31;
  for (int t0 = 0; t0 < T; t0 += NT) {
    float acc[NT];
    if (t0 + NT <= T) {
      warp_row_dot<K, NT>(W, r, x + static_cast<long long>(t0) * W.cols, W.cols, acc);
    } else {
      // Fewer than NT tokens left: one at a time.
      for (int t = t0; t < T; ++t) {
        float one[1];
        warp_row_dot<K, 1>(W, r, x + static_cast<long long>(t) * W.cols, W.cols, one);
        if (lane == 0) y[static_cast<long long>(t) * ldy + r] = one[0];
      }
      break;
    }
    if (lane == 0)
      for (int t = 0; t < NT; ++t) y[static_cast<long long>(t0 + t) * ldy + r] = acc[t];
  }
}

}  // namespace

void matmul(const DevMatrix& W, const float* x, int T, float* y, int ldy, cudaStream_t s) {
  const dim3 grid((W.rows + kWarps - 1) / kWarps), block(kWarps * 32);
  dispatch_kind(W.kind, [&]<Kind K>() {
    if (T == 1) matmul_kernel<K, 1><<<grid, block, 0, s>>>(W, x, T, y, ldy);
    else matmul_kernel<K, 8><<<grid, block, 0, s>>>(W, x, T, y, ldy);
  });
  check(cudaGetLastError(), "matmul launch");
}

}  // namespace coli::cuda
