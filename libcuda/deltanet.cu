// Gated DeltaNet on the device, the same steps as cpu_deltanet.cpp:
//   qkv = causal depthwise conv(in_proj_qkv(x)) then SiLU; q, k L2-normalised,
//   q scaled by 1/sqrt(d_k); beta = sigmoid(b); g = -exp(A_log) softplus(a + dt_bias)
//   S <- exp(g) S;  S <- S + k (beta (v - S^T k))^T;  o = S^T q
//   out = RMSNorm(o) * w * silu(z) per value head.
// The recurrence keeps each head's state S [dk, dv] in registers for the
// whole chunk, spread over dk/32 x dv threads.
#include "cuda_util.cuh"
#include "device_math.cuh"
#include "kernels.cuh"

namespace coli::cuda {

namespace {

// Thread per channel, sequential in t. State rows: the K-1 previous inputs, oldest first.
__global__ void conv_kernel(const float* qkv, const float* taps, float* state, int T, int cd, int K, float* out) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cd) return;
  for (int t = 0; t < T; ++t) {
    const float xin = qkv[static_cast<long long>(t) * cd + c];
    float acc = taps[c * K + K - 1] * xin;
    for (int j = 0; j < K - 1; ++j) acc += taps[c * K + j] * state[static_cast<long long>(j) * cd + c];
    out[static_cast<long long>(t) * cd + c] = siluf(acc);
    for (int j = 0; j + 1 < K - 1; ++j) state[static_cast<long long>(j) * cd + c] = state[static_cast<long long>(j + 1) * cd + c];
    if (K > 1) state[static_cast<long long>(K - 2) * cd + c] = xin;
  }
}

// Warp per (t, head of q or k): x *= rsqrt(sum x^2 + 1e-6), q also / sqrt(dk).
__global__ void qk_norm_kernel(float* conv_out, int T, int cd, int nk, int dk) {
  const int w = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
  if (w >= T * 2 * nk) return;
  const int t = w / (2 * nk), hh = w % (2 * nk);  // hh < nk: q head, else k head
  float* x = conv_out + static_cast<long long>(t) * cd + hh * dk;
  float ss = 0;
  for (int i = lane; i < dk; i += 32) ss += x[i] * x[i];
  ss = warp_sum(ss);
  const float r = rsqrtf(ss + 1e-6f) * (hh < nk ? rsqrtf(static_cast<float>(dk)) : 1.0f);
  for (int i = lane; i < dk; i += 32) x[i] *= r;
}

// Block per value head. Thread (p, j) holds rows p*32 .. p*32+31 of column
// j of the head's state S [dk, dv] in registers for the whole chunk (dk up
// to 32 * kMaxParts); the column sums over i are combined through shared
// memory. Threads: parts x dv rounded up to 32.
constexpr int kMaxParts = 8;

