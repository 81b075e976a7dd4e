// y = x W^T on the device for every weight format, one warp per weight row
// (one token: a group of lanes per one or two rows, group_rows_dot_q; over
// 2,048+ rows, resident blocks streaming over the rows, gemv_q_stream_kernel).
// int4 and int8 weights with a multiple of 32 columns meet x quantized to
// int8 per 32-column block (scale absmax/127, as the CPU's VNNI path) in
// __dp4a: four multiply-adds per instruction and a quarter of the x bytes
// of the float path, which bounds decode (x is read once per weight chunk).
// Other matrices take the float path (dev_matrix.cuh).
#include <cooperative_groups.h>

#include <algorithm>
#include <vector>

#include "cuda_util.cuh"
#include "kernels.cuh"
#include "mma_tile.cuh"

namespace coli::cuda {

namespace {

constexpr int kWarps = 8;        // rows per block of 256 threads
constexpr int kDecodeWarps = 4;  // the same for one token
static_assert(CudaTuning{}.gemv_warps == kDecodeWarps && CudaTuning{}.float_warps == kDecodeWarps, "CudaTuning's defaults are these");
// Tensor-core path (mma_tile.cuh): chunks of at least
// CudaTuning::mma_min_tokens tokens; a block covers kMmaRows rows times
// kMmaTokens tokens (kSmallTokens up to CudaTuning::mma_small).
constexpr int kMmaTokens = 64;
constexpr int kMmaWideRows = 32768;  // matmuls of this many rows take the tensor cores from 2 tokens
constexpr int kFloatTokenWarps = 16;    // float matmuls of up to this many tokens: a warp per (row, token)

// ---- float path ----------------------------------------------------------

// Tokens in groups of NT per pass over the row (a tail group goes one token at a time).
template <Kind K, int NT>
__device__ void matmul_row(const DevMatrix& W, int r, const float* __restrict__ x, int T, float* __restrict__ y, int ldy) {
  const int lane = threadIdx.x & 31;
  for (int t0 = 0; t0 < T; t0 += NT) {
    float acc[NT];
    if (t0 + NT <= T) {
      warp_row_dot<K, NT>(W, r, x + static_cast<long long>(t0) * W.cols, W.cols, acc);
    } else {
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

// The matrices of a MatmulBatch share x; block b belongs to the matrix
// whose [first[i], first[i+1]) holds it.
struct Batch {
  MatmulOut m[kMaxBatch];
  int first[kMaxBatch + 1];
  int n;
};

// The matrix block x (blockIdx.x unless given) belongs to; *blk: the
// block's index within it.
__device__ __forceinline__ int batch_index(const Batch& b, int* blk, int x = -1) {
  if (x < 0) x = static_cast<int>(blockIdx.x);
  int i = 0;
  while (i + 1 < b.n && x >= b.first[i + 1]) ++i;
  *blk = x - b.first[i];
  return i;
}

// Warp per (row, group of NT tokens), rows fastest: matrices with few rows
// (the router, a 1-row gate) still spread over the whole GPU.
template <Kind K, int NT>
__global__ void matmul_kernel(Batch b, const float* __restrict__ x, int T) {
  int blk;
  const MatmulOut& o = b.m[batch_index(b, &blk)];
  const int gw = blk * (blockDim.x / 32) + threadIdx.x / 32, groups = (T + NT - 1) / NT;
  if (gw < o.W.rows * groups) prefetch_row_l2(o.W, gw % o.W.rows);
  griddep_wait();
  if (gw >= o.W.rows * groups) return;
  const int r = gw % o.W.rows, t0 = gw / o.W.rows * NT;
  matmul_row<K, NT>(o.W, r, x + static_cast<long long>(t0) * o.W.cols, min(NT, T - t0), o.y + static_cast<long long>(t0) * o.ldy, o.ldy);
}

// ---- float matrices, prompt chunks ----------------------------------------

// Block (64 rows, 64 tokens, one slice of kFloatSlice columns): the slice in
// steps of 32 columns through shared memory, the next step's loads in
// registers while this one computes, each thread a 4 x 4 patch of outputs
// summed over its columns in order; x is read once per 64 rows instead of
// once per row, and the slices give a prompt chunk of the router (256 rows)
// a few hundred blocks.
constexpr int kTileRows = 64, kTileTokens = 64, kTileK = 32, kFloatSlice = ::coli::kFloatTiledSlice;  // placement/device_sizes.h
constexpr int kTileLoads = kTileRows * kTileK / 256;  // elements of each tile per thread per step

int float_slices(int cols) { return ::coli::float_tiled_slices(cols); }

template <Kind K>
__device__ __forceinline__ float float_weight(const DevMatrix& W, int r, int c) {
  const uint8_t* row = W.data + static_cast<long long>(r) * W.row_stride;
  if constexpr (K == Kind::kF32) return reinterpret_cast<const float*>(row)[c];
  else if constexpr (K == Kind::kBF16) return bf16_bits_to_f32(reinterpret_cast<const uint16_t*>(row)[c]);
  else return __half2float(__ushort_as_half(reinterpret_cast<const uint16_t*>(row)[c]));
}

template <Kind K>
__global__ void __launch_bounds__(256, 2) float_tile_kernel(DevMatrix W, const float* __restrict__ x, int T, float* __restrict__ part) {
  griddep_wait();
  __shared__ __align__(16) float ws[kTileK][kTileRows + 4];
  __shared__ __align__(16) float xs[kTileK][kTileTokens + 4];
  const int rows = W.rows, cols = W.cols, r0 = blockIdx.x * kTileRows, t0 = blockIdx.y * kTileTokens;
  const int c_begin = blockIdx.z * kFloatSlice, c_end = min(cols, c_begin + kFloatSlice);
  const int tid = threadIdx.x, tr = tid / 16, tt = tid % 16;  // outputs: rows r0 + 4 tr .., tokens t0 + 4 tt ..
  float wr[kTileLoads], xr[kTileLoads];
  auto load = [&](int k0) {
#pragma unroll
    for (int i = 0; i < kTileLoads; ++i) {
      const int e = tid + 256 * i, a = e / kTileK, c = k0 + e % kTileK;
      wr[i] = r0 + a < rows && c < c_end ? float_weight<K>(W, r0 + a, c) : 0.0f;
      xr[i] = t0 + a < T && c < c_end ? x[static_cast<long long>(t0 + a) * cols + c] : 0.0f;
    }
  };
  float acc[4][4] = {};
  load(c_begin);
  for (int k0 = c_begin; k0 < c_end; k0 += kTileK) {
#pragma unroll
    for (int i = 0; i < kTileLoads; ++i) {
      const int e = tid + 256 * i;
      ws[e % kTileK][e / kTileK] = wr[i], xs[e % kTileK][e / kTileK] = xr[i];
    }
    __syncthreads();
    if (k0 + kTileK < c_end) load(k0 + kTileK);
#pragma unroll 8
    for (int kk = 0; kk < kTileK; ++kk) {
      const float4 a = *reinterpret_cast<const float4*>(&ws[kk][4 * tr]), v = *reinterpret_cast<const float4*>(&xs[kk][4 * tt]);
      const float av[4] = {a.x, a.y, a.z, a.w}, xv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * xv[j];
    }
    __syncthreads();
  }
  float* p = part + static_cast<long long>(blockIdx.z) * T * rows;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = r0 + 4 * tr + i, t = t0 + 4 * tt + j;
      if (r < rows && t < T) p[static_cast<long long>(t) * rows + r] = acc[i][j];
    }
}

// y[t, r] = the slices' partial sums in slice order.
__global__ void slice_sum_kernel(const float* __restrict__ part, int slices, int T, int rows, float* __restrict__ y, int ldy) {
  griddep_wait();
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x, n = static_cast<long long>(T) * rows;
  if (i >= n) return;
  float sum = 0.0f;
  for (int sl = 0; sl < slices; ++sl) sum += part[sl * n + i];
  y[(i / rows) * ldy + i % rows] = sum;
}

// ---- int8-activation path ------------------------------------------------

// Warp per (token, 32-column block), lane per column (warp_quantize_block).
__global__ void quantize_x_kernel(const float* x, const float* up, int T, int cols, bool nibble_order, QuantX q) {
  griddep_wait();
  const int w = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
  const int nb = cols / 32;
  if (w >= T * nb) return;
  const int t = w / nb, b = w % nb;
  const long long i = static_cast<long long>(t) * cols + b * 32 + lane;
  const float v = up ? x[i] / (1.0f + expf(-x[i])) * up[i] : x[i];
  warp_quantize_block(v, nibble_order, q, static_cast<long long>(t) * nb + b);
}

__global__ void quantize_x_rows_kernel(const float* x, const int* order, const int* first, const int* last, int cols, bool nibble_order, QuantX q) {
  griddep_wait();
  const int w = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
  const int nb = cols / 32, i = *first + w / nb;
  if (i >= *last) return;
  const int t = order[i], b = w % nb;
  warp_quantize_block(x[static_cast<long long>(t) * cols + b * 32 + lane], nibble_order, q, static_cast<long long>(t) * nb + b);
}

template <Kind K, int NT>
__device__ void matmul_q_row(const DevMatrix& W, int r, const QuantX& q, int T, float* __restrict__ y, int ldy) {
  for (int t0 = 0; t0 < T; t0 += NT) {
    const int nt = min(NT, T - t0);
    int rows[NT];
    for (int t = 0; t < NT; ++t) rows[t] = t0 + min(t, nt - 1);
    float acc[NT];
    warp_row_dot_q_n<K, NT>(W, r, q, rows, nt, acc);
    if ((threadIdx.x & 31) == 0)
      for (int t = 0; t < nt; ++t) y[static_cast<long long>(t0 + t) * ldy + r] = acc[t];
  }
}

template <Kind K, int NT>
__global__ void matmul_q_kernel(Batch b, QuantX q, int T) {
  int blk;
  const MatmulOut& o = b.m[batch_index(b, &blk)];
  const int r = blk * (blockDim.x / 32) + threadIdx.x / 32;
  if (r < o.W.rows) prefetch_row_l2(o.W, r);
  griddep_wait();
  if (r < o.W.rows) matmul_q_row<K, NT>(o.W, r, q, T, o.y, o.ldy);
}

// One token (decode): a group of L lanes per R consecutive rows
// (group_rows_dot_q), so a matrix's rows are in flight R at a time per
// group and x's codes are read once per group, not per row.
template <Kind K, int L, int kGemvRows>
__global__ void gemv_q_kernel(Batch b, QuantX q) {
  int blk;
  const MatmulOut& o = b.m[batch_index(b, &blk)];
  constexpr int G = 32 / L;  // row groups per warp
  const int warp_r0 = (blk * (blockDim.x / 32) + threadIdx.x / 32) * G * kGemvRows;
  const int r0 = warp_r0 + (threadIdx.x & 31) / L * kGemvRows;
  int rows[kGemvRows];
#pragma unroll
  for (int i = 0; i < kGemvRows; ++i) rows[i] = min(r0 + i, o.W.rows - 1);  // past the end: recomputes the last row, not stored
  if (warp_r0 < o.W.rows) prefetch_rows_l2<kGemvRows, L>(o.W, rows);
  griddep_wait();
  if (warp_r0 >= o.W.rows) return;  // whole warps only: the groups shuffle with full masks
  const DevMatrix W[1] = {o.W};
  float out[1][kGemvRows];
  group_rows_dot_q<K, 1, kGemvRows, L>(W, rows, q, 0, out);
  if ((threadIdx.x & (L - 1)) == 0)
#pragma unroll
    for (int i = 0; i < kGemvRows; ++i)
      if (r0 + i < o.W.rows) o.y[r0 + i] = out[0][i];
}

// One token through large matrices (gemv_stream: 2,048+ rows, every trunk
// projection and the lm_head's column ranges at the real shapes): a grid
// of as many blocks as fit on the SMs at once, whose warps stride over the
// matrices' rows, G x R rows (warp row group wg) at a time: the next
// group's weights are loaded into registers while this group's are
// multiplied, so every SM keeps a steady stream of loads in flight instead
// of running waves of blocks that each load, wait and exit. The first
// group's weights are loaded before griddep_wait (they do not depend on the
// previous kernel; x does). Each lane takes blocks sub, sub + L, ... (PB of
// them) of a row, as group_rows_dot_q does, with its arithmetic in its
// order. b.first: warp row groups, not blocks.
constexpr int kStreamWarps = 4;  // per block

template <Kind K, int L, int R, int PB>
__global__ void __launch_bounds__(kStreamWarps * 32) gemv_q_stream_kernel(Batch b, QuantX q) {
  constexpr int G = 32 / L;
  const int sub = threadIdx.x & (L - 1), lg = (threadIdx.x & 31) / L, total = b.first[b.n];
  const int stride = gridDim.x * (blockDim.x / 32);
  // Matrix mi and rows of warp row group wg (rows past the end: the last
  // row again, computed, not stored).
  auto locate = [&](int wg, int& mi, int& r0, int (&rows)[R]) {
    mi = 0;
    while (mi + 1 < b.n && wg >= b.first[mi + 1]) ++mi;
    r0 = ((wg - b.first[mi]) * G + lg) * R;
#pragma unroll
    for (int i = 0; i < R; ++i) rows[i] = min(r0 + i, b.m[mi].W.rows - 1);
  };
  auto load = [&](int mi, const int (&rows)[R], RawBlock<K> (&buf)[R][PB], float (&rs)[R]) {
    const DevMatrix& W = b.m[mi].W;
#pragma unroll
    for (int i = 0; i < R; ++i) {
#pragma unroll
      for (int j = 0; j < PB; ++j) load_raw_block<K>(W, rows[i], sub + j * L, buf[i][j]);
      rs[i] = K == Kind::kI8 ? __ldg(reinterpret_cast<const float*>(W.data + W.scale_offset + static_cast<long long>(rows[i]) * W.scale_row_bytes)) : 1.0f;
    }
  };
  int wg = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, mi = 0, r0 = 0, rows[R];
  RawBlock<K> cur[R][PB];
  float rs[R];
  if (wg < total) locate(wg, mi, r0, rows), load(mi, rows, cur, rs);
  griddep_wait();
  if (wg >= total) return;  // whole warps only: the groups shuffle with full masks
  int xw[PB][8], xsum[PB];
  float xs[PB];
#pragma unroll
  for (int j = 0; j < PB; ++j) {
    const int qb = sub + j * L;
    const int4* xp = reinterpret_cast<const int4*>(q.codes + static_cast<long long>(qb) * 32);
    const int4 xa = xp[0], xb = xp[1];
    xw[j][0] = xa.x, xw[j][1] = xa.y, xw[j][2] = xa.z, xw[j][3] = xa.w, xw[j][4] = xb.x, xw[j][5] = xb.y, xw[j][6] = xb.z, xw[j][7] = xb.w;
    xs[j] = q.scale[qb];
    xsum[j] = K == Kind::kI4 ? q.sum[qb] : 0;
  }
  for (;;) {
    const int wn = wg + stride;
    int mn = 0, r0n = 0, rows_n[R];
    RawBlock<K> nxt[R][PB];
    float rs_n[R];
    if (wn < total) locate(wn, mn, r0n, rows_n), load(mn, rows_n, nxt, rs_n);
    const MatmulOut& o = b.m[mi];
    float out[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      out[i] = 0.0f;
#pragma unroll
      for (int j = 0; j < PB; ++j) out[i] = raw_block_dot<K>(o.W, cur[i][j], xw[j], xs[j], xsum[j], out[i]);
#pragma unroll
      for (int off = L / 2; off > 0; off >>= 1) out[i] += __shfl_xor_sync(0xffffffffu, out[i], off);
      if (K == Kind::kI8) out[i] *= rs[i];
    }
    if (sub == 0)
#pragma unroll
      for (int i = 0; i < R; ++i)
        if (r0 + i < o.W.rows) o.y[r0 + i] = out[i];
    if (wn >= total) break;
    wg = wn, mi = mn, r0 = r0n;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      rows[i] = rows_n[i], rs[i] = rs_n[i];
#pragma unroll
      for (int j = 0; j < PB; ++j) cur[i][j] = nxt[i][j];
    }
  }
}

// Tensor cores: block (blk, ty) computes rows blk * kMmaRows .. + kMmaRows
// of its matrix for tokens ty * BN .. + BN, S pipeline stages: (64, 2) for
// prompt chunks, (kSmallTokens, kSmallStages) for a few tokens.
constexpr int kSmallTokens = 16, kSmallStages = 5;

template <Kind K, bool kAsym, int BN, int S>
__global__ void __launch_bounds__(kMmaWarps * 32) matmul_mma_kernel(Batch b, QuantX q, int T) {
  griddep_wait();
  using Tile = MmaTile<K, kAsym, 1, BN, S>;
  __shared__ typename Tile::Smem sm;
  int blk;
  const MatmulOut& o = b.m[batch_index(b, &blk)];
  const int r0 = blk * kMmaRows, t0 = blockIdx.y * BN, ntok = min(BN, T - t0);
  for (int x = threadIdx.x; x < BN; x += blockDim.x) sm.qrow[x] = min(t0 + x, T - 1);
  const DevMatrix W[1] = {o.W};
  float acc[1][Tile::NT][4];
  Tile::run(W, r0, q, ntok, sm, acc);
  Tile::for_each_result(r0, o.W.rows, ntok, [&](int j, int c, int tok, int row) { o.y[static_cast<long long>(t0 + tok) * o.ldy + row] = acc[0][j][c]; });
}

// Split-K for a few tokens through few rows (the trunk's projections at 16
// rows or fewer: a tile per 64 rows leaves most SMs idle, 32 blocks for a
// 2,048-row matrix): the `splits` blocks of a thread block cluster (along
// x) take consecutive ranges of the columns' stages, each its part of
// the tile's dot products; the parts meet in distributed shared memory,
// added in block rank order (deterministic: the same values for the same
// splits), each block writing every splits-th of the tile's results.
template <Kind K, bool kAsym, int BN, int S>
__global__ void __launch_bounds__(kMmaWarps * 32) matmul_mma_split_kernel(Batch b, QuantX q, int T, int splits) {
  griddep_wait();
  using Tile = MmaTile<K, kAsym, 1, BN, S>;
  __shared__ typename Tile::Smem sm;
  const int rank = static_cast<int>(blockIdx.x) % splits;  // the cluster's block rank: clusters of `splits` along x
  int blk;
  const MatmulOut& o = b.m[batch_index(b, &blk, static_cast<int>(blockIdx.x) / splits)];
  const int r0 = blk * kMmaRows, t0 = blockIdx.y * BN, ntok = min(BN, T - t0);
  for (int x = threadIdx.x; x < BN; x += blockDim.x) sm.qrow[x] = min(t0 + x, T - 1);
  const int nb = o.W.cols / 32, stages = (nb + Tile::KB - 1) / Tile::KB;
  const int kb_lo = stages * rank / splits * Tile::KB, kb_hi = min(nb, stages * (rank + 1) / splits * Tile::KB);
  const DevMatrix W[1] = {o.W};
  float acc[1][Tile::NT][4];
  Tile::run(W, r0, q, ntok, sm, acc, kb_lo, kb_hi);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  constexpr int NE = Tile::NT * 4;  // results per thread
  static_assert(sizeof(sm.a) >= NE * kMmaWarps * 32 * sizeof(float), "the parts fit the weight buffers");
  float* part = reinterpret_cast<float*>(sm.a);  // free: run() ends past its last stage's barrier, no copies in flight
  const int n = kMmaWarps * 32;
#pragma unroll
  for (int e = 0; e < NE; ++e) part[e * n + threadIdx.x] = acc[0][e / 4][e % 4];
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int lane = threadIdx.x & 31, ra = r0 + (threadIdx.x >> 5) * 16 + (lane >> 2), i = lane & 3;
  for (int e = rank; e < NE; e += splits) {
    float v = 0.0f;
    for (int r = 0; r < splits; ++r) v += cluster.map_shared_rank(part, r)[e * n + threadIdx.x];
    const int j = e / 4, c = e % 4, tok = 8 * j + 2 * i + (c & 1), row = ra + 8 * (c >> 1);
    if (tok < ntok && row < o.W.rows) o.y[static_cast<long long>(t0 + tok) * o.ldy + row] = v;
  }
  cluster.sync();  // every block has read the others' parts
#else
  __trap();  // the host splits only on sm_90+ (clusters_supported())
#endif
}

// The device's SM count (cached: one device a process).
int sm_count() {
  static const int sms = [] {
    int dev = 0, n = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev), "SM count");
    return n;
  }();
  return sms;
}

// Blocks of a cluster for a few-token tensor-core matmul of `blocks` tiles
// over nb 32-column blocks: doubled while the grid holds fewer than
// CudaTuning::mma_split blocks per SM and each part keeps two stages or
// more; at most 8 (the portable cluster size).
int mma_splits(int blocks, int nb, int kb) {
  const int per_sm = launch_tuning().mma_split;
  if (per_sm <= 0 || device_cc_major() < 9) return 1;
  const int stages = (nb + kb - 1) / kb;
  int s = 1;
  while (s < 8 && blocks * s < per_sm * sm_count() && stages >= 2 * 2 * s) s *= 2;
  return s;
}

// Rows per lane group of a one-token matmul over this many rows: two for
// the lm_head's ranges, one otherwise. Measured on the H200 (tg128, int4):
// (4, 2, 1) rows for (>= 32K, >= 8K, fewer) rows 1,842 t/s, (2, 1, 1) 1,892,
// (1, 1, 1) 1,866, (4, 4, 2) 1,734: more rows per group cost registers and
// warps, which the small matrices need more than bytes in flight.
int gemv_rows_for(int rows) { return rows >= 32768 ? 2 : 1; }

// Launches Kernel on min(wanted, as many blocks of kThreads as the device
// holds at once) blocks (counted once per kernel).
template <auto Kernel, int kThreads, typename... Args>
void launch_resident(int wanted, cudaStream_t s, Args&&... args) {
  static const int resident = [] {
    int per_sm = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, Kernel, kThreads, 0), "occupancy");
    return std::max(1, per_sm) * sm_count();
  }();
  launch(Kernel, std::min(resident, wanted), kThreads, 0, s, std::forward<Args>(args)...);
}

