// The MoE block's routing and routed experts on the device. The experts of
// a step run as two launches over all (token, expert) pairs, reading the
// chosen expert ids from device memory (no host round trip, so a decode
// step can be one graph): gate+up+SiLU per pair, then down with the
// router-weighted sum per token in a fixed order (deterministic).
#include "cuda_util.cuh"
#include "device_math.cuh"
#include "kernels.cuh"
#include "mma_tile.cuh"
#include "route.cuh"

namespace coli::cuda {

namespace {

constexpr int kWarps = 8;

// Block per token: softmax over E (sum in double, as the reference), then
// K rounds of block argmax (ties to the lower index).
__global__ void route_kernel(const float* logits, int E, int K, int* idx, float* w, unsigned long long* counts) {
  griddep_wait();
  extern __shared__ float p[];
  __shared__ double dsum[32];
  __shared__ int best_i[32];
  __shared__ float best_v[32];
  const int t = blockIdx.x;
  const float* lt = logits + static_cast<long long>(t) * E;
  float m = -INFINITY;
  for (int e = threadIdx.x; e < E; e += blockDim.x) m = fmaxf(m, lt[e]);
  m = block_max(m);
  double s = 0;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    p[e] = expf(lt[e] - m);
    s += p[e];
  }
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0) dsum[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double tot = 0;
    for (int i = 0; i < blockDim.x / 32; ++i) tot += dsum[i];
    dsum[0] = tot;
  }
  __syncthreads();
  const float inv = static_cast<float>(1.0 / dsum[0]);
  for (int e = threadIdx.x; e < E; e += blockDim.x) p[e] *= inv;
  __syncthreads();
  float picked_sum = 0;  // meaningful in thread 0
  for (int k = 0; k < K; ++k) {
    float v = -1.0f;
    int bi = E;
    for (int e = threadIdx.x; e < E; e += blockDim.x)
      if (p[e] > v || (p[e] == v && e < bi)) v = p[e], bi = e;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, v, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > v || (ov == v && oi < bi)) v = ov, bi = oi;
    }
    if ((threadIdx.x & 31) == 0) best_v[threadIdx.x / 32] = v, best_i[threadIdx.x / 32] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int i = 1; i < blockDim.x / 32; ++i)
        if (best_v[i] > v || (best_v[i] == v && best_i[i] < bi)) v = best_v[i], bi = best_i[i];
      idx[t * K + k] = bi;
      w[t * K + k] = v;
      if (counts) atomicAdd(counts + bi, 1ull);  // routing heat
      picked_sum += v;
      p[bi] = -2.0f;  // taken
    }
    __syncthreads();
  }
  if (threadIdx.x == 0)
    for (int k = 0; k < K; ++k) w[t * K + k] /= picked_sum;
}

// Block per token: route_block (route.cuh), 32 threads without a gate.
template <int PER, Kind KG>
__global__ void __launch_bounds__(kRouteWarps * 32) route_warp_kernel(RouteArgs a) {
  griddep_wait();
  route_block<PER, KG>(a, blockIdx.x);
}

// Warp per (pair, row of the expert's intermediate).
template <Kind KG, Kind KU>
__global__ void gate_up_kernel(ExpertTable tab, const float* hn, const int* idx, int K, float* act, const int* lim) {
  griddep_wait();
  const int p = blockIdx.y, I = tab.gate.rows, H = tab.gate.cols;
  const int r = blockIdx.x * kWarps + threadIdx.x / 32;
  if (r >= I) return;
  if (lim && r >= lim[p]) {  // the host's rows of a split expert
    if ((threadIdx.x & 31) == 0) act[static_cast<long long>(p) * I + r] = 0.0f;
    return;
  }
  const int e = idx[p], t = p / K;
  DevMatrix g = tab.gate, u = tab.up;
  g.data = tab.gate_ptrs[e];
  u.data = tab.up_ptrs[e];
  const float* x = hn + static_cast<long long>(t) * H;
  float gv[1], uv[1];
  warp_row_dot<KG, 1>(g, r, x, H, gv);
  warp_row_dot<KU, 1>(u, r, x, H, uv);
  if ((threadIdx.x & 31) == 0) act[static_cast<long long>(p) * I + r] = siluf(gv[0]) * uv[0];
}

