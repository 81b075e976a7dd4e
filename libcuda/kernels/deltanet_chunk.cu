// Gated DeltaNet prefill in the chunked (WY / UT) form on the device: the
// same algebra as the CPU's gdn_head_chunk (libcpu/deltanet_chunk.h has the
// formulas), as two kernels:
//  1. chunk_prepare_kernel, block (chunk, value head), all chunks at once:
//     what depends only on the chunk's q, k, v, beta and decays, i.e.
//     T = (I - A)^-1 by forward substitution, W = T (beta exp(G) k),
//     U = T (beta v), the decayed causal q.k products and the decays; into
//     a workspace in global memory.
//  2. chunk_state_kernel, block (value head, 32 state columns), chunks in
//     order: V' = U - W S, the outputs, S <- exp(G_n) S + sum_j ... k_j V'_j^T,
//     with the block's columns of S (dk x cols, stored by column as S^T)
//     in shared memory for the whole call.
// The first is where most of the arithmetic is and has no dependence
// between chunks; the second is the only sequential part.
#include "async_copy.cuh"
#include "cuda_util.cuh"
#include "device_math.cuh"
#include "kernels.cuh"

namespace coli::cuda {

namespace {

constexpr int kChunk = ::coli::kGdnChunk, kThreads = 256, kWarpsC = kThreads / 32, kRowsPerWarp = kChunk / kWarpsC;
constexpr int kMaxPer = 4;  // columns of k and v per lane: head sizes up to 128

// The workspace, per value head h and token t of the call (rows of the
// chunk's local index): W [dk], U [dv], QK [kChunk] (row i: (q_i . k_j)
// exp(G_i - G_j) for j <= i, else 0), eG = exp(G_i), f = exp(G_last - G_i):
// gdn_chunk_workspace_floats(T, nv, dk, dv) floats (placement/device_sizes.h).
struct Workspace {
  float *W, *U, *QK, *eG, *f;
  __host__ __device__ Workspace(float* base, int T, int nv, int dk, int dv) {
    const std::size_t n = std::size_t(T) * nv;
    W = base, U = W + n * dk, QK = U + n * dv, eG = QK + n * kChunk, f = eG + n;
  }
};

// Shared memory of chunk_prepare_kernel, floats: Kc [kChunk][dk + 1],
// QV [kChunk][max(dk + 1, dv)] (q, then v), N [kChunk][kChunk], G, beta,
// eG [kChunk].
std::size_t prepare_smem_floats(int dk, int dv) {
  return std::size_t(kChunk) * (dk + 1) + std::size_t(kChunk) * std::max(dk + 1, dv) + std::size_t(kChunk) * kChunk + 3 * kChunk;
}

__global__ void __launch_bounds__(kThreads) chunk_prepare_kernel(const float* conv_out, const float* b, const float* a, const float* A_log,
                                                                 const float* dt_bias, int T, int nk, int nv, int dk, int dv, int cd, float* work) {
  griddep_wait();
  extern __shared__ float sm[];
  const int ldk = dk + 1;
  float* Kc = sm;
  float* QV = Kc + kChunk * ldk;
  float* N = QV + kChunk * max(ldk, dv);  // strictly lower part of T = (I - A)^-1, A first
  float* G = N + kChunk * kChunk;
  float* beta = G + kChunk;
  float* eG = beta + kChunk;
  const int t0 = blockIdx.x * kChunk, h = blockIdx.y, n = min(kChunk, T - t0);
  const int tid = threadIdx.x, lane = tid & 31, w = tid / 32;
  const int kh = h / (nv / nk), kd = nk * dk;
  Workspace ws(work, T, nv, dk, dv);
  const long long row0 = static_cast<long long>(h) * T + t0;  // the workspace row of local token 0
  for (int x = tid; x < kChunk * dk; x += kThreads) {
    const int i = x / dk, m = x % dk;
    const float* row = conv_out + static_cast<long long>(t0 + i) * cd;
    if (i < n) cp_async4(&QV[i * ldk + m], row + kh * dk + m), cp_async4(&Kc[i * ldk + m], row + kd + kh * dk + m);
    else QV[i * ldk + m] = Kc[i * ldk + m] = 0.0f;
  }
  if (tid < kChunk) {
    beta[tid] = tid < n ? sigmoidf(b[(t0 + tid) * nv + h]) : 0.0f;
    G[tid] = tid < n ? -expf(A_log[h]) * softplusf(a[(t0 + tid) * nv + h] + dt_bias[h]) : 0.0f;  // log decay g, summed below
  }
  cp_async_wait_all();
  __syncthreads();
  if (tid == 0)
    for (int i = 1; i < kChunk; ++i) G[i] += G[i - 1];
  __syncthreads();
  if (tid < kChunk) {
    eG[tid] = expf(G[tid]);
    if (tid < n) ws.eG[row0 + tid] = eG[tid], ws.f[row0 + tid] = expf(G[n - 1] - G[tid]);
  }
  // A[i][j] = -beta_i (k_i . k_j) exp(G_i - G_j) (j < i); QK[i][j] = (q_i . k_j) exp(G_i - G_j) (j <= i) to the workspace.
  {
    float dkk[kRowsPerWarp][2], dqk[kRowsPerWarp][2];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) dkk[r][0] = dkk[r][1] = dqk[r][0] = dqk[r][1] = 0.0f;
    for (int m = 0; m < dk; ++m) {
      const float kj0 = Kc[lane * ldk + m], kj1 = Kc[(lane + 32) * ldk + m];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const int i = w + kWarpsC * r;
        const float ki = Kc[i * ldk + m], qi = QV[i * ldk + m];
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
        if (i < n) ws.QK[(row0 + i) * kChunk + j] = in && j <= i ? dqk[r][e] * d : 0.0f;
      }
    }
  }
  __syncthreads();  // q is read: its buffer takes v, copied while the substitution runs
  const float* v = conv_out + static_cast<long long>(t0) * cd + 2 * kd + h * dv;
  for (int x = tid; x < n * dv; x += kThreads) cp_async4(&QV[x], v + static_cast<long long>(x / dv) * cd + x % dv);
  // Forward substitution, right-looking: after step m row m is final;
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
  cp_async_wait_all();
  __syncthreads();
  // W = T (beta exp(G) k) and U = T (beta v) (T = I + N) together: the
  // lane's columns lane + 32 e of both, each N[i][j] read once for all.
  float aw[kRowsPerWarp][kMaxPer], au[kRowsPerWarp][kMaxPer];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int e = 0; e < kMaxPer; ++e) aw[r][e] = au[r][e] = 0.0f;
  for (int j = 0; j < n; ++j) {
    float nr[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int i = w + kWarpsC * r;
      nr[r] = i == j ? 1.0f : N[i * kChunk + j];
    }
    const float sk = beta[j] * eG[j], sv = beta[j];
#pragma unroll
    for (int e = 0; e < kMaxPer; ++e) {
      const int m = lane + 32 * e;
      const float xk = m < dk ? sk * Kc[j * ldk + m] : 0.0f, xv = m < dv ? sv * QV[j * dv + m] : 0.0f;
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) aw[r][e] += nr[r] * xk, au[r][e] += nr[r] * xv;
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int i = w + kWarpsC * r;
    if (i >= n) continue;
#pragma unroll
    for (int e = 0; e < kMaxPer; ++e) {
      const int m = lane + 32 * e;
      if (m < dk) ws.W[(row0 + i) * dk + m] = aw[r][e];
      if (m < dv) ws.U[(row0 + i) * dv + m] = au[r][e];
    }
  }
}

