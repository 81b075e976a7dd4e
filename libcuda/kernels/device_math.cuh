// Small device helpers shared by the kernels: activations and block
// reductions (blockDim.x a multiple of 32, at most 1024).
#pragma once
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include "dev_matrix.cuh"

namespace coli::cuda {

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float siluf(float x) { return x * sigmoidf(x); }
// torch softplus (beta 1, threshold 20).
__device__ __forceinline__ float softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__device__ __forceinline__ float block_sum(float v) {
  __shared__ float part[32];
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  const int nw = blockDim.x / 32;
  float total = threadIdx.x < nw ? part[threadIdx.x] : 0.0f;
  if (threadIdx.x < 32) total = warp_sum(total);
  if (threadIdx.x == 0) part[0] = total;
  __syncthreads();
  total = part[0];
  __syncthreads();
  return total;
}

__device__ __forceinline__ float block_max(float v) {
  __shared__ float part[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  const int nw = blockDim.x / 32;
  float m = threadIdx.x < nw ? part[threadIdx.x] : -INFINITY;
  if (threadIdx.x < 32)
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (threadIdx.x == 0) part[0] = m;
  __syncthreads();
  m = part[0];
  __syncthreads();
  return m;
}

// The sum of v over the blocks of this thread block cluster (sm_90), v
// being each block's value (the same in all its threads, e.g. block_sum's):
// through distributed shared memory, added in block rank order so every
// block gets the same, deterministic value. Every thread must call.
__device__ __forceinline__ float cluster_sum(float v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ float part;
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  if (threadIdx.x == 0) part = v;
  cluster.sync();
  v = 0;
  for (unsigned b = 0; b < cluster.num_blocks(); ++b) v += *cluster.map_shared_rank(&part, b);
  cluster.sync();  // every block has read the others' partial sums
#endif
  return v;
}

}  // namespace coli::cuda