// Whether a one-token matmul over total_rows rows of W's kind and width
// takes gemv_q_stream_kernel: from gemv_stream_min_rows() rows, when each
// lane's share of a row (lanes_per_row(W.cols, max_lanes) lanes) is 1, 2 or
// 4 blocks of 32 columns.
bool gemv_stream(const DevMatrix& W, int total_rows, int max_lanes) {
  const int nb = W.cols / 32, L = lanes_per_row(W.cols, max_lanes), pb = nb / L;
  return total_rows >= gemv_stream_min_rows() && nb % L == 0 && (pb == 1 || pb == 2 || pb == 4);
}

}  // namespace

bool mma_supported() {
  return device_cc_major() >= 8;
}

void quantize_x(const float* x, int T, int cols, bool nibble_order, const QuantX& q, cudaStream_t s, const float* up) {
  const int warps = T * (cols / 32);
  launch(quantize_x_kernel, (warps + 7) / 8, 256, 0, s, x, up, T, cols, nibble_order, q);
  check(cudaGetLastError(), "quantize_x launch");
}

void quantize_x_rows(const float* x, const int* order, const int* first, const int* last, int max_rows, int cols, bool nibble_order, const QuantX& q,
                     cudaStream_t s) {
  const long long warps = static_cast<long long>(max_rows) * (cols / 32);
  launch(quantize_x_rows_kernel, static_cast<int>((warps + 7) / 8), 256, 0, s, x, order, first, last, cols, nibble_order, q);
  check(cudaGetLastError(), "quantize_x_rows launch");
}

