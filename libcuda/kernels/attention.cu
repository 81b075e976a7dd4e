// Full attention on the device: per-head RMSNorm ((1 + w), or w for
// qwen3_moe: AttnForm) of q and k, rotary embedding on the first `rot` dims
// (rotate-half), GQA over the KV cache, sigmoid(gate) on the output where
// q_proj has gate rows (qwen3_5_moe, qwen3_next). Same float steps as the
// CPU reference (cpu_attention.cpp).
#include <algorithm>
#include <string>

#include "cuda_util.cuh"
#include "device_math.cuh"
#include "kernels.cuh"

namespace coli::cuda {

namespace {

// Normalises v[0..hd) in shared memory with (1 + w), then rotates the first
// rot dims at position pos. inv_freq[i] = f32(1 / theta^(2i / rot)), made on
// the host as the reference makes it. All threads of the block take part.
__device__ void norm_rope(float* v, const float* w, int hd, int rot, int pos, const float* inv_freq, float eps, bool plus_one) {
  float ss = 0;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) ss += v[i] * v[i];
  const float r = rsqrtf(block_sum(ss) / hd + eps);
  for (int i = threadIdx.x; i < hd; i += blockDim.x) v[i] = v[i] * r * (plus_one ? 1.0f + w[i] : w[i]);
  __syncthreads();
  const int half = rot / 2;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    // As the reference: angle = pos * inv_freq in f32, its cos and sin in double.
    const float angle = static_cast<float>(pos) * inv_freq[i];
    double sd, cd;
    sincos(double(angle), &sd, &cd);
    const float c = static_cast<float>(cd), s = static_cast<float>(sd);
    const float x1 = v[i], x2 = v[i + half];
    v[i] = x1 * c - x2 * s;
    v[i + half] = x2 * c + x1 * s;
  }
  __syncthreads();
}

// Block (t, kv head): k normalised and rotated, k and v into the cache.
__global__ void store_kv_kernel(const float* k, const float* v, const float* k_norm, const int* d_pos, int kv_heads, int hd, int rot, const float* inv_freq,
                                float eps, float* kc, float* vc, bool plus_one, KvRows rows) {
  griddep_wait();
  extern __shared__ float sh[];
  const int t = blockIdx.x, h = blockIdx.y, kv_w = kv_heads * hd;
  const int pos = rows.pos ? rows.pos[t] : *d_pos + t;
  if (rows.k) kc = rows.k[t], vc = rows.v[t];
  for (int i = threadIdx.x; i < hd; i += blockDim.x) sh[i] = k[static_cast<long long>(t) * kv_w + h * hd + i];
  __syncthreads();
  norm_rope(sh, k_norm, hd, rot, pos, inv_freq, eps, plus_one);
  for (int i = threadIdx.x; i < hd; i += blockDim.x) {
    kc[static_cast<long long>(pos) * kv_w + h * hd + i] = sh[i];
    vc[static_cast<long long>(pos) * kv_w + h * hd + i] = v[static_cast<long long>(t) * kv_w + h * hd + i];
  }
}

// Block (t, head): scores over positions 0 .. pos, softmax, weighted values.
__global__ void attention_kernel(const float* qg, const float* q_norm, const float* kc, const float* vc, const int* d_pos, int heads, int kv_heads,
                                 int hd, int rot, const float* inv_freq, float eps, float* scores, int cap, float* out, QuantX oq, bool quant,
                                 bool nibble, AttnForm form, KvRows rows) {
  griddep_wait();
  extern __shared__ float q[];
  const int per_head = form.gated ? 2 * hd : hd;
  const int t = blockIdx.x, h = blockIdx.y, kv_w = kv_heads * hd, qg_w = heads * per_head;
  const int pos = rows.pos ? rows.pos[t] : *d_pos + t, n_ctx = pos + 1;
  if (rows.k) kc = rows.k[t], vc = rows.v[t];
  const float* qsrc = qg + static_cast<long long>(t) * qg_w + h * per_head;  // query, then gate
  for (int i = threadIdx.x; i < hd; i += blockDim.x) q[i] = qsrc[i];
  __syncthreads();
  norm_rope(q, q_norm, hd, rot, pos, inv_freq, eps, form.plus_one);
  const int kvh = h / (heads / kv_heads);
  const float scale = rsqrtf(static_cast<float>(hd));
  float* sc = scores + (static_cast<long long>(t) * heads + h) * cap;
  // Warp per key, lanes along the head dimension (coalesced rows of the cache).
  const int lane = threadIdx.x & 31, nw = blockDim.x / 32;
  float m = -INFINITY;
  for (int j = threadIdx.x / 32; j < n_ctx; j += nw) {
    const float* kj = kc + static_cast<long long>(j) * kv_w + kvh * hd;
    float d = 0;
    for (int i = lane; i < hd; i += 32) d += q[i] * kj[i];
    d = warp_sum(d) * scale;
    if (lane == 0) sc[j] = d;
    m = fmaxf(m, d);
  }
  m = block_max(m);  // syncs: sc is complete
  float sum = 0;
  for (int j = threadIdx.x; j < n_ctx; j += blockDim.x) {
    const float e = expf(sc[j] - m);
    sc[j] = e;
    sum += e;
  }
  const float inv = 1.0f / block_sum(sum);  // block_sum syncs: sc is complete
  // Whole warps per step (d0 warp-uniform): with quant (hd % 32 == 0) each
  // warp's 32 outputs are one block of the o_proj input, quantized here.
  for (int d0 = threadIdx.x - lane; d0 < hd; d0 += blockDim.x) {
    const int d = d0 + lane;
    if (d >= hd) continue;
    float o = 0;
    for (int j = 0; j < n_ctx; ++j) o += sc[j] * vc[static_cast<long long>(j) * kv_w + kvh * hd + d];
    const float y = form.gated ? o * inv * sigmoidf(qsrc[hd + d]) : o * inv;
    out[static_cast<long long>(t) * heads * hd + h * hd + d] = y;
    if (quant) warp_quantize_block(y, nibble, oq, (static_cast<long long>(t) * heads * hd + h * hd + d0) / 32);
  }
}