// Shared memory of chunk_state_kernel, floats: Wc, Qc, Kc [kChunk][dk + 4]
// (rows 16-byte aligned: read as float4 by every lane alike), QK
// [kChunk][kChunk], U [kChunk][cols], St [cols][dk + 1], eG, f [kChunk].
std::size_t state_smem_floats(int dk, int cols) {
  return 3 * std::size_t(kChunk) * (dk + 4) + std::size_t(kChunk) * kChunk + std::size_t(kChunk) * cols + std::size_t(cols) * (dk + 1) + 2 * kChunk;
}

__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }

__global__ void __launch_bounds__(kThreads) chunk_state_kernel(float* S_all, const float* conv_out, const float* work, int T, int nk, int nv, int dk,
                                                               int dv, int cd, int cols, float* out) {
  griddep_wait();
  extern __shared__ float4 sm4[];
  float* sm = reinterpret_cast<float*>(sm4);
  const int ld4k = dk + 4, lds = dk + 1;
  float* Wc = sm;
  float* Qc = Wc + kChunk * ld4k;
  float* Kc = Qc + kChunk * ld4k;  // exp(G_last - G_j) k_j is applied in the update
  float* QK = Kc + kChunk * ld4k;
  float* U = QK + kChunk * kChunk;  // U, then V'
  float* St = U + kChunk * cols;    // [cols][lds]: St[c][m] = S[m][c0 + c]
  float* eG = St + cols * lds;
  float* f = eG + kChunk;
  const int parts = dv / cols, h = blockIdx.x / parts, c0 = blockIdx.x % parts * cols;
  const int tid = threadIdx.x, lane = tid & 31, w = tid / 32;
  const int kh = h / (nv / nk), kd = nk * dk, vd = nv * dv;
  const Workspace ws(const_cast<float*>(work), T, nv, dk, dv);
  float* Sg = S_all + static_cast<long long>(h) * dk * dv;
  for (int x = tid; x < cols * dk; x += kThreads) St[(x / dk) * lds + x % dk] = Sg[static_cast<long long>(c0 + x / dk) * dk + x % dk];
  const int c = lane;  // this thread's column (lanes >= cols idle but keep the barriers)
  for (int t0 = 0; t0 < T; t0 += kChunk) {
    const int n = min(kChunk, T - t0);
    const long long row0 = static_cast<long long>(h) * T + t0;
    __syncthreads();  // the previous chunk is done with every buffer
    // The chunk's W, q, k, QK, U columns and decays, copied all at once.
    for (int x = tid; x < kChunk * dk; x += kThreads) {
      const int i = x / dk, m = x % dk;
      const float* row = conv_out + static_cast<long long>(t0 + i) * cd;
      if (i < n)
        cp_async4(&Wc[i * ld4k + m], ws.W + (row0 + i) * dk + m), cp_async4(&Qc[i * ld4k + m], row + kh * dk + m),
            cp_async4(&Kc[i * ld4k + m], row + kd + kh * dk + m);
      else Wc[i * ld4k + m] = Qc[i * ld4k + m] = Kc[i * ld4k + m] = 0.0f;
    }
    for (int x = tid; x < kChunk * kChunk; x += kThreads)
      if (x / kChunk < n) cp_async4(&QK[x], ws.QK + row0 * kChunk + x);
      else QK[x] = 0.0f;
    for (int x = tid; x < kChunk * cols; x += kThreads)
      if (x / cols < n) cp_async4(&U[x], ws.U + (row0 + x / cols) * dv + c0 + x % cols);
      else U[x] = 0.0f;
    if (tid < kChunk) {
      if (tid < n) cp_async4(&eG[tid], ws.eG + row0 + tid), cp_async4(&f[tid], ws.f + row0 + tid);
      else eG[tid] = f[tid] = 0.0f;
    }
    cp_async_wait_all();
    __syncthreads();
    // V' = U - W S (in place in U), and S^T q_i for the output; rows
    // i = w + kWarpsC r, four state rows m at a time.
    float o[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) o[r] = 0.0f;
    if (c < cols) {
      float u[kRowsPerWarp];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) u[r] = U[(w + kWarpsC * r) * cols + c];
      for (int m = 0; m < dk; m += 4) {
        const float s0 = St[c * lds + m], s1 = St[c * lds + m + 1], s2 = St[c * lds + m + 2], s3 = St[c * lds + m + 3];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
          const int i = w + kWarpsC * r;
          const float4 wv = ld4(&Wc[i * ld4k + m]), qv = ld4(&Qc[i * ld4k + m]);
          u[r] -= wv.x * s0, u[r] -= wv.y * s1, u[r] -= wv.z * s2, u[r] -= wv.w * s3;
          o[r] += qv.x * s0, o[r] += qv.y * s1, o[r] += qv.z * s2, o[r] += qv.w * s3;
        }
      }
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) U[(w + kWarpsC * r) * cols + c] = u[r];
    }
    __syncthreads();  // every V' row is written
    if (c < cols) {
      // o_i = exp(G_i) S^T q_i + sum_{j <= i} QK[i][j] V'_j (QK and V' are 0
      // above the diagonal and past n: four j at a time).
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) o[r] *= eG[w + kWarpsC * r];
      for (int j = 0; j < n; j += 4) {
        const float v0 = U[j * cols + c], v1 = U[(j + 1) * cols + c], v2 = U[(j + 2) * cols + c], v3 = U[(j + 3) * cols + c];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
          const float4 qk = ld4(&QK[(w + kWarpsC * r) * kChunk + j]);
          o[r] += qk.x * v0, o[r] += qk.y * v1, o[r] += qk.z * v2, o[r] += qk.w * v3;
        }
      }
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const int i = w + kWarpsC * r;
        if (i < n) out[static_cast<long long>(t0 + i) * vd + h * dv + c0 + c] = o[r];
      }
      // S = exp(G_last) S + sum_j exp(G_last - G_j) k_j V'_j^T: this
      // thread's rows base + 32 g + (0..3) of column c.
      const float el = eG[n - 1];
      for (int base = 4 * w; base < dk; base += 32 * kMaxPer) {
        float acc[kMaxPer][4];
#pragma unroll
        for (int g = 0; g < kMaxPer; ++g)
#pragma unroll
          for (int k = 0; k < 4; ++k) acc[g][k] = base + 32 * g < dk ? St[c * lds + base + 32 * g + k] * el : 0.0f;
        for (int j = 0; j < n; ++j) {
          const float fv = f[j] * U[j * cols + c];
#pragma unroll
          for (int g = 0; g < kMaxPer; ++g) {
            const float4 kv = ld4(&Kc[j * ld4k + min(base + 32 * g, dk - 4)]);
            acc[g][0] += kv.x * fv, acc[g][1] += kv.y * fv, acc[g][2] += kv.z * fv, acc[g][3] += kv.w * fv;
          }
        }
#pragma unroll
        for (int g = 0; g < kMaxPer; ++g)
#pragma unroll
          for (int k = 0; k < 4; ++k)
            if (base + 32 * g < dk) St[c * lds + base + 32 * g + k] = acc[g][k];
      }
    }
  }
  __syncthreads();
  for (int x = tid; x < cols * dk; x += kThreads) Sg[static_cast<long long>(c0 + x / dk) * dk + x % dk] = St[(x / dk) * lds + x % dk];
}