// Warp per (token, output row): the K experts' rows in order, weighted;
// dot(d, r, p) is row r of expert matrix d times pair p's activations.
template <typename Dot>
__device__ __forceinline__ void down_rows(const ExpertTable& tab, const int* idx, const float* w, int K, float* out, Dot&& dot) {
  const int t = blockIdx.y, H = tab.down.rows;
  const int r = blockIdx.x * kWarps + threadIdx.x / 32;
  if (r >= H) return;
  float sum = 0;
  for (int k = 0; k < K; ++k) {
    const int p = t * K + k;
    DevMatrix d = tab.down;
    d.data = tab.down_ptrs[idx[p]];
    sum += w[p] * dot(d, r, p);
  }
  if ((threadIdx.x & 31) == 0) out[static_cast<long long>(t) * H + r] = sum;
}

template <Kind KD>
__global__ void down_kernel(ExpertTable tab, const float* act, const int* idx, const float* w, int K, float* out) {
  griddep_wait();
  const int I = tab.down.cols;
  down_rows(tab, idx, w, K, out, [&](const DevMatrix& d, int r, int p) {
    float y[1];
    warp_row_dot<KD, 1>(d, r, act + static_cast<long long>(p) * I, I, y);
    return y[0];
  });
}

// down_kernel with act in int8 (dp4a, q row p per pair), for K > 32.
template <Kind KD>
__global__ void down_q_kernel(ExpertTable tab, const int* idx, const float* w, int K, QuantX qa, float* out) {
  griddep_wait();
  down_rows(tab, idx, w, K, out, [&](const DevMatrix& d, int r, int p) { return warp_row_dot_q<KD>(d, r, qa, p); });
}

// Decode, gate+up: warp per (pair, kUpRows x 32 / L rows of gate and of
// up), groups of L lanes per kUpRows rows (group_rows_dot_q: the 2 x
// kUpRows weight rows of a group are in flight together).
constexpr int kUpRowsDefault = 2;
static_assert(CudaTuning{}.up_rows == kUpRowsDefault, "CudaTuning's default is this");

template <Kind KG, int L, int kUpRows>
__global__ void gate_up_rows_kernel(ExpertTable tab, const int* idx, int K, QuantX qx, float* act, const int* lim) {
  griddep_wait();
  constexpr int G = 32 / L;
  const int p = blockIdx.y, I = tab.gate.rows;
  const int e = idx[p], t = p / K, rows_used = lim ? min(I, lim[p]) : I;
  // The pair's down matrix into L2 for moe_down (next but one), a slice per
  // block; of a split expert only the columns moe_down reads (over PCIe).
  DevMatrix d = tab.down;
  d.data = tab.down_ptrs[e];
  if (rows_used == I) prefetch_matrix_part_l2(d, blockIdx.x, gridDim.x);
  else prefetch_matrix_cols_l2(d, blockIdx.x, gridDim.x, rows_used);
  const int warp_r0 = (blockIdx.x * kWarps + threadIdx.x / 32) * G * kUpRows;
  if (warp_r0 >= I) return;  // whole warps only
  const int r0 = warp_r0 + (threadIdx.x & 31) / L * kUpRows;
  if (warp_r0 >= rows_used) {  // the host's rows of a split expert (a multiple of 32: whole warps)
    if ((threadIdx.x & (L - 1)) == 0)
#pragma unroll
      for (int i = 0; i < kUpRows; ++i)
        if (r0 + i < I) act[static_cast<long long>(p) * I + r0 + i] = 0.0f;
    return;
  }
  int rows[kUpRows];
#pragma unroll
  for (int i = 0; i < kUpRows; ++i) rows[i] = min(r0 + i, I - 1);
  DevMatrix W[2] = {tab.gate, tab.up};
  W[0].data = tab.gate_ptrs[e];
  W[1].data = tab.up_ptrs[e];
  float out[2][kUpRows];
  group_rows_dot_q<KG, 2, kUpRows, L>(W, rows, qx, t, out);
  if ((threadIdx.x & (L - 1)) == 0)
#pragma unroll
    for (int i = 0; i < kUpRows; ++i)
      if (r0 + i < I) act[static_cast<long long>(p) * I + r0 + i] = siluf(out[0][i]) * out[1][i];
}

