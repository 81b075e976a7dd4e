// Gated DeltaNet on the device, the same steps as cpu_deltanet.cpp:
//   qkv = causal depthwise conv(in_proj_qkv(x)) then SiLU; q, k L2-normalised,
//   q scaled by 1/sqrt(d_k); beta = sigmoid(b); g = -exp(A_log) softplus(a + dt_bias)
//   S <- exp(g) S;  S <- S + k (beta (v - S^T k))^T;  o = S^T q
//   out = RMSNorm(o) * w * silu(z) per value head.
// The recurrence keeps each head's state S in registers for the whole
// chunk; in memory it is stored by column, S^T [dv, dk], so that the lanes
// that share a column read consecutive rows.
#include "cuda_util.cuh"
#include "device_math.cuh"
#include "kernels.cuh"

namespace coli::cuda {

namespace {

// Thread per channel, sequential in t, the previous K-1 inputs in
// registers (K <= kMaxTaps). State rows: the K-1 previous inputs, oldest first.
constexpr int kMaxTaps = 8;

// One channel of the causal depthwise conv, in registers: its taps and the
// window of the K-1 previous inputs, oldest first.
using ConvRegs = float[kMaxTaps - 1];

__device__ __forceinline__ float conv_load_taps(const float* taps, int c, int K, ConvRegs& tap) {
#pragma unroll
  for (int j = 0; j < kMaxTaps - 1; ++j) tap[j] = j < K - 1 ? taps[c * K + j] : 0.0f;
  return taps[c * K + K - 1];  // the tap of the current input
}

__device__ __forceinline__ void conv_load_window(const float* state, int cd, int c, int K, ConvRegs& win) {
#pragma unroll
  for (int j = 0; j < kMaxTaps - 1; ++j) win[j] = j < K - 1 ? state[static_cast<long long>(j) * cd + c] : 0.0f;
}

__device__ __forceinline__ void conv_store_window(float* state, int cd, int c, int K, const ConvRegs& win) {
#pragma unroll
  for (int j = 0; j < kMaxTaps - 1; ++j)
    if (j < K - 1) state[static_cast<long long>(j) * cd + c] = win[j];
}

// silu(taps . [window, xin]); xin joins the window.
__device__ __forceinline__ float conv_step(const ConvRegs& tap, ConvRegs& win, float last, float xin, int K) {
  float acc = last * xin;
#pragma unroll
  for (int j = 0; j < kMaxTaps - 1; ++j)
    if (j < K - 1) acc += tap[j] * win[j];
#pragma unroll
  for (int j = 0; j < kMaxTaps - 2; ++j)
    if (j + 1 < K - 1) win[j] = win[j + 1];
#pragma unroll
  for (int j = 0; j < kMaxTaps - 1; ++j)
    if (j == K - 2) win[j] = xin;
  return siluf(acc);
}

__global__ void conv_kernel(const float* qkv, const float* taps, float* state, int T, int cd, int K, float* out) {
  griddep_wait();
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cd) return;
  ConvRegs tap, win;
  const float last = conv_load_taps(taps, c, K, tap);
  conv_load_window(state, cd, c, K, win);
#pragma unroll 4
  for (int t = 0; t < T; ++t) out[static_cast<long long>(t) * cd + c] = conv_step(tap, win, last, qkv[static_cast<long long>(t) * cd + c], K);
  conv_store_window(state, cd, c, K, win);
}

// Decode (one token): the conv step of conv_kernel and the q / k head
// norms of qk_norm_kernel in one launch. Blocks of 128 channels hold whole
// heads (dk a power of two <= 128); a head's sum of squares is reduced by
// shuffles within the warp and, for heads wider than a warp, over its warps
// in order (deterministic).
// With states (forward_rows' rows: blockIdx.y is the row), row r's input,
// output and window.
__global__ void __launch_bounds__(128) conv_norm_step_kernel(const float* qkv, const float* taps, float* state, int cd, int K, int nk, int dk,
                                                             float* out, float* const* states) {
  __shared__ float warp_ss[4];
  if (states) {
    const int r = blockIdx.y;
    state = states[r], qkv += static_cast<long long>(r) * cd, out += static_cast<long long>(r) * cd;
  }
  const int c = blockIdx.x * 128 + threadIdx.x, lane = threadIdx.x & 31, wid = threadIdx.x / 32;
  // The taps (weights) and the window (this kernel's own output of the
  // previous token, long complete): read while the kernels this one waits
  // for still run.
  ConvRegs tap, win;
  float last = 0.0f;
  if (c < cd) last = conv_load_taps(taps, c, K, tap), conv_load_window(state, cd, c, K, win);
  griddep_wait();
  float v = 0.0f;
  if (c < cd) {
    v = conv_step(tap, win, last, qkv[c], K);
    conv_store_window(state, cd, c, K, win);
  }
  const int qk_end = 2 * nk * dk;  // q heads, then k heads, then v
  float ss = v * v;
  for (int o = min(dk, 32) / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (dk > 32) {
    if (lane == 0) warp_ss[wid] = ss;
    __syncthreads();
    const int w0 = wid / (dk / 32) * (dk / 32);
    ss = 0;
    for (int w = w0; w < w0 + dk / 32; ++w) ss += warp_ss[w];
  }
  if (c < cd) {
    if (c < qk_end) v *= rsqrtf(ss + 1e-6f) * (c < nk * dk ? rsqrtf(static_cast<float>(dk)) : 1.0f);
    out[c] = v;
  }
}

// Prefill: thread per (channel, tile of kConvTile tokens), the window read
// from the chunk's inputs or the state; the state advances afterwards
// (conv_state_kernel), so no thread reads a state row another one wrote.
constexpr int kConvTile = 16;

__global__ void conv_tiles_kernel(const float* qkv, const float* taps, const float* state, int T, int cd, int K, float* out) {
  griddep_wait();
  const int c = blockIdx.x * blockDim.x + threadIdx.x, t0 = blockIdx.y * kConvTile;
  if (c >= cd) return;
  ConvRegs tap, win;
  const float last = conv_load_taps(taps, c, K, tap);
#pragma unroll
  for (int j = 0; j < kMaxTaps - 1; ++j) {
    const int tt = t0 - (K - 1) + j;  // input position; state row tt + K - 1 when negative
    win[j] = j >= K - 1 ? 0.0f : tt >= 0 ? qkv[static_cast<long long>(tt) * cd + c] : state[static_cast<long long>(tt + K - 1) * cd + c];
  }
  const int t1 = min(T, t0 + kConvTile);
  for (int t = t0; t < t1; ++t) out[static_cast<long long>(t) * cd + c] = conv_step(tap, win, last, qkv[static_cast<long long>(t) * cd + c], K);
}

// state <- the last K-1 inputs of [state; chunk], in place (row j reads row
// j + T > j, not yet written).
__global__ void conv_state_kernel(const float* qkv, float* state, int T, int cd, int K) {
  griddep_wait();
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cd) return;
  for (int j = 0; j < K - 1; ++j) {
    const int src = j + T;
    state[static_cast<long long>(j) * cd + c] =
        src < K - 1 ? state[static_cast<long long>(src) * cd + c] : qkv[static_cast<long long>(src - (K - 1)) * cd + c];
  }
}

// Warp per (t, head of q or k): x *= rsqrt(sum x^2 + 1e-6), q also / sqrt(dk).
__global__ void qk_norm_kernel(float* conv_out, int T, int cd, int nk, int dk) {
  griddep_wait();
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
  griddep_wait();
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
  for (int ii = 0; ii < 32; ++ii) s[ii] = ii < cnt ? Sg[static_cast<long long>(j) * dk + i0 + ii] : 0.0f;
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
    if (ii < cnt) Sg[static_cast<long long>(j) * dk + i0 + ii] = s[ii];
}

// v summed over the 8 lanes 8 c .. 8 c + 7 of a warp (every one of them gets it).
__device__ __forceinline__ float sum_over_8_lanes(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  v += __shfl_xor_sync(0xffffffffu, v, 4);
  return v;
}

// One token of the delta rule for one column of a head's state, spread
// over 8 lanes: this lane holds rows p, p + 8, ... (R of them) in s and
// the matching entries of k and q (0 past dk); the lanes' partial sums
// meet in 3 shuffles.  S <- decay S;  S <- S + k (beta (v - S^T k))^T;
// returns the column's o = S^T q (every lane of the 8).
template <int R>
__device__ __forceinline__ float delta_rule_step(float (&s)[R], const float (&k)[R], const float (&q)[R], float decay, float beta, float v) {
  float m0 = 0, m1 = 0;
#pragma unroll
  for (int ii = 0; ii < R; ++ii) {
    if (ii & 1) m1 += s[ii] * k[ii];
    else m0 += s[ii] * k[ii];
  }
  const float mem = sum_over_8_lanes(m0 + m1);
  const float delta = (v - decay * mem) * beta;
  float o0 = 0, o1 = 0;
#pragma unroll
  for (int ii = 0; ii < R; ++ii) {
    s[ii] = decay * s[ii] + k[ii] * delta;
    if (ii & 1) o1 += s[ii] * q[ii];
    else o0 += s[ii] * q[ii];
  }
  return sum_over_8_lanes(o0 + o1);
}

// Block per (value head, 16 columns of its state), warp per 4 columns:
// lane = 8 c + p holds rows p, p + 8, ... (R of them, R = dk / 8 rounded
// up) of column 16 blk + 4 w + c, so the sums over the rows are 3 shuffles
// and no block barrier. The block stages kRecTile tokens' q, k, v, beta and
// decay in shared memory (coalesced loads), then steps through them.
// Writes o = S^T q unnormalised into out [T, nv * dv] (gated_norm_kernel
// finishes it).
constexpr int kRecTile = 32, kRecCols = 16;

template <int R>
__global__ void __launch_bounds__(128) recurrence_warp_kernel(float* S_all, const float* conv_out, const float* b, const float* a, const float* A_log,
                                                              const float* dt_bias, int T, int nk, int nv, int dk, int dv, int cd, float* out) {
  griddep_wait();
  extern __shared__ float sm[];
  float* qs = sm;                     // [kRecTile][dk]
  float* ks = qs + kRecTile * dk;     // [kRecTile][dk]
  float* vs = ks + kRecTile * dk;     // [kRecTile][kRecCols]
  float* betas = vs + kRecTile * kRecCols;
  float* decays = betas + kRecTile;
  const int bph = (dv + kRecCols - 1) / kRecCols;  // blocks per head
  const int h = blockIdx.x / bph, col0 = (blockIdx.x % bph) * kRecCols;
  const int lane = threadIdx.x & 31, c = (threadIdx.x / 32) * 4 + lane / 8, p = lane & 7;
  const int j = col0 + c;
  const bool col = j < dv;
  const int kh = h / (nv / nk), kd = nk * dk, vd = nv * dv;
  float* Sg = S_all + static_cast<long long>(h) * dk * dv;
  float s[R];
#pragma unroll
  for (int ii = 0; ii < R; ++ii) s[ii] = col && ii * 8 + p < dk ? Sg[static_cast<long long>(j) * dk + ii * 8 + p] : 0.0f;
  const float a_h = -expf(A_log[h]), dtb = dt_bias[h];
  for (int t0 = 0; t0 < T; t0 += kRecTile) {
    const int n = min(kRecTile, T - t0);
    __syncthreads();  // the previous tile is consumed
    for (int x = threadIdx.x; x < n * dk; x += blockDim.x) {
      const float* row = conv_out + static_cast<long long>(t0 + x / dk) * cd;
      qs[x] = row[kh * dk + x % dk], ks[x] = row[kd + kh * dk + x % dk];
    }
    for (int x = threadIdx.x; x < n * kRecCols; x += blockDim.x) {
      const int cc = col0 + x % kRecCols;
      vs[x] = cc < dv ? conv_out[static_cast<long long>(t0 + x / kRecCols) * cd + 2 * kd + h * dv + cc] : 0.0f;
    }
    for (int x = threadIdx.x; x < n; x += blockDim.x) {
      betas[x] = sigmoidf(b[(t0 + x) * nv + h]);
      decays[x] = expf(a_h * softplusf(a[(t0 + x) * nv + h] + dtb));
    }
    __syncthreads();
    for (int tt = 0; tt < n; ++tt) {
      const float* k = ks + tt * dk;
      const float* q = qs + tt * dk;
      float kv[R], qv[R];
#pragma unroll
      for (int ii = 0; ii < R; ++ii) {
        const bool in = ii * 8 + p < dk;
        kv[ii] = in ? k[ii * 8 + p] : 0.0f, qv[ii] = in ? q[ii * 8 + p] : 0.0f;
      }
      const float o = delta_rule_step(s, kv, qv, decays[tt], betas[tt], vs[tt * kRecCols + c]);
      if (p == 0 && col) out[static_cast<long long>(t0 + tt) * vd + h * dv + j] = o;
    }
  }
  if (col)
#pragma unroll
    for (int ii = 0; ii < R; ++ii)
      if (ii * 8 + p < dk) Sg[static_cast<long long>(j) * dk + ii * 8 + p] = s[ii];
}

// Decode (one token): a value head's dv columns over the S blocks of a
// cluster (kCluster, S = gridDim.x / nv; else S = 1, block per head), warp
// per 4 columns as in recurrence_warp_kernel, then the gated RMSNorm over
// the head's dv outputs (the blocks' sums of squares meet in cluster_sum)
// and their quantization for the out projection in the same kernel (no
// gated_norm launch). Threads: 32 * ceil(dv / S / 4) (>= dv / S).
// With states (forward_rows' rows: blockIdx.y is the row), row r's
// inputs, output and state states[r].
template <int R, bool kCluster>
__global__ void __launch_bounds__(1024) recurrence_step_kernel(float* S_all, const float* conv_out, const float* z, const float* b, const float* a,
                                                               const float* A_log, const float* dt_bias, const float* norm_w, int nk, int nv, int dk,
                                                               int dv, int cd, float eps, float* normed, QuantX q, bool quant, bool nibble,
                                                               float* const* states) {
  extern __shared__ float o_s[];  // [dv / S]
  long long qrow = 0;  // the row's first quantization block
  if (states) {
    const int r = blockIdx.y;
    const long long vd = static_cast<long long>(nv) * dv;
    S_all = states[r], conv_out += r * static_cast<long long>(cd), z += r * vd, b += r * static_cast<long long>(nv), a += r * static_cast<long long>(nv);
    normed += r * vd, qrow = r * vd / 32;
  }
  const int S = kCluster ? gridDim.x / nv : 1, cols = dv / S;
  const int h = blockIdx.x / S, c0 = blockIdx.x % S * cols, lane = threadIdx.x & 31, jl = threadIdx.x / 8, p = lane & 7;
  const int j = c0 + jl;  // this thread's column of the head
  const bool col = jl < cols;
  const int jc = col ? j : c0 + cols - 1;
  const int kh = h / (nv / nk), kd = nk * dk;
  float* Sg = S_all + static_cast<long long>(h) * dk * dv;
  // The state is this kernel's own output of the previous token, long
  // complete: read while the kernels this one waits for still run.
  float s[R], k[R], qv[R];
#pragma unroll
  for (int ii = 0; ii < R; ++ii) {
    const int i = ii * 8 + p;
    s[ii] = col && i < dk ? Sg[static_cast<long long>(jc) * dk + i] : 0.0f;
  }
  const float a_log = A_log[h], dt_b = dt_bias[h], nw = threadIdx.x < cols ? norm_w[c0 + threadIdx.x] : 0.0f;  // weights, likewise
  griddep_wait();
  const float beta = sigmoidf(b[h]), decay = expf(-expf(a_log) * softplusf(a[h] + dt_b));
  const float v = conv_out[2 * kd + h * dv + jc];
#pragma unroll
  for (int ii = 0; ii < R; ++ii) {
    const int i = ii * 8 + p;
    k[ii] = i < dk ? conv_out[kd + kh * dk + i] : 0.0f;
    qv[ii] = i < dk ? conv_out[kh * dk + i] : 0.0f;
  }
  const float o = delta_rule_step(s, k, qv, decay, beta, v);
  if (col) {
#pragma unroll
    for (int ii = 0; ii < R; ++ii)
      if (ii * 8 + p < dk) Sg[static_cast<long long>(j) * dk + ii * 8 + p] = s[ii];
    if (p == 0) o_s[jl] = o;
  }
  __syncthreads();
  const int tid = threadIdx.x;
  const float x = tid < cols ? o_s[tid] : 0.0f;
  float ss = block_sum(x * x);
  if constexpr (kCluster) ss = cluster_sum(ss);
  const float r = rsqrtf(ss / dv + eps);
  if (tid >= (cols + 31) / 32 * 32) return;
  float y = 0.0f;
  if (tid < cols) {
    y = x * r * nw * siluf(z[h * dv + c0 + tid]);
    normed[h * dv + c0 + tid] = y;
  }
  if (quant) warp_quantize_block(y, nibble, q, qrow + (h * dv + c0) / 32 + tid / 32);  // (cols % 32 == 0 when quant)
}

// Warp per (t, value head), in place: o = RMSNorm(o) * w * silu(z); with
// quant (dv % 32 == 0) the result is also quantized for the out projection
// (the quantize_x scheme, one 32-column block per lane round).
constexpr int kNormPer = 8;  // dv <= 256

__global__ void gated_norm_kernel(float* o, const float* z, const float* norm_w, int T, int nv, int dv, float eps, QuantX q, bool quant, bool nibble) {
  griddep_wait();
  const int w = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
  if (w >= T * nv) return;
  float* x = o + static_cast<long long>(w) * dv;
  const float* zz = z + static_cast<long long>(w) * dv;
  float v[kNormPer];
  float ss = 0;
#pragma unroll
  for (int k = 0; k < kNormPer; ++k) {
    const int i = lane + 32 * k;
    v[k] = i < dv ? x[i] : 0.0f;
    ss += v[k] * v[k];
  }
  const float r = rsqrtf(warp_sum(ss) / dv + eps);
#pragma unroll
  for (int k = 0; k < kNormPer; ++k) {
    const int i = lane + 32 * k;
    if (i < dv) v[k] = v[k] * r * norm_w[i] * siluf(zz[i]), x[i] = v[k];
  }
  if (!quant) return;
  const int t = w / nv, h = w % nv, nb = nv * dv / 32;
#pragma unroll
  for (int k = 0; k < kNormPer; ++k) {
    if (32 * k >= dv) break;
    warp_quantize_block(v[k], nibble, q, static_cast<long long>(t) * nb + (h * dv) / 32 + k);
  }
}

}  // namespace