// Raises kernel's dynamic shared memory limit to bytes once (above 48 KB).
template <typename Kernel>
void opt_in_smem(Kernel kernel, std::size_t bytes, std::size_t& opted, const char* what) {
  if (bytes > 48 * 1024 && bytes > opted) {
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)), what);
    opted = bytes;
  }
}

}  // namespace

bool gdn_recurrence_chunked(float* S, const float* conv_out, const float* b, const float* a, const float* A_log, const float* dt_bias, int T, int nk,
                            int nv, int dk, int dv, int cd, float* work, float* out, cudaStream_t s) {
  // Columns as whole warps of 32 lanes (or one part narrower than a warp),
  // k and v heads of at most 32 kMaxPer, k rows in float4s.
  if ((dv % 32 && dv > 32) || dk > 32 * kMaxPer || dv > 32 * kMaxPer || dk % 4) return false;
  const int cols = std::min(32, dv);
  const std::size_t prep = prepare_smem_floats(dk, dv) * sizeof(float), state = state_smem_floats(dk, cols) * sizeof(float);
  int dev = 0, optin = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) return false;
  if (std::max(prep, state) > static_cast<std::size_t>(optin) || nv % nk) return false;
  static std::size_t opted_prep = 0, opted_state = 0;
  opt_in_smem(chunk_prepare_kernel, prep, opted_prep, "chunk prepare smem");
  opt_in_smem(chunk_state_kernel, state, opted_state, "chunk state smem");
  launch(chunk_prepare_kernel, dim3((T + kChunk - 1) / kChunk, nv), kThreads, prep, s, conv_out, b, a, A_log, dt_bias, T, nk, nv, dk, dv, cd, work);
  launch(chunk_state_kernel, nv * (dv / cols), kThreads, state, s, S, conv_out, static_cast<const float*>(work), T, nk, nv, dk, dv, cd, cols, out);
  check(cudaGetLastError(), "chunk recurrence launch");
  return true;
}

}  // namespace coli::cuda