// Split-KV attention (flash decoding): block (t, head, split) runs an
// online softmax over its split's keys, warp per key as above with each
// lane keeping PER = hd / 32 dims of q and of the output in registers, and
// leaves (max, sum of exp, unnormalised output) in part; no score buffer,
// so memory does not grow with the context. The block's warps merge in warp
// order (deterministic).
template <int PER>
__global__ void attention_split_kernel(const float* qg, const float* q_norm, const float* kc, const float* vc, const int* d_pos, int heads,
                                       int kv_heads, int hd, int rot, const float* inv_freq, float eps, int keys_per_split, float* part, AttnForm form,
                                       KvRows rows) {
  griddep_wait();
  extern __shared__ float sm[];  // q [hd], then per warp [max, sum, out[hd]]
  const int t = blockIdx.x, h = blockIdx.y, sp = blockIdx.z, splits = gridDim.z;
  const int per_head = form.gated ? 2 * hd : hd;
  const int kv_w = kv_heads * hd, qg_w = heads * per_head, stride = hd + 2;
  const int pos = rows.pos ? rows.pos[t] : *d_pos + t, n_ctx = pos + 1;
  if (rows.k) kc = rows.k[t], vc = rows.v[t];
  const int j0 = sp * keys_per_split, j1 = min(n_ctx, j0 + keys_per_split);
  float* out = part + ((static_cast<long long>(t) * heads + h) * splits + sp) * stride;
  if (j0 >= j1) {  // past this token's position: an empty split
    for (int i = threadIdx.x; i < stride; i += blockDim.x) out[i] = i == 0 ? -INFINITY : 0.0f;
    return;
  }
  float* q = sm;
  const float* qsrc = qg + static_cast<long long>(t) * qg_w + h * per_head;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) q[i] = qsrc[i];
  __syncthreads();
  norm_rope(q, q_norm, hd, rot, pos, inv_freq, eps, form.plus_one);
  const int kvh = h / (heads / kv_heads), lane = threadIdx.x & 31, w = threadIdx.x / 32, nw = blockDim.x / 32;
  const float scale = rsqrtf(static_cast<float>(hd));
  float qr[PER], o[PER];
#pragma unroll
  for (int k = 0; k < PER; ++k) qr[k] = q[lane + 32 * k], o[k] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int j = j0 + w; j < j1; j += nw) {
    const float* kj = kc + static_cast<long long>(j) * kv_w + kvh * hd;
    const float* vj = vc + static_cast<long long>(j) * kv_w + kvh * hd;
    float d = 0.0f;
#pragma unroll
    for (int k = 0; k < PER; ++k) d += qr[k] * kj[lane + 32 * k];
    const float sc = warp_sum(d) * scale;
    const float mn = fmaxf(m, sc), c = expf(m - mn), e = expf(sc - mn);
    l = l * c + e;
#pragma unroll
    for (int k = 0; k < PER; ++k) o[k] = o[k] * c + e * vj[lane + 32 * k];
    m = mn;
  }
  float* wp = sm + hd + w * stride;
  if (lane == 0) wp[0] = m, wp[1] = l;
#pragma unroll
  for (int k = 0; k < PER; ++k) wp[2 + lane + 32 * k] = o[k];
  __syncthreads();
  if (w != 0) return;
  float M = -INFINITY;
  for (int i = 0; i < nw; ++i) M = fmaxf(M, sm[hd + i * stride]);
  float L = 0.0f, O[PER];
#pragma unroll
  for (int k = 0; k < PER; ++k) O[k] = 0.0f;
  for (int i = 0; i < nw; ++i) {
    const float* pi = sm + hd + i * stride;
    const float c = pi[0] == -INFINITY ? 0.0f : expf(pi[0] - M);  // a warp with no key of this split
    L += c * pi[1];
#pragma unroll
    for (int k = 0; k < PER; ++k) O[k] += c * pi[2 + lane + 32 * k];
  }
  if (lane == 0) out[0] = M, out[1] = L;