void gdn_conv(const float* qkv, const float* taps, float* state, int T, int cd, int K, float* out, cudaStream_t s) {
  if (K < 1 || K > kMaxTaps) throw Error("CUDA: Gated DeltaNet conv of " + std::to_string(K) + " taps (at most " + std::to_string(kMaxTaps) + ")");
  if (T == 1) {
    launch(conv_kernel, (cd + 255) / 256, 256, 0, s, qkv, taps, state, T, cd, K, out);
  } else {
    launch(conv_tiles_kernel, dim3((cd + 127) / 128, (T + kConvTile - 1) / kConvTile), 128, 0, s, qkv, taps, state, T, cd, K, out);
    launch(conv_state_kernel, (cd + 255) / 256, 256, 0, s, qkv, state, T, cd, K);
  }
  check(cudaGetLastError(), "gdn conv launch");
}

namespace {
// conv_norm_step_kernel's reach: key heads a power of two <= 128, K <= kMaxTaps taps.
bool conv_step_fits(int dk, int K) { return dk <= 128 && !(dk & (dk - 1)) && K >= 1 && K <= kMaxTaps; }
}  // namespace

bool gdn_conv_norm_step(const float* qkv, const float* taps, float* state, int cd, int K, int nk, int dk, float* out, cudaStream_t s, int rows,
                        float* const* states) {
  if (!conv_step_fits(dk, K)) return false;
  launch(conv_norm_step_kernel, dim3((cd + 127) / 128, states ? rows : 1), 128, 0, s, qkv, taps, state, cd, K, nk, dk, out, states);
  check(cudaGetLastError(), "gdn conv+norm launch");
  return true;
}

