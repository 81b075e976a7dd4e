// y = x W^T on the device for every weight format, one warp per weight row.
// int4 and int8 weights with a multiple of 32 columns meet x quantized to
// int8 per 32-column block (scale absmax/127, as the CPU's VNNI path) in
// __dp4a: four multiply-adds per instruction and a quarter of the x bytes
// of the float path, which bounds decode (x is read once per weight chunk).
// Other matrices take the float path (dev_matrix.cuh).
#include <vector>

#include "cuda_util.cuh"
#include "kernels.cuh"

namespace coli::cuda {

namespace {

constexpr int kWarps = 8;  // rows per block of 256 threads

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

__device__ __forceinline__ int batch_index(const Batch& b, int* r) {
  int i = 0;
  while (i + 1 < b.n && static_cast<int>(blockIdx.x) >= b.first[i + 1]) ++i;
  *r = (blockIdx.x - b.first[i]) * kWarps + threadIdx.x / 32;
  return i;
}

template <Kind K, int NT>
__global__ void matmul_kernel(Batch b, const float* __restrict__ x, int T) {
  int r;
  const MatmulOut& o = b.m[batch_index(b, &r)];
  if (r < o.W.rows) matmul_row<K, NT>(o.W, r, x, T, o.y, o.ldy);
}

// ---- int8-activation path ------------------------------------------------

// Warp per (token, 32-column block), lane per column: codes in the order the
// weights need (int4: per 8 columns the 4 even ones, then the 4 odd ones, so
// a word of low / high nibbles meets one word of x; int8: natural order).
__global__ void quantize_x_kernel(const float* x, const float* up, int T, int cols, bool nibble_order, QuantX q) {
  const int w = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
  const int nb = cols / 32;
  if (w >= T * nb) return;
  const int t = w / nb, b = w % nb;
  const long long i = static_cast<long long>(t) * cols + b * 32 + lane;
  const float v = up ? x[i] / (1.0f + expf(-x[i])) * up[i] : x[i];
  float amax = fabsf(v);
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float s = amax / 127.0f, inv = s > 0 ? 1.0f / s : 0.0f;
  const int c = __float2int_rn(v * inv);
  int sum = c;
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const int pos = nibble_order ? (lane / 8) * 8 + (lane & 1) * 4 + (lane % 8) / 2 : lane;
  q.codes[(static_cast<long long>(t) * nb + b) * 32 + pos] = static_cast<int8_t>(c);
  if (lane == 0) q.scale[static_cast<long long>(t) * nb + b] = s, q.sum[static_cast<long long>(t) * nb + b] = sum;
}

template <Kind K, int NT>
__device__ void matmul_q_row(const DevMatrix& W, int r, const QuantX& q, int T, float* __restrict__ y, int ldy) {
  const int lane = threadIdx.x & 31, nb = W.cols / 32;
  const uint8_t* row = W.data + static_cast<long long>(r) * W.row_stride;
  const uint8_t* sc = W.data + W.scale_offset + static_cast<long long>(r) * W.scale_row_bytes;
  float row_scale = 0;
  if (K == Kind::kI8 || !W.f16_scales) row_scale = *reinterpret_cast<const float*>(sc);
  for (int t0 = 0; t0 < T; t0 += NT) {
    const int nt = min(NT, T - t0);
    float acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
#pragma unroll 2
    for (int b = lane; b < nb; b += 32) {
      int dot[NT];
      if constexpr (K == Kind::kI4) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(row + b * 16));
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
        for (int t = 0; t < NT; ++t) {
          if (t >= nt) break;
          const int4* xp = reinterpret_cast<const int4*>(q.codes + (static_cast<long long>(t0 + t) * nb + b) * 32);
          const int4 xa = xp[0], xb = xp[1];
          const int xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
          int d = 0;
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            d = __dp4a(static_cast<int>(w[k] & 0x0F0F0F0Fu), xw[2 * k], d);
            d = __dp4a(static_cast<int>((w[k] >> 4) & 0x0F0F0F0Fu), xw[2 * k + 1], d);
          }
          dot[t] = d;
        }
        float s = row_scale, mn = -8.0f * row_scale;
        if (W.f16_scales) {
          const int g = b * 32 / W.group;
          const __half* hs = reinterpret_cast<const __half*>(sc);
          if (W.asym) s = __half2float(hs[2 * g]), mn = __half2float(hs[2 * g + 1]);
          else s = __half2float(hs[g]), mn = -8.0f * s;
        }
        for (int t = 0; t < NT; ++t) {
          if (t >= nt) break;
          const long long qb = static_cast<long long>(t0 + t) * nb + b;
          const float xs = q.scale[qb];
          // Sum of (s code + mn) x = xs (s dot + mn sum of x codes).
          acc[t] += xs * (s * static_cast<float>(dot[t]) + mn * static_cast<float>(q.sum[qb]));
        }
      } else {  // int8 weights, natural order, one f32 scale per row (applied at the end)
        const uint4 v0 = __ldg(reinterpret_cast<const uint4*>(row + b * 32)), v1 = __ldg(reinterpret_cast<const uint4*>(row + b * 32 + 16));
        const int w[8] = {int(v0.x), int(v0.y), int(v0.z), int(v0.w), int(v1.x), int(v1.y), int(v1.z), int(v1.w)};
        for (int t = 0; t < NT; ++t) {
          if (t >= nt) break;
          const long long qb = static_cast<long long>(t0 + t) * nb + b;
          const int4* xp = reinterpret_cast<const int4*>(q.codes + qb * 32);
          const int4 xa = xp[0], xb = xp[1];
          const int xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
          int d = 0;
#pragma unroll
          for (int k = 0; k < 8; ++k) d = __dp4a(w[k], xw[k], d);
          acc[t] += q.scale[qb] * static_cast<float>(d);
        }
      }
    }
    for (int t = 0; t < nt; ++t) {
      float v = warp_sum(acc[t]);
      if (K == Kind::kI8) v *= row_scale;
      if (lane == 0) y[static_cast<long long>(t0 + t) * ldy + r] = v;
    }
  }
}

