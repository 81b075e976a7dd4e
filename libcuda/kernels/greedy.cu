// Greedy ids where the logits are: each row's largest logit, ties to the
// lower id (what Sampler::sample gives at temperature 0 without
// penalties), so a greedy decode step hands the host a few ints instead of
// a vocabulary of floats a row (248,320 floats: 1 MB a row).
//
// Two kernels: slices of each row (blocks along x) reduce to partials,
// then one warp a row reduces its partials. A slice scans its ids in
// increasing order keeping only a strictly larger value, and partials
// merge on (value, then lower id): the first largest, as the host's scan.
#include <climits>

#include "cuda_util.cuh"
#include "kernels.cuh"

namespace coli::cuda {

namespace {

struct Best {
  float v;  // the largest so far; -Inf: none taken
  int id;   // INT_MAX: no logit above -Inf
  int bad;  // the first NaN or +Inf id; INT_MAX: none
};

__device__ __forceinline__ void take(Best& a, float v, int id, int bad) {
  if (v > a.v || (v == a.v && id < a.id)) a.v = v, a.id = id;
  a.bad = min(a.bad, bad);
}

__device__ __forceinline__ void scan(Best& b, float v, int i) {
  if (!(v == v) || v == INFINITY) b.bad = min(b.bad, i);
  else if (v > b.v) b.v = v, b.id = i;
}

__device__ __forceinline__ Best warp_best(Best b) {
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, b.v, o);
    const int id = __shfl_xor_sync(0xffffffffu, b.id, o), bad = __shfl_xor_sync(0xffffffffu, b.bad, o);
    take(b, v, id, bad);
  }
  return b;
}

// Block (x, row): ids [x * per, min(V, (x + 1) * per)) of row `row`.
__global__ void greedy_partial_kernel(const float* logits, int V, int per, Best* part) {
  griddep_wait();
  const int row = blockIdx.y, i0 = blockIdx.x * per, i1 = min(V, i0 + per);
  const float* l = logits + static_cast<long long>(row) * V;
  Best b{-INFINITY, INT_MAX, INT_MAX};
  // Each thread's ids in increasing order: a strictly larger value wins,
  // so a thread keeps its first largest.
  for (int i = i0 + threadIdx.x; i < i1; i += blockDim.x) scan(b, l[i], i);
  b = warp_best(b);
  __shared__ Best w[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) w[warp] = b;
  __syncthreads();
  if (warp) return;
  b = lane < warps ? w[lane] : Best{-INFINITY, INT_MAX, INT_MAX};
  b = warp_best(b);
  if (lane == 0) part[static_cast<long long>(row) * gridDim.x + blockIdx.x] = b;
}

// One warp a row: its P partials to the row's code (kernels.cuh).
__global__ void greedy_final_kernel(const Best* part, int P, int rows, int* out) {
  griddep_wait();
  const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= rows) return;
  Best b{-INFINITY, INT_MAX, INT_MAX};
  for (int p = lane; p < P; p += 32) {
    const Best q = part[static_cast<long long>(row) * P + p];
    take(b, q.v, q.id, q.bad);
  }
  b = warp_best(b);
  if (lane) return;
  out[row] = b.bad != INT_MAX ? -2 - b.bad : b.id == INT_MAX ? -1 : b.id;
}

// Slices a row: enough blocks for every SM twice over, each of at least
// 2,048 ids, at most kGreedyMaxSlices.
int slices_for(int rows, int V) {
  int p = (264 + rows - 1) / rows;
  p = min(p, (V + 2047) / 2048);
  return max(1, min(p, kGreedyMaxSlices));
}

}  // namespace

std::size_t greedy_scratch_bytes(int rows) { return std::size_t(rows) * kGreedyMaxSlices * sizeof(Best); }

void greedy_rows(const float* logits, int rows, int V, void* scratch, int* out, cudaStream_t s) {
  static_assert(sizeof(Best) * kGreedyMaxSlices + sizeof(int) == greedy_row_bytes());
  if (rows <= 0) return;
  const int P = slices_for(rows, V), per = (V + P - 1) / P;
  auto* part = static_cast<Best*>(scratch);
  launch(greedy_partial_kernel, dim3(P, rows), 256, 0, s, logits, V, per, part);
  check(cudaGetLastError(), "greedy launch");
  launch(greedy_final_kernel, (rows + 7) / 8, 256, 0, s, static_cast<const Best*>(part), P, rows, out);
  check(cudaGetLastError(), "greedy launch");
}

}  // namespace coli::cuda
