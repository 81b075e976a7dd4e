// Gated DeltaNet on the device, the same steps as cpu_deltanet.cpp:
//   qkv = causal depthwise conv(in_proj_qkv(x)) then SiLU; q, k L2-normalised,
//   q scaled by 1/sqrt(d_k); beta = sigmoid(b); g = -exp(A_log) softplus(a + dt_bias)
//   S <- exp(g) S;  S <- S + k (beta (v - S^T k))^T;  o = S^T q
//   out = RMSNorm(o) * w * silu(z) per value head.
// The recurrence keeps each head's state S [dk, dv] in shared memory for
// the whole chunk, one thread per value column.
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

// Block per value head, thread j per column of S (blockDim = dv rounded up to 32).
__global__ void recurrence_kernel(float* S_all, const float* conv_out, const float* z, const float* b, const float* a, const float* A_log,
                                  const float* dt_bias, const float* norm_w, int T, int nk, int nv, int dk, int dv, int cd, float eps,
                                  float* normed) {
  extern __shared__ float sh[];
  float* S = sh;              // [dk][dv]
  float* qk = S + dk * dv;    // q [dk], k [dk]
  const int h = blockIdx.x, j = threadIdx.x, kh = h / (nv / nk), kd = nk * dk, vd = nv * dv;
  float* Sg = S_all + static_cast<long long>(h) * dk * dv;
  for (int i = threadIdx.x; i < dk * dv; i += blockDim.x) S[i] = Sg[i];
  const float a_h = -expf(A_log[h]);
  for (int t = 0; t < T; ++t) {
    const float* row = conv_out + static_cast<long long>(t) * cd;
    __syncthreads();
    for (int i = threadIdx.x; i < dk; i += blockDim.x) qk[i] = row[kh * dk + i], qk[dk + i] = row[kd + kh * dk + i];
    __syncthreads();
    const float beta = sigmoidf(b[t * nv + h]);
    const float decay = expf(a_h * softplusf(a[t * nv + h] + dt_bias[h]));
    float o = 0;
    if (j < dv) {
      float mem = 0;
      for (int i = 0; i < dk; ++i) mem += S[i * dv + j] * qk[dk + i];
      const float delta = (row[2 * kd + h * dv + j] - decay * mem) * beta;
      for (int i = 0; i < dk; ++i) {
        const float s = decay * S[i * dv + j] + qk[dk + i] * delta;
        S[i * dv + j] = s;
        o += s * qk[i];
      }
    }
    // Gated RMSNorm over the head's dv outputs.
    const float r = rsqrtf(block_sum(j < dv ? o * o : 0.0f) / dv + eps);
    if (j < dv) {
      const float zz = z[static_cast<long long>(t) * vd + h * dv + j];
      normed[static_cast<long long>(t) * vd + h * dv + j] = o * r * norm_w[j] * siluf(zz);
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < dk * dv; i += blockDim.x) Sg[i] = S[i];
}

}  // namespace

void init_kernels() {
  // 64 KB of state per head (128 x 128 floats) needs the opt-in above 48 KB.
  check(cudaFuncSetAttribute(recurrence_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 160 * 1024), "gdn shared memory");
}

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
  const std::size_t shmem = (static_cast<std::size_t>(dk) * dv + 2 * dk) * sizeof(float);
  const int threads = (dv + 31) / 32 * 32;
  recurrence_kernel<<<nv, threads, shmem, s>>>(S, conv_out, z, b, a, A_log, dt_bias, norm_w, T, nk, nv, dk, dv, cd, eps, normed);
  check(cudaGetLastError(), "gdn recurrence launch");
}

}  // namespace coli::cuda