// Decode, down: block per (token, 32 / L x kDownRows output rows), warp per
// pair k (K <= 32), so the K experts' rows are read in parallel, each
// group of L lanes kDownRows rows at a time (group_rows_dot_q; the 512
// columns of a down row fill 16 lanes); the weighted sum over k runs in k
// order as in down_q_kernel.
constexpr int kDownRowsDefault = 4;
static_assert(CudaTuning{}.down_rows == kDownRowsDefault, "CudaTuning's default is this");

template <Kind KD, int L, int kDownRows>
__global__ void down_q_split_kernel(ExpertTable tab, const int* idx, const float* w, int K, QuantX qa, float* out, const int* lim) {
  griddep_wait();
  constexpr int G = 32 / L, kRows = G * kDownRows;  // rows per block
  __shared__ float part[32][kRows];
  const int t = blockIdx.y, H = tab.down.rows, k = threadIdx.x / 32, g = (threadIdx.x & 31) / L;
  const int r0 = blockIdx.x * kRows + g * kDownRows, p = t * K + k;
  int rows[kDownRows];
#pragma unroll
  for (int i = 0; i < kDownRows; ++i) rows[i] = min(r0 + i, H - 1);
  DevMatrix W[1] = {tab.down};
  W[0].data = tab.down_ptrs[idx[p]];
  float y[1][kDownRows];
  group_rows_dot_q<KD, 1, kDownRows, L>(W, rows, qa, p, y, lim ? lim[p] / 32 : 1 << 30);
  if ((threadIdx.x & (L - 1)) == 0)
#pragma unroll
    for (int i = 0; i < kDownRows; ++i) part[k][g * kDownRows + i] = y[0][i];
  __syncthreads();
  const int rr = threadIdx.x, r = blockIdx.x * kRows + rr;
  if (rr < kRows && r < H) {
    float sum = 0;
    for (int kk = 0; kk < K; ++kk) sum += w[t * K + kk] * part[kk][rr];
    out[static_cast<long long>(t) * H + r] = sum;
  }
}

// ---- prefill: pairs grouped by expert ------------------------------------

// Tensor cores (sm_80+, mma_tile.cuh): a block takes kMmaRows rows of one
// expert's matrices and runs over its pairs kMmaPairs at a time.
constexpr int kMmaPairs = 32;

// An expert's pairs come in chunks of at most kChunkPairs, a block (of each
// row tile) per chunk, not one block per expert: routing is skewed (a real
// layer's hottest expert takes several times its share of the pairs, a
// synthetic model's most of the prompt), and one block looping over a hot
// expert's pairs ran alone while the rest of the GPU idled (qwen3_moe's
// staged groups of 16 experts took 0.1 or 1 ms by whether they held one).
// A pass of the tile reads the weights once either way.
constexpr int kChunkPairs = kMmaPairs;

// Block y of a launch over experts [e0, e1): its chunk's expert and pairs
// order[p0 .. p1); false for a block past the range's last chunk (a launch
// has the most chunks a range can have: its experts plus pairs / chunk).
// chunks[e] is the first chunk of expert e (group_pairs_kernel).
__device__ __forceinline__ bool chunk_of_block(const int* offsets, const int* chunks, int e0, int e1, int& e, int& p0, int& p1) {
  const int c = chunks[e0] + static_cast<int>(blockIdx.y);
  if (c >= chunks[e1]) return false;
  int lo = e0, hi = e1 - 1;  // the last expert whose first chunk is <= c: c is one of its chunks
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (chunks[mid] <= c) lo = mid;
    else hi = mid - 1;
  }
  e = lo;
  p0 = offsets[lo] + (c - chunks[lo]) * kChunkPairs;
  p1 = min(p0 + kChunkPairs, offsets[lo + 1]);
  return true;
}