void matmul_many(const MatmulOut* outs, int n, const float* x, int T, cudaStream_t s, const QuantX* q, bool x_in_q) {
  // One launch per group of one kind and input width.
  bool same = n <= kMaxBatch;
  for (int i = 1; i < n && same; ++i) same = outs[i].W.kind == outs[0].W.kind && outs[i].W.cols == outs[0].W.cols;
  if (!same) {
    std::vector<char> done(n, 0);
    for (int i = 0; i < n; ++i) {
      if (done[i]) continue;
      MatmulOut group[kMaxBatch];
      int g = 0;
      for (int j = i; j < n && g < kMaxBatch; ++j)
        if (!done[j] && outs[j].W.kind == outs[i].W.kind && outs[j].W.cols == outs[i].W.cols) group[g++] = outs[j], done[j] = 1;
      matmul_many(group, g, x, T, s, q, x_in_q);
    }
    return;
  }
  const DevMatrix& W = outs[0].W;
  int total_rows = 0;
  for (int i = 0; i < n; ++i) total_rows += outs[i].W.rows;
  // Tensor cores from mma_min_tokens tokens; over the lm_head's ranges
  // (32K+ rows) from 2, where the dp4a row dots re-read each row's codes
  // per token (H100, 62,080 x 2,048 int4: 2 / 3 / 4 tokens 67 us against
  // 76 / 85 / 93; over 12K rows or fewer dp4a stays ahead to 4 tokens).
  const bool int8_x = q && takes_int8_x(W);
  const bool mma = int8_x && mma_supported() && (T >= launch_tuning().mma_min_tokens || (T >= 2 && total_rows >= kMmaWideRows));
  // Blocks per matrix: rows in blocks (tensor cores, dp4a), or warps of
  // (row, 8 tokens) in blocks of kWarps (float path).
  // Float weights up to kFloatTokenWarps tokens: a warp per (row, token),
  // the one-token dot (16-byte loads of a 16-bit row), whose sums each row
  // then shares with a decode step's; 8 tokens a warp was 3x slower (the
  // bf16 router, 256 x 2,048, at 8 and 16 tokens: 18 us, 6 at 4; H100,
  // kbench, session 24).
  const bool float_per_token = !int8_x && T <= kFloatTokenWarps;
  const int float_groups = int8_x ? 1 : float_per_token ? T : (T + 7) / 8;
  // One token (decode): blocks of kDecodeWarps warps, so that matrices of a
  // few hundred rows (the router) still spread over many SMs.
  const int gemv_warps = launch_tuning().gemv_warps, float_warps = launch_tuning().float_warps;
  const int gemv_lanes = launch_tuning().gemv_lanes;
  const int warps = T == 1 ? (int8_x ? gemv_warps : float_warps) : kWarps;
  const bool gemv = int8_x && T == 1;
  const int gemv_rows = gemv_rows_for(total_rows);
  const int rows_per_block = mma ? kMmaRows : gemv ? warps * (32 / lanes_per_row(W.cols, gemv_lanes)) * gemv_rows : warps;
  Batch b{};
  b.n = n;
  b.first[0] = 0;
  for (int i = 0; i < n; ++i)
    b.m[i] = outs[i], b.first[i + 1] = b.first[i] + (outs[i].W.rows * float_groups + rows_per_block - 1) / rows_per_block;
  const dim3 grid(b.first[n]), block(warps * 32);
  if (int8_x) {
    if (!x_in_q) quantize_x(x, T, W.cols, W.kind == Kind::kI4, *q, s);
    if (mma) {
      // A few tokens (up to CudaTuning::mma_small) on 16-token tiles with
      // deeper pipelines, prompt chunks on 64-token double-buffered ones.
      // Few tiles of those: split-K over clusters (matmul_mma_split_kernel).
      auto tiles = [&]<int BN, int S>() {
        const dim3 mgrid(b.first[n], (T + BN - 1) / BN);
        dispatch_mma(W, [&]<Kind K, bool kAsym>() { launch(matmul_mma_kernel<K, kAsym, BN, S>, mgrid, kMmaWarps * 32, 0, s, b, *q, T); });
      };
      const bool small = T <= launch_tuning().mma_small;
      const int small_tiles = (T + kSmallTokens - 1) / kSmallTokens;
      const int splits = small ? mma_splits(b.first[n] * small_tiles, W.cols / 32, W.kind == Kind::kI4 ? 4 : 2) : 1;
      if (splits > 1) {
        dispatch_mma(W, [&]<Kind K, bool kAsym>() {
          launch_cluster(matmul_mma_split_kernel<K, kAsym, kSmallTokens, kSmallStages>, dim3(b.first[n] * splits, small_tiles), kMmaWarps * 32, 0, s,
                         splits, b, *q, T, splits);
        });
      } else if (small) tiles.template operator()<kSmallTokens, kSmallStages>();
      else tiles.template operator()<kMmaTokens, 2>();
      check(cudaGetLastError(), "matmul_mma launch");
      return;
    }
    if (gemv && gemv_stream(W, total_rows, gemv_lanes)) {
      dispatch_lanes(W.cols, [&]<int L>() {
        // b.first in warp row groups of 32 / L x R rows; the grid: as many
        // blocks as are resident at once.
        auto go = [&]<int R, int PB>() {
          Batch sb = b;
          for (int i = 0; i < n; ++i) sb.first[i + 1] = sb.first[i] + (outs[i].W.rows + (32 / L) * R - 1) / ((32 / L) * R);
          const int wanted = (sb.first[n] + kStreamWarps - 1) / kStreamWarps;
          if (W.kind == Kind::kI4) launch_resident<gemv_q_stream_kernel<Kind::kI4, L, R, PB>, kStreamWarps * 32>(wanted, s, sb, *q);
          else launch_resident<gemv_q_stream_kernel<Kind::kI8, L, R, PB>, kStreamWarps * 32>(wanted, s, sb, *q);
        };
        auto pb = [&]<int R>() {
          switch (W.cols / 32 / L) {
            case 1: go.template operator()<R, 1>(); break;
            case 2: go.template operator()<R, 2>(); break;
            default: go.template operator()<R, 4>(); break;
          }
        };
        if ((gemv_stream_rows() ? gemv_stream_rows() : gemv_rows) == 2) pb.template operator()<2>();
        else pb.template operator()<1>();
      }, gemv_lanes);
    } else if (gemv) {
      dispatch_lanes(W.cols, [&]<int L>() {
        auto go = [&]<int R>() {
          if (W.kind == Kind::kI4) launch(gemv_q_kernel<Kind::kI4, L, R>, grid, block, 0, s, b, *q);
          else launch(gemv_q_kernel<Kind::kI8, L, R>, grid, block, 0, s, b, *q);
        };
        if (gemv_rows == 2) go.template operator()<2>();
        else go.template operator()<1>();
      }, gemv_lanes);
    } else if (W.kind == Kind::kI4) {
      launch(matmul_q_kernel<Kind::kI4, 8>, grid, block, 0, s, b, *q, T);
    } else {
      launch(matmul_q_kernel<Kind::kI8, 8>, grid, block, 0, s, b, *q, T);
    }
    check(cudaGetLastError(), "matmul_q launch");
    return;
  }
  dispatch_kind(W.kind, [&]<Kind K>() {
    if (float_per_token) launch(matmul_kernel<K, 1>, grid, block, 0, s, b, x, T);
    else launch(matmul_kernel<K, 8>, grid, block, 0, s, b, x, T);
  });
  check(cudaGetLastError(), "matmul launch");
}