#pragma unroll
  for (int k = 0; k < PER; ++k) out[2 + lane + 32 * k] = O[k];
}

// Block (t, head): the splits' partial softmaxes merged in split order,
// normalised and gated; with quant each warp's 32 outputs quantized for
// o_proj as attention_kernel does.
__global__ void attention_combine_kernel(const float* part, const float* qg, int heads, int hd, int splits, float* out, QuantX oq, bool quant,
                                         bool nibble, bool gated) {
  griddep_wait();
  const int t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x & 31, stride = hd + 2;
  const float* p = part + (static_cast<long long>(t) * heads + h) * splits * stride;
  float M = -INFINITY;
  for (int s = 0; s < splits; ++s) M = fmaxf(M, p[s * stride]);
  float L = 0.0f;
  for (int s = 0; s < splits; ++s)
    if (p[s * stride] != -INFINITY) L += expf(p[s * stride] - M) * p[s * stride + 1];
  const float inv = 1.0f / L;
  const float* qsrc = qg + (static_cast<long long>(t) * heads + h) * (gated ? 2 * hd : hd);
  for (int d0 = threadIdx.x - lane; d0 < hd; d0 += blockDim.x) {
    const int d = d0 + lane;
    if (d >= hd) continue;
    float o = 0.0f;
    for (int s = 0; s < splits; ++s)
      if (p[s * stride] != -INFINITY) o += expf(p[s * stride] - M) * p[s * stride + 2 + d];
    const float y = gated ? o * inv * sigmoidf(qsrc[hd + d]) : o * inv;
    out[static_cast<long long>(t) * heads * hd + h * hd + d] = y;
    if (quant) warp_quantize_block(y, nibble, oq, (static_cast<long long>(t) * heads * hd + h * hd + d0) / 32);
  }
}

}  // namespace

void attn_store_kv(const float* k, const float* v, const float* k_norm, int T, const int* d_pos, int kv_heads, int hd, int rot, const float* inv_freq,
                   float eps, float* kc, float* vc, cudaStream_t s, AttnForm form, KvRows rows) {
  launch(store_kv_kernel, dim3(T, kv_heads), 128, hd * sizeof(float), s, k, v, k_norm, d_pos, kv_heads, hd, rot, inv_freq, eps, kc, vc, form.plus_one,
         rows);
  check(cudaGetLastError(), "store_kv launch");
}

void attention(const float* qg, const float* q_norm, const float* kc, const float* vc, int T, const int* d_pos, int heads, int kv_heads, int hd,
               int rot, const float* inv_freq, float eps, float* scores, int cap, float* out, cudaStream_t s, const QuantX* q, bool nibble,
               AttnForm form, KvRows rows) {
  if (q && hd % 32) throw Error("CUDA: attention output quantized with a head size of " + std::to_string(hd) + " (needs a multiple of 32)");
  launch(attention_kernel, dim3(T, heads), 256, hd * sizeof(float), s, qg, q_norm, kc, vc, d_pos, heads, kv_heads, hd, rot, inv_freq, eps, scores, cap, out,
         q ? *q : QuantX{}, q != nullptr, nibble, form, rows);
  check(cudaGetLastError(), "attention launch");
}

void attention_split(const float* qg, const float* q_norm, const float* kc, const float* vc, int T, const int* d_pos, int heads, int kv_heads, int hd,
                     int rot, const float* inv_freq, float eps, int cap, float* part, float* out, cudaStream_t s, const QuantX* q, bool nibble,
                     AttnForm form, KvRows rows) {
  if (!attention_split_supported(hd)) throw Error("CUDA: split-KV attention with a head size of " + std::to_string(hd) + " (needs 32, 64, 128 or 256)");
  int kps = 0;
  const int splits = attention_splits(T, cap, &kps);
  constexpr int kThreads = 256;
  const std::size_t smem = (hd + (kThreads / 32) * std::size_t(hd + 2)) * sizeof(float);
  auto run = [&]<int PER>() {
    launch(attention_split_kernel<PER>, dim3(T, heads, splits), kThreads, smem, s, qg, q_norm, kc, vc, d_pos, heads, kv_heads, hd, rot, inv_freq, eps,
           kps, part, form, rows);
  };
  switch (hd) {
    case 32: run.template operator()<1>(); break;
    case 64: run.template operator()<2>(); break;
    case 128: run.template operator()<4>(); break;
    default: run.template operator()<8>(); break;
  }
  launch(attention_combine_kernel, dim3(T, heads), 256, 0, s, part, qg, heads, hd, splits, out, q ? *q : QuantX{}, q != nullptr, nibble, form.gated);
  check(cudaGetLastError(), "split attention launch");
}

}  // namespace coli::cuda