template <Kind K, int NT>
__global__ void matmul_q_kernel(Batch b, QuantX q, int T) {
  int r;
  const MatmulOut& o = b.m[batch_index(b, &r)];
  if (r < o.W.rows) matmul_q_row<K, NT>(o.W, r, q, T, o.y, o.ldy);
}

}  // namespace

void quantize_x(const float* x, int T, int cols, bool nibble_order, const QuantX& q, cudaStream_t s, const float* up) {
  const int warps = T * (cols / 32);
  quantize_x_kernel<<<(warps + 7) / 8, 256, 0, s>>>(x, up, T, cols, nibble_order, q);
  check(cudaGetLastError(), "quantize_x launch");
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
  Batch b{};
  b.n = n;
  b.first[0] = 0;
  for (int i = 0; i < n; ++i) b.m[i] = outs[i], b.first[i + 1] = b.first[i] + (outs[i].W.rows + kWarps - 1) / kWarps;
  const DevMatrix& W = outs[0].W;
  const dim3 grid(b.first[n]), block(kWarps * 32);
  if (q && takes_int8_x(W)) {
    if (!x_in_q) quantize_x(x, T, W.cols, W.kind == Kind::kI4, *q, s);
    if (W.kind == Kind::kI4) {
      if (T == 1) matmul_q_kernel<Kind::kI4, 1><<<grid, block, 0, s>>>(b, *q, T);
      else matmul_q_kernel<Kind::kI4, 8><<<grid, block, 0, s>>>(b, *q, T);
    } else {
      if (T == 1) matmul_q_kernel<Kind::kI8, 1><<<grid, block, 0, s>>>(b, *q, T);
      else matmul_q_kernel<Kind::kI8, 8><<<grid, block, 0, s>>>(b, *q, T);
    }
    check(cudaGetLastError(), "matmul_q launch");
    return;
  }
  dispatch_kind(W.kind, [&]<Kind K>() {
    if (T == 1) matmul_kernel<K, 1><<<grid, block, 0, s>>>(b, x, T);
    else matmul_kernel<K, 8><<<grid, block, 0, s>>>(b, x, T);
  });
  check(cudaGetLastError(), "matmul launch");
}

void matmul(const DevMatrix& W, const float* x, int T, float* y, int ldy, cudaStream_t s, const QuantX* q, bool x_in_q) {
  const MatmulOut o{W, y, ldy};
  matmul_many(&o, 1, x, T, s, q, x_in_q);
}

}  // namespace coli::cuda