void matmul(const DevMatrix& W, const float* x, int T, float* y, int ldy, cudaStream_t s, const QuantX* q, bool x_in_q) {
  const MatmulOut o{W, y, ldy};
  matmul_many(&o, 1, x, T, s, q, x_in_q);
}

bool matmul_float_tiled(const DevMatrix& W, const float* x, int T, float* y, int ldy, float* work, cudaStream_t s) {
  if (T < kFloatTiledMinTokens || !(W.kind == Kind::kF32 || W.kind == Kind::kBF16 || W.kind == Kind::kF16)) return false;
  const dim3 grid((W.rows + kTileRows - 1) / kTileRows, (T + kTileTokens - 1) / kTileTokens, float_slices(W.cols));
  dispatch_kind(W.kind, [&]<Kind K>() {
    if constexpr (K == Kind::kF32 || K == Kind::kBF16 || K == Kind::kF16) launch(float_tile_kernel<K>, grid, 256, 0, s, W, x, T, work);
  });
  const long long n = static_cast<long long>(T) * W.rows;
  launch(slice_sum_kernel, static_cast<unsigned>((n + 255) / 256), 256, 0, s, static_cast<const float*>(work), float_slices(W.cols), T, W.rows, y, ldy);
  check(cudaGetLastError(), "float tiled matmul launch");
  return true;
}

}  // namespace coli::cuda
