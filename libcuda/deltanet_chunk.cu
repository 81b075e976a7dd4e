// Gated DeltaNet prefill in the chunked (WY / UT) form on the device: the
// same algebra as the CPU's gdn_head_chunk (libcpu/deltanet_chunk.h has the
// formulas), chunks of kChunk tokens one after another per head, the work
// inside a chunk as small dense products in shared memory instead of one
// sequential step per token. Block (value head, part): the part's cols
// columns of the head's state S (dk x dv, stored by column as S^T) stay in
// shared memory for the whole call; A, T and W depend only on k, beta and
// the decays and are recomputed by each part of a head.
#include "cuda_util.cuh"
#include "device_math.cuh"
#include "kernels.cuh"

namespace coli::cuda {

namespace {

constexpr int kChunk = 64, kThreads = 256, kWarpsC = kThreads / 32, kRowsPerWarp = kChunk / kWarpsC;

struct ChunkSmem {
  // Floats, in this order: Kc, Qc, W [kChunk][dk + 1]; N, QK [kChunk][kChunk];
  // Vc, U [kChunk][cols]; St [cols][dk + 1]; G, beta, f, eG [kChunk].
  static std::size_t floats(int dk, int cols) {
    return 3 * std::size_t(kChunk) * (dk + 1) + 2 * std::size_t(kChunk) * kChunk + 2 * std::size_t(kChunk) * cols + std::size_t(cols) * (dk + 1) +
           4 * std::size_t(kChunk);
  }
};

// acc[r] = sum_{j < n} T[i_r][j] x(j) for warp w's rows i_r = w + kWarpsC r,
// T = I + N (N strictly lower, [kChunk][kChunk]); j ascending.
template <typename X>
__device__ __forceinline__ void rows_times_t(const float* N, int n, int w, X&& x, float (&acc)[kRowsPerWarp]) {
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) acc[r] = 0.0f;
  for (int j = 0; j < n; ++j) {
    const float xv = x(j);
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int i = w + kWarpsC * r;
      acc[r] += (i == j ? 1.0f : N[i * kChunk + j]) * xv;
    }
  }
}