void gdn_qk_norm(float* conv_out, int T, int cd, int nk, int dk, cudaStream_t s) {
  const int warps = T * 2 * nk;
  launch(qk_norm_kernel, (warps + 7) / 8, 256, 0, s, conv_out, T, cd, nk, dk);
  check(cudaGetLastError(), "gdn qk norm launch");
}

namespace {

// A head over a cluster of kStepSplit blocks where its columns split into
// whole blocks of 32 (sm_90): 4x the SMs on the state's bytes.
constexpr int kStepSplit = 4;
int step_split(int dv) { return device_cc_major() >= 9 && dv % (32 * kStepSplit) == 0 ? kStepSplit : 1; }
bool step_fits(int dk, int dv) { return (dk + 7) / 8 <= 16 && 32 * ((dv / step_split(dv) + 3) / 4) <= 1024; }

// recurrence_step_kernel over `rows` rows (states: forward_rows' rows; null: one token of S).
bool recurrence_step(float* S, float* const* states, int rows, const float* conv_out, const float* z, const float* b, const float* a, const float* A_log,
                     const float* dt_bias, const float* norm_w, int nk, int nv, int dk, int dv, int cd, float eps, float* normed, cudaStream_t s,
                     const QuantX* q, bool nibble) {
  const int rows_per_lane = (dk + 7) / 8, split = step_split(dv);
  const int cols = dv / split, step_threads = 32 * ((cols + 3) / 4);
  const bool quant = q && cols % 32 == 0;
  auto run = [&]<int R>() {
    if (split > 1)
      launch_cluster(recurrence_step_kernel<R, true>, dim3(nv * split, rows), step_threads, cols * sizeof(float), s, split, S, conv_out, z, b, a, A_log,
                     dt_bias, norm_w, nk, nv, dk, dv, cd, eps, normed, quant ? *q : QuantX{}, quant, nibble, states);
    else
      launch(recurrence_step_kernel<R, false>, dim3(nv, rows), step_threads, cols * sizeof(float), s, S, conv_out, z, b, a, A_log, dt_bias, norm_w, nk, nv,
             dk, dv, cd, eps, normed, quant ? *q : QuantX{}, quant, nibble, states);
  };
  if (rows_per_lane <= 2) run.template operator()<2>();
  else if (rows_per_lane <= 4) run.template operator()<4>();
  else if (rows_per_lane <= 8) run.template operator()<8>();
  else run.template operator()<16>();
  check(cudaGetLastError(), "gdn recurrence step launch");
  return quant;
}

}  // namespace