// One block: pairs counted per expert, offsets, then each pair's id placed
// in its expert's range. The order within an expert is arbitrary: every
// pair's result is computed on its own, so it does not change any value.
__global__ void group_pairs_kernel(const int* idx, int n, int E, int* order, int* offsets, int* chunks) {
  griddep_wait();
  extern __shared__ int cnt[];  // [E + 1] counts, then [E] cursors
  int* cur = cnt + E + 1;
  for (int e = threadIdx.x; e <= E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  for (int p = threadIdx.x; p < n; p += blockDim.x) atomicAdd(&cnt[idx[p] + 1], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int c = 0;
    chunks[0] = 0;
    for (int e = 0; e < E; ++e) {
      c += (cnt[e + 1] + kChunkPairs - 1) / kChunkPairs;
      chunks[e + 1] = c;
      cnt[e + 1] += cnt[e];
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e <= E; e += blockDim.x) {
    offsets[e] = cnt[e];
    if (e < E) cur[e] = cnt[e];
  }
  __syncthreads();
  for (int p = threadIdx.x; p < n; p += blockDim.x) order[atomicAdd(&cur[idx[p]], 1)] = p;
}

constexpr int kGroupTokens = 8;  // dp4a fallback: tokens per pass over a weight row

// An expert whose table entry is null runs elsewhere (the host: a prompt
// chunk's third place, expert_tier.cuh): its pairs' rows [r0, r1) of out
// (n columns) become 0, which the host's part is added to.
__device__ __forceinline__ void zero_expert_rows(const int* order, int p0, int p1, int r0, int r1, int n, float* out) {
  for (int i = p0; i < p1; ++i)
    for (int r = r0 + threadIdx.x; r < r1; r += blockDim.x) out[static_cast<long long>(order[i]) * n + r] = 0.0f;
}

// Runs Tile over expert e's pairs order[p0 .. p1), Tile::kTokens at a time (the
// QuantX row of pair p is p / div); store(acc, i0, n) keeps each pass's
// results for pairs order[i0 .. i0 + n).
template <typename Tile, int NM, typename Store>
__device__ __forceinline__ void expert_passes(const DevMatrix (&W)[NM], int r0, const QuantX& q, const int* order, int p0, int p1, int div,
                                              typename Tile::Smem& sm, Store&& store) {
  for (int i0 = p0; i0 < p1; i0 += Tile::kTokens) {
    const int n = min(Tile::kTokens, p1 - i0);
    __syncthreads();  // the previous pass is done with sm.qrow
    for (int x = threadIdx.x; x < n; x += blockDim.x) sm.qrow[x] = order[i0 + x] / div;
    float acc[NM][Tile::NT][4];
    Tile::run(W, r0, q, n, sm, acc);
    store(acc, i0, n);
  }
}

// act[p, r] = silu(gate_e[r] . hn[t]) * (up_e[r] . hn[t]) for expert e's pairs p (token t = p / K).
template <Kind K, bool kAsym>
__global__ void __launch_bounds__(kMmaWarps * 32) gate_up_mma_kernel(ExpertTable tab, const int* order, const int* offsets, const int* chunks,
                                                                      int e0, int e1, int Kk, QuantX qx, float* act) {
  griddep_wait();
  using Tile = MmaTile<K, kAsym, 2, kMmaPairs>;
  __shared__ typename Tile::Smem sm;
  const int I = tab.gate.rows, r0 = blockIdx.x * kMmaRows;
  int e, p0, p1;
  if (!chunk_of_block(offsets, chunks, e0, e1, e, p0, p1)) return;
  if (!tab.gate_ptrs[e]) return zero_expert_rows(order, p0, p1, r0, min(r0 + kMmaRows, I), I, act);
  DevMatrix W[2] = {tab.gate, tab.up};
  W[0].data = tab.gate_ptrs[e];
  W[1].data = tab.up_ptrs[e];
  expert_passes<Tile>(W, r0, qx, order, p0, p1, Kk, sm, [&](const float (&acc)[2][Tile::NT][4], int i0, int n) {
    Tile::for_each_result(r0, I, n, [&](int j, int c, int slot, int r) {
      act[static_cast<long long>(order[i0 + slot]) * I + r] = siluf(acc[0][j][c]) * acc[1][j][c];
    });
  });
}

// y[p, r] = down_e[r] . act[p] for expert e's pairs p (act quantized per pair).
template <Kind K, bool kAsym>
__global__ void __launch_bounds__(kMmaWarps * 32) down_mma_kernel(ExpertTable tab, const int* order, const int* offsets, const int* chunks, int e0,
                                                                   int e1, QuantX qa, float* y) {
  griddep_wait();
  using Tile = MmaTile<K, kAsym, 1, kMmaPairs>;
  __shared__ typename Tile::Smem sm;
  const int H = tab.down.rows, r0 = blockIdx.x * kMmaRows;
  int e, p0, p1;
  if (!chunk_of_block(offsets, chunks, e0, e1, e, p0, p1)) return;
  if (!tab.down_ptrs[e]) return zero_expert_rows(order, p0, p1, r0, min(r0 + kMmaRows, H), H, y);
  DevMatrix W[1] = {tab.down};
  W[0].data = tab.down_ptrs[e];
  expert_passes<Tile>(W, r0, qa, order, p0, p1, 1, sm, [&](const float (&acc)[1][Tile::NT][4], int i0, int n) {
    Tile::for_each_result(r0, H, n, [&](int j, int c, int slot, int r) { y[static_cast<long long>(order[i0 + slot]) * H + r] = acc[0][j][c]; });
  });
}

// Warp per (expert, row): gate and up of every pair of the expert, 8 at a time.
template <Kind KG>
__global__ void gate_up_grouped_kernel(ExpertTable tab, const int* order, const int* offsets, const int* chunks, int e0, int e1, int K, QuantX qx,
                                       float* act) {
  griddep_wait();
  const int I = tab.gate.rows;
  const int r = blockIdx.x * kWarps + threadIdx.x / 32;
  int e, p0, p1;
  if (r >= I || !chunk_of_block(offsets, chunks, e0, e1, e, p0, p1)) return;
  if (!tab.gate_ptrs[e]) {
    if ((threadIdx.x & 31) == 0)
      for (int i = p0; i < p1; ++i) act[static_cast<long long>(order[i]) * I + r] = 0.0f;
    return;
  }
  DevMatrix g = tab.gate, u = tab.up;
  g.data = tab.gate_ptrs[e];
  u.data = tab.up_ptrs[e];
  for (int i = p0; i < p1; i += kGroupTokens) {
    const int n = min(kGroupTokens, p1 - i);
    int rows[kGroupTokens];
    for (int j = 0; j < kGroupTokens; ++j) rows[j] = order[i + min(j, n - 1)] / K;  // the pair's token
    float gv[kGroupTokens], uv[kGroupTokens];
    warp_row_dot_q_n<KG, kGroupTokens>(g, r, qx, rows, n, gv);
    warp_row_dot_q_n<KG, kGroupTokens>(u, r, qx, rows, n, uv);
    if ((threadIdx.x & 31) == 0)
      for (int j = 0; j < n; ++j) act[static_cast<long long>(order[i + j]) * I + r] = siluf(gv[j]) * uv[j];
  }
}

// Warp per (expert, output row): y[p, r] = down_e[r] . act[p] for the expert's pairs.
template <Kind KD>
__global__ void down_grouped_kernel(ExpertTable tab, const int* order, const int* offsets, const int* chunks, int e0, int e1, QuantX qa, float* y) {
  griddep_wait();
  const int H = tab.down.rows;
  const int r = blockIdx.x * kWarps + threadIdx.x / 32;
  int e, p0, p1;
  if (r >= H || !chunk_of_block(offsets, chunks, e0, e1, e, p0, p1)) return;
  if (!tab.down_ptrs[e]) {
    if ((threadIdx.x & 31) == 0)
      for (int i = p0; i < p1; ++i) y[static_cast<long long>(order[i]) * H + r] = 0.0f;
    return;
  }
  DevMatrix d = tab.down;
  d.data = tab.down_ptrs[e];
  for (int i = p0; i < p1; i += kGroupTokens) {
    const int n = min(kGroupTokens, p1 - i);
    int rows[kGroupTokens];
    for (int j = 0; j < kGroupTokens; ++j) rows[j] = order[i + min(j, n - 1)];  // act is quantized per pair
    float yv[kGroupTokens];
    warp_row_dot_q_n<KD, kGroupTokens>(d, r, qa, rows, n, yv);
    if ((threadIdx.x & 31) == 0)
      for (int j = 0; j < n; ++j) y[static_cast<long long>(order[i + j]) * H + r] = yv[j];
  }
}

// out[t, r] = sum_k w[t, k] y[t K + k, r], k in order (as down_kernel sums).
__global__ void combine_kernel(const float* y, const float* w, int K, int H, float* out) {
  griddep_wait();
  const int t = blockIdx.x;
  for (int r = threadIdx.x; r < H; r += blockDim.x) {
    float sum = 0;
    for (int k = 0; k < K; ++k) sum += w[t * K + k] * y[static_cast<long long>(t * K + k) * H + r];
    out[static_cast<long long>(t) * H + r] = sum;
  }
}

}  // namespace

bool moe_grouped_supported(const ExpertTable& tab) { return takes_int8_x(tab.gate) && takes_int8_x(tab.down) && tab.gate.kind == tab.up.kind; }

void moe_grouped_begin(const ExpertTable& tab, const float* hn, const int* idx, int T, int K, int E, const MoeScratch& sc, cudaStream_t s,
                       const QuantX& q, bool hn_in_q) {
  launch(group_pairs_kernel, 1, 1024, (2 * E + 1) * sizeof(int), s, idx, T * K, E, sc.order, sc.offsets, sc.offsets + E + 1);
  if (!hn_in_q) quantize_x(hn, T, tab.gate.cols, tab.gate.kind == Kind::kI4, q, s);
  check(cudaGetLastError(), "moe grouped launch");
}

void moe_grouped_experts(const ExpertTable& tab, const float* hn, int e0, int e1, int E, int T, int K, const MoeScratch& sc, cudaStream_t s,
                         const QuantX& q, bool hn_in_q) {
  const int n = T * K, I = tab.gate.rows, H = tab.down.rows, ne = e1 - e0;
  if (ne <= 0) return;
  // Blocks over the range's chunks: at most one per expert plus pairs / chunk.
  const int* chunks = sc.offsets + E + 1;
  const int nc = ne + n / kChunkPairs;
  if (!hn_in_q) quantize_x(hn, T, tab.gate.cols, tab.gate.kind == Kind::kI4, q, s);
  const bool mma = mma_supported() && tab.gate.asym == tab.up.asym;
  const dim3 block(kWarps * 32);
  // (Tiles of 16 pairs with deeper pipelines, as the few-token matmuls take,
  // measured slower here: 8 tokens 154 us against 119, 16 tokens 229
  // against 202 at the 35B shapes, session 22.)
  if (mma) {
    dispatch_mma(tab.gate, [&]<Kind KK, bool kAsym>() {
      launch(gate_up_mma_kernel<KK, kAsym>, dim3((I + kMmaRows - 1) / kMmaRows, nc), kMmaWarps * 32, 0, s, tab, sc.order, sc.offsets,
             chunks, e0, e1, K, q, sc.act);
    });
  } else {
    const dim3 g1((I + kWarps - 1) / kWarps, nc);
    if (tab.gate.kind == Kind::kI4) launch(gate_up_grouped_kernel<Kind::kI4>, g1, block, 0, s, tab, sc.order, sc.offsets, chunks, e0, e1, K, q, sc.act);
    else launch(gate_up_grouped_kernel<Kind::kI8>, g1, block, 0, s, tab, sc.order, sc.offsets, chunks, e0, e1, K, q, sc.act);
  }
  // Every pair's activations, or (a range) only the range's pairs: rows are
  // quantized each on its own, so the values are the same either way.
  if (e0 == 0 && e1 == E) quantize_x(sc.act, n, I, tab.down.kind == Kind::kI4, q, s);
  else quantize_x_rows(sc.act, sc.order, sc.offsets + e0, sc.offsets + e1, n, I, tab.down.kind == Kind::kI4, q, s);
  if (mma) {
    dispatch_mma(tab.down, [&]<Kind KK, bool kAsym>() {
      launch(down_mma_kernel<KK, kAsym>, dim3((H + kMmaRows - 1) / kMmaRows, nc), kMmaWarps * 32, 0, s, tab, sc.order, sc.offsets,
             chunks, e0, e1, q, sc.y);
    });
  } else {
    const dim3 g2((H + kWarps - 1) / kWarps, nc);
    if (tab.down.kind == Kind::kI4) launch(down_grouped_kernel<Kind::kI4>, g2, block, 0, s, tab, sc.order, sc.offsets, chunks, e0, e1, q, sc.y);
    else launch(down_grouped_kernel<Kind::kI8>, g2, block, 0, s, tab, sc.order, sc.offsets, chunks, e0, e1, q, sc.y);
  }
  check(cudaGetLastError(), "moe grouped launch");
}

void moe_grouped_end(const ExpertTable& tab, const float* w, int T, int K, const MoeScratch& sc, float* out, cudaStream_t s) {
  launch(combine_kernel, T, 256, 0, s, sc.y, w, K, tab.down.rows, out);
  check(cudaGetLastError(), "moe grouped launch");
}

bool moe_grouped(const ExpertTable& tab, const float* hn, const int* idx, const float* w, int T, int K, int E, const MoeScratch& sc, float* out,
                 cudaStream_t s, const QuantX& q, bool hn_in_q) {
  if (!moe_grouped_supported(tab)) return false;
  moe_grouped_begin(tab, hn, idx, T, K, E, sc, s, q, hn_in_q);
  moe_grouped_experts(tab, hn, 0, E, E, T, K, sc, s, q, true);
  moe_grouped_end(tab, w, T, K, sc, out, s);
  return true;
}

void route_topk(const float* logits, int T, int E, int K, int* idx, float* w, cudaStream_t s, const DevMatrix* gate, const float* hn,
                float* gate_out, bool with_shared, unsigned long long* counts) {
  if (with_shared && (!gate || E > 32 * 16)) throw Error("CUDA: route_topk with the shared expert needs its 1-row gate and E <= 512 (internal)");
  if (E <= 32 * 16) {
    const DevMatrix g = gate ? *gate : DevMatrix{};
    float* go = gate ? gate_out : nullptr;
    const RouteArgs a{const_cast<float*>(logits), E, K, idx, w, g, hn, go, with_shared, counts};
    auto run = [&]<int PER>() {
      dispatch_kind(g.kind, [&]<Kind KG>() { launch(route_warp_kernel<PER, KG>, T, gate ? kRouteWarps * 32 : 32, 0, s, a); });
    };
    if (E <= 64) run.template operator()<2>();
    else if (E <= 128) run.template operator()<4>();
    else if (E <= 256) run.template operator()<8>();
    else run.template operator()<16>();
    check(cudaGetLastError(), "route launch");
    return;
  }
  launch(route_kernel, T, 256, E * sizeof(float), s, logits, E, K, idx, w, counts);
  check(cudaGetLastError(), "route launch");
  if (gate) matmul(*gate, hn, T, gate_out, 1, s);
}

void router_route_topk(const DevMatrix& router, const RouteArgs& a, unsigned* ticket, cudaStream_t s) {
  router_route(router, a, ticket, NoRouteTail{}, s);
}

void moe_gate_up(const ExpertTable& tab, const float* hn, const int* idx, int T, int K, float* act, cudaStream_t s, const QuantX* q, bool hn_in_q,
                 const int* lim) {
  const dim3 grid((tab.gate.rows + kWarps - 1) / kWarps, T * K), block(kWarps * 32);
  if (tab.gate.kind != tab.up.kind) throw Error("CUDA: experts' gate and up matrices differ in format");
  if (q && takes_int8_x(tab.gate)) {
    if (!hn_in_q) quantize_x(hn, T, tab.gate.cols, tab.gate.kind == Kind::kI4, *q, s);
    const int up_rows = launch_tuning().up_rows;
    dispatch_lanes(tab.gate.cols, [&]<int L>() {
      auto go = [&]<int kUpRows>() {
        const dim3 rgrid((tab.gate.rows + kWarps * (32 / L) * kUpRows - 1) / (kWarps * (32 / L) * kUpRows), T * K);
        if (tab.gate.kind == Kind::kI4) launch(gate_up_rows_kernel<Kind::kI4, L, kUpRows>, rgrid, block, 0, s, tab, idx, K, *q, act, lim);
        else launch(gate_up_rows_kernel<Kind::kI8, L, kUpRows>, rgrid, block, 0, s, tab, idx, K, *q, act, lim);
      };
      if (up_rows == 1) go.template operator()<1>();
      else if (up_rows == 4) go.template operator()<4>();
      else go.template operator()<2>();
    }, launch_tuning().moe_lanes);
    check(cudaGetLastError(), "moe gate_up launch");
    return;
  }
  dispatch_kind(tab.gate.kind, [&]<Kind K_>() { launch(gate_up_kernel<K_, K_>, grid, block, 0, s, tab, hn, idx, K, act, lim); });
}

void moe_down(const ExpertTable& tab, const float* act, const int* idx, const float* w, int T, int K, float* out, cudaStream_t s, const QuantX* q,
              const int* lim) {
  const dim3 grid((tab.down.rows + kWarps - 1) / kWarps, T), block(kWarps * 32);
  if (q && takes_int8_x(tab.down)) {
    quantize_x(act, T * K, tab.down.cols, tab.down.kind == Kind::kI4, *q, s);
    if (K <= 32) {
      const int down_rows = launch_tuning().down_rows;
      dispatch_lanes(tab.down.cols, [&]<int L>() {
        auto go = [&]<int kDownRows>() {
          const int rows = (32 / L) * kDownRows;
          const dim3 sgrid((tab.down.rows + rows - 1) / rows, T);
          const int threads = 32 * K;  // >= the block's rows (at most 32), which its first threads sum
          if (tab.down.kind == Kind::kI4) launch(down_q_split_kernel<Kind::kI4, L, kDownRows>, sgrid, threads, 0, s, tab, idx, w, K, *q, out, lim);
          else launch(down_q_split_kernel<Kind::kI8, L, kDownRows>, sgrid, threads, 0, s, tab, idx, w, K, *q, out, lim);
        };
        if (down_rows == 2) go.template operator()<2>();
        else if (down_rows == 8) go.template operator()<8>();
        else go.template operator()<4>();
      }, launch_tuning().moe_lanes);
    } else if (tab.down.kind == Kind::kI4) {
      launch(down_q_kernel<Kind::kI4>, grid, block, 0, s, tab, idx, w, K, *q, out);
    } else {
      launch(down_q_kernel<Kind::kI8>, grid, block, 0, s, tab, idx, w, K, *q, out);
    }
    check(cudaGetLastError(), "moe down launch");
    return;
  }
  dispatch_kind(tab.down.kind, [&]<Kind K_>() { launch(down_kernel<K_>, grid, block, 0, s, tab, act, idx, w, K, out); });
  check(cudaGetLastError(), "moe down launch");
}

}  // namespace coli::cuda