__global__ void __launch_bounds__(kThreads) recurrence_chunk_kernel(float* S_all, const float* conv_out, const float* b, const float* a,
                                                                    const float* A_log, const float* dt_bias, int T, int nk, int nv, int dk, int dv,
                                                                    int cd, int cols, float* out) {
  griddep_wait();
  extern __shared__ float sm[];
  const int ldk = dk + 1;
  float* Kc = sm;
  float* Qc = Kc + kChunk * ldk;
  float* W = Qc + kChunk * ldk;
  float* N = W + kChunk * ldk;  // strictly lower part of T = (I - A)^-1, A first
  float* QK = N + kChunk * kChunk;
  float* Vc = QK + kChunk * kChunk;
  float* U = Vc + kChunk * cols;  // T (beta v), then V'
  float* St = U + kChunk * cols;  // [cols][ldk]: St[c][m] = S[m][c0 + c]
  float* G = St + cols * ldk;
  float* beta = G + kChunk;
  float* f = beta + kChunk;   // exp(G_last - G_j)
  float* eG = f + kChunk;     // exp(G_j)
  const int parts = dv / cols, h = blockIdx.x / parts, c0 = blockIdx.x % parts * cols;
  const int tid = threadIdx.x, lane = tid & 31, w = tid / 32;
  const int kh = h / (nv / nk), kd = nk * dk, vd = nv * dv;
  float* Sg = S_all + static_cast<long long>(h) * dk * dv;
  for (int x = tid; x < cols * dk; x += kThreads) St[(x / dk) * ldk + x % dk] = Sg[static_cast<long long>(c0 + x / dk) * dk + x % dk];
  const float a_h = -expf(A_log[h]), dtb = dt_bias[h];
  for (int t0 = 0; t0 < T; t0 += kChunk) {
    const int n = min(kChunk, T - t0);
    __syncthreads();  // the previous chunk is done with every buffer
    // 0. The chunk's q, k, v columns, beta and decays.
    for (int x = tid; x < kChunk * dk; x += kThreads) {
      const int i = x / dk, m = x % dk;
      const float* row = conv_out + static_cast<long long>(t0 + min(i, n - 1)) * cd;
      Qc[i * ldk + m] = i < n ? row[kh * dk + m] : 0.0f;
      Kc[i * ldk + m] = i < n ? row[kd + kh * dk + m] : 0.0f;
    }
    for (int x = tid; x < kChunk * cols; x += kThreads) {
      const int i = x / cols, c = x % cols;
      Vc[x] = i < n ? conv_out[static_cast<long long>(t0 + i) * cd + 2 * kd + h * dv + c0 + c] : 0.0f;
    }
    if (tid < kChunk) {
      beta[tid] = tid < n ? sigmoidf(b[(t0 + tid) * nv + h]) : 0.0f;
      G[tid] = tid < n ? a_h * softplusf(a[(t0 + tid) * nv + h] + dtb) : 0.0f;  // log decay g, summed below
    }
    __syncthreads();
    if (tid == 0)
      for (int i = 1; i < kChunk; ++i) G[i] += G[i - 1];
    __syncthreads();
    if (tid < kChunk) f[tid] = tid < n ? expf(G[n - 1] - G[tid]) : 0.0f, eG[tid] = expf(G[tid]);
    // 1. A[i][j] = -beta_i (k_i . k_j) exp(G_i - G_j) (j < i), QK[i][j] = (q_i . k_j) exp(G_i - G_j) (j <= i).
    {
      float dkk[kRowsPerWarp][2], dqk[kRowsPerWarp][2];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) dkk[r][0] = dkk[r][1] = dqk[r][0] = dqk[r][1] = 0.0f;
      for (int m = 0; m < dk; ++m) {
        const float kj0 = Kc[lane * ldk + m], kj1 = Kc[(lane + 32) * ldk + m];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
          const int i = w + kWarpsC * r;
          const float ki = Kc[i * ldk + m], qi = Qc[i * ldk + m];
          dkk[r][0] += ki * kj0, dkk[r][1] += ki * kj1;
          dqk[r][0] += qi * kj0, dqk[r][1] += qi * kj1;
        }
      }
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const int i = w + kWarpsC * r;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = lane + 32 * e;
          const bool in = i < n && j < n;
          const float d = in && j <= i ? expf(G[i] - G[j]) : 0.0f;
          N[i * kChunk + j] = in && j < i ? -beta[i] * dkk[r][e] * d : 0.0f;
          QK[i * kChunk + j] = in && j <= i ? dqk[r][e] * d : 0.0f;
        }
      }
    }
    __syncthreads();
    // 2. Forward substitution, right-looking: after step m row m is final;
    // column m is still A's (steps touch columns < m only), as the CPU's
    // row-wise loop reads it, and the sums run over m ascending as there.
    for (int m = 1; m + 1 < n; ++m) {
      const int cnt = (n - m - 1) * m;
      for (int x = tid; x < cnt; x += kThreads) {
        const int i = m + 1 + x / m, j = x % m;
        N[i * kChunk + j] += N[i * kChunk + m] * N[m * kChunk + j];
      }
      __syncthreads();
    }
    // 3. W = T (beta exp(G) k), U = T (beta v), T = I + N.
    for (int m = lane; m < dk; m += 32) {
      float acc[kRowsPerWarp];
      rows_times_t(N, n, w, [&](int jj) { return beta[jj] * eG[jj] * Kc[jj * ldk + m]; }, acc);
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) W[(w + kWarpsC * r) * ldk + m] = acc[r];
    }
    for (int c = lane; c < cols; c += 32) {
      float acc[kRowsPerWarp];
      rows_times_t(N, n, w, [&](int jj) { return beta[jj] * Vc[jj * cols + c]; }, acc);
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) U[(w + kWarpsC * r) * cols + c] = acc[r];
    }
    __syncthreads();
    // 4. V' = U - W S (in place in U), and exp(G_i) S^T q_i for the output.
    // 5. o_i = that + sum_{j <= i} QK[i][j] V'_j.
    for (int cc0 = 0; cc0 < cols; cc0 += 32) {
      const int c = cc0 + lane;
      float u[kRowsPerWarp], o[kRowsPerWarp];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) u[r] = 0.0f, o[r] = 0.0f;
      if (c < cols) {
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) u[r] = U[(w + kWarpsC * r) * cols + c];
        for (int m = 0; m < dk; ++m) {
          const float s = St[c * ldk + m];
#pragma unroll
          for (int r = 0; r < kRowsPerWarp; ++r) {
            const int i = w + kWarpsC * r;
            u[r] -= W[i * ldk + m] * s;
            o[r] += Qc[i * ldk + m] * s;
          }
        }
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) U[(w + kWarpsC * r) * cols + c] = u[r];
      }
      __syncthreads();  // every V' row is written (uniform loop: cols is the same for all threads)
      if (c < cols)
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
          const int i = w + kWarpsC * r;
          if (i >= n) continue;
          float y = o[r] * eG[i];
          for (int j = 0; j <= i; ++j) y += QK[i * kChunk + j] * U[j * cols + c];
          out[static_cast<long long>(t0 + i) * vd + h * dv + c0 + c] = y;
        }
    }
    __syncthreads();  // S is read by every output above before it is updated
    // 6. S = exp(G_last) S + sum_j exp(G_last - G_j) k_j V'_j^T.
    const float el = expf(G[n - 1]);
    for (int cc0 = 0; cc0 < cols; cc0 += 32) {
      const int c = cc0 + lane;
      if (c >= cols) continue;
      for (int m = w; m < dk; m += kWarpsC) {
        float s = St[c * ldk + m] * el;
        for (int j = 0; j < n; ++j) s += f[j] * Kc[j * ldk + m] * U[j * cols + c];
        St[c * ldk + m] = s;
      }
    }
  }
  __syncthreads();
  for (int x = tid; x < cols * dk; x += kThreads) Sg[static_cast<long long>(c0 + x / dk) * dk + x % dk] = St[(x / dk) * ldk + x % dk];
}

}  // namespace

bool gdn_recurrence_chunked(float* S, const float* conv_out, const float* b, const float* a, const float* A_log, const float* dt_bias, int T, int nk,
                            int nv, int dk, int dv, int cd, float* out, cudaStream_t s) {
  const int cols = dv % 32 == 0 ? 32 : dv;
  const std::size_t bytes = ChunkSmem::floats(dk, cols) * sizeof(float);
  int dev = 0, optin = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) return false;
  if (bytes > static_cast<std::size_t>(optin) || nv % nk) return false;
  static std::size_t opted = 0;  // the kernel's dynamic shared memory limit, raised once as needed
  if (bytes > 48 * 1024 && bytes > opted) {
    check(cudaFuncSetAttribute(recurrence_chunk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)), "chunk recurrence smem");
    opted = bytes;
  }
  launch(recurrence_chunk_kernel, nv * (dv / cols), kThreads, bytes, s, S, conv_out, b, a, A_log, dt_bias, T, nk, nv, dk, dv, cd, cols, out);
  check(cudaGetLastError(), "chunk recurrence launch");
  return true;
}

}  // namespace coli::cuda