__global__ void __launch_bounds__(512) recurrence_kernel(float* S_all, const float* conv_out, const float* z, const float* b, const float* a, const float* A_log,
                                  const float* dt_bias, const float* norm_w, int T, int nk, int nv, int dk, int dv, int cd, float eps,
                                  float* normed) {
  extern __shared__ float sh[];
  const int dvp = (dv + 31) / 32 * 32, parts = (dk + 31) / 32;
  float* q = sh;                 // [dk]
  float* k = q + dk;             // [dk]
  float* red = k + dk;           // [parts][dvp]
  const int h = blockIdx.x, j = threadIdx.x % dvp, p = threadIdx.x / dvp;
  const int kh = h / (nv / nk), kd = nk * dk, vd = nv * dv;
  const int i0 = p * 32, cnt = j < dv ? max(0, min(32, dk - i0)) : 0;
  float* Sg = S_all + static_cast<long long>(h) * dk * dv;
  float s[32];
#pragma unroll
  for (int ii = 0; ii < 32; ++ii) s[ii] = ii < cnt ? Sg[(i0 + ii) * dv + j] : 0.0f;
  const float a_h = -expf(A_log[h]);
  for (int t = 0; t < T; ++t) {
    const float* row = conv_out + static_cast<long long>(t) * cd;
    for (int i = threadIdx.x; i < dk; i += blockDim.x) q[i] = row[kh * dk + i], k[i] = row[kd + kh * dk + i];
    __syncthreads();
    const float beta = sigmoidf(b[t * nv + h]);
    const float decay = expf(a_h * softplusf(a[t * nv + h] + dt_bias[h]));
    float part = 0;
#pragma unroll
    for (int ii = 0; ii < 32; ++ii) part += s[ii] * k[min(i0 + ii, dk - 1)] * (ii < cnt);
    red[p * dvp + j] = part;
    __syncthreads();
    float mem = 0;
    for (int pp = 0; pp < parts; ++pp) mem += red[pp * dvp + j];
    const float v = j < dv ? row[2 * kd + h * dv + j] : 0.0f;
    const float delta = (v - decay * mem) * beta;
    float o = 0;
#pragma unroll
    for (int ii = 0; ii < 32; ++ii) {
      s[ii] = decay * s[ii] + k[min(i0 + ii, dk - 1)] * delta * (ii < cnt);
      o += s[ii] * q[min(i0 + ii, dk - 1)] * (ii < cnt);
    }
    __syncthreads();  // red is reused
    red[p * dvp + j] = o;
    __syncthreads();
    float out = 0;
    for (int pp = 0; pp < parts; ++pp) out += red[pp * dvp + j];
    // Gated RMSNorm over the head's dv outputs (counted once, by part 0).
    const float r = rsqrtf(block_sum(p == 0 && j < dv ? out * out : 0.0f) / dv + eps);
    if (p == 0 && j < dv) {
      const float zz = z[static_cast<long long>(t) * vd + h * dv + j];
      normed[static_cast<long long>(t) * vd + h * dv + j] = out * r * norm_w[j] * siluf(zz);
    }
  }
#pragma unroll
  for (int ii = 0; ii < 32; ++ii)
    if (ii < cnt) Sg[(i0 + ii) * dv + j] = s[ii];
}

}  // namespace

void gdn_conv(const float* qkv, const float* taps, float* state, int T, int cd, int K, float* out, cudaStream_t s) {
  conv_kernel<<<(cd + 255) / 256, 256, 0, s>>>(qkv, taps, state, T, cd, K, out);
  check(cudaGetLastError(), "gdn conv launch");
}

void gdn_qk_norm(float* conv_out, int T, int cd, int nk, int dk, cudaStream_t s) {
  const int warps = T * 2 * nk;
  qk_norm_kernel<<<(warps + 7) / 8, 256, 0, s>>>(conv_out, T, cd, nk, dk);
  check(cudaGetLastError(), "gdn qk norm launch");
}

void gdn_recurrence(float* S, const float* conv_out, const float* z, const float* b, const float* a, const float* A_log, const float* dt_bias,
                    const float* norm_w, int T, int nk, int nv, int dk, int dv, int cd, float eps, float* normed, cudaStream_t s) {
  const int dvp = (dv + 31) / 32 * 32, parts = (dk + 31) / 32;
  if (parts > kMaxParts || parts * dvp > 1024) throw Error("CUDA: Gated DeltaNet head of " + std::to_string(dk) + " x " + std::to_string(dv) + " is too large");
  const std::size_t shmem = (2 * static_cast<std::size_t>(dk) + static_cast<std::size_t>(parts) * dvp) * sizeof(float);
  recurrence_kernel<<<nv, parts * dvp, shmem, s>>>(S, conv_out, z, b, a, A_log, dt_bias, norm_w, T, nk, nv, dk, dv, cd, eps, normed);
  check(cudaGetLastError(), "gdn recurrence launch");
}

}  // namespace coli::cuda