bool gdn_rows_supported(int dk, int dv, int K) { return conv_step_fits(dk, K) && step_fits(dk, dv); }

bool gdn_recurrence_rows(float* const* states, const float* conv_out, const float* z, const float* b, const float* a, const float* A_log,
                         const float* dt_bias, const float* norm_w, int T, int nk, int nv, int dk, int dv, int cd, float eps, float* normed,
                         cudaStream_t s, const QuantX* q, bool nibble) {
  if (!step_fits(dk, dv)) throw Error("CUDA: Gated DeltaNet rows of a head of " + std::to_string(dk) + " x " + std::to_string(dv) + " (internal)");
  return recurrence_step(nullptr, states, T, conv_out, z, b, a, A_log, dt_bias, norm_w, nk, nv, dk, dv, cd, eps, normed, s, q, nibble);
}

bool gdn_recurrence(float* S, const float* conv_out, const float* z, const float* b, const float* a, const float* A_log, const float* dt_bias,
                    const float* norm_w, int T, int nk, int nv, int dk, int dv, int cd, float eps, float* normed, cudaStream_t s, const QuantX* q,
                    bool nibble, float* chunk_work) {
  const int rows_per_lane = (dk + 7) / 8;
  if (T == 1 && step_fits(dk, dv)) return recurrence_step(S, nullptr, 1, conv_out, z, b, a, A_log, dt_bias, norm_w, nk, nv, dk, dv, cd, eps, normed, s, q, nibble);
  if (T > 1 && chunk_work && dv <= 32 * kNormPer &&
      gdn_recurrence_chunked(S, conv_out, b, a, A_log, dt_bias, T, nk, nv, dk, dv, cd, chunk_work, normed, s)) {
    const bool quant = q && dv % 32 == 0;
    launch(gated_norm_kernel, (T * nv + 7) / 8, 256, 0, s, normed, z, norm_w, T, nv, dv, eps, quant ? *q : QuantX{}, quant, nibble);
    check(cudaGetLastError(), "gdn gated norm launch");
    return quant;
  }
  if (rows_per_lane <= 16 && dv <= 32 * kNormPer) {
    const int blocks = nv * ((dv + kRecCols - 1) / kRecCols);
    const std::size_t shmem = (2 * std::size_t(kRecTile) * dk + kRecTile * kRecCols + 2 * kRecTile) * sizeof(float);
    auto run = [&]<int R>() {
      launch(recurrence_warp_kernel<R>, blocks, 128, shmem, s, S, conv_out, b, a, A_log, dt_bias, T, nk, nv, dk, dv, cd, normed);
    };
    if (rows_per_lane <= 2) run.template operator()<2>();
    else if (rows_per_lane <= 4) run.template operator()<4>();
    else if (rows_per_lane <= 8) run.template operator()<8>();
    else run.template operator()<16>();
    const bool quant = q && dv % 32 == 0;
    launch(gated_norm_kernel, (T * nv + 7) / 8, 256, 0, s, normed, z, norm_w, T, nv, dv, eps, quant ? *q : QuantX{}, quant, nibble);
    check(cudaGetLastError(), "gdn recurrence launch");
    return quant;
  }
  const int dvp = (dv + 31) / 32 * 32, parts = (dk + 31) / 32;
  if (parts > kMaxParts || parts * dvp > 1024) throw Error("CUDA: Gated DeltaNet head of " + std::to_string(dk) + " x " + std::to_string(dv) + " is too large");
  const std::size_t shmem = (2 * static_cast<std::size_t>(dk) + static_cast<std::size_t>(parts) * dvp) * sizeof(float);
  launch(recurrence_kernel, nv, parts * dvp, shmem, s, S, conv_out, z, b, a, A_log, dt_bias, norm_w, T, nk, nv, dk, dv, cd, eps, normed);
  check(cudaGetLastError(), "gdn recurrence launch");
  return false;
}

}  // namespace coli::cuda
