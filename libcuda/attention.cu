// Gated full attention on the device (Qwen3.5): per-head RMSNorm (1 + w) of
// q and k, rotary embedding on the first `rot` dims (rotate-half), GQA over
// the KV cache, sigmoid(gate) on the output. Same float steps as the CPU
// reference (cpu_attention.cpp).
#include "cuda_util.cuh"
#include "device_math.cuh"
#include "kernels.cuh"

namespace coli::cuda {

namespace {

// Normalises v[0..hd) in shared memory with (1 + w), then rotates the first
// rot dims at position pos. inv_freq[i] = f32(1 / theta^(2i / rot)), made on
// the host as the reference makes it. All threads of the block take part.
__device__ void norm_rope(float* v, const float* w, int hd, int rot, int pos, const float* inv_freq, float eps) {
  float ss = 0;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) ss += v[i] * v[i];
  const float r = rsqrtf(block_sum(ss) / hd + eps);
  for (int i = threadIdx.x; i < hd; i += blockDim.x) v[i] = v[i] * r * (1.0f + w[i]);
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
                                float eps, float* kc, float* vc) {
  griddep_wait();
  extern __shared__ float sh[];
  const int t = blockIdx.x, h = blockIdx.y, kv_w = kv_heads * hd;
  const int pos = *d_pos + t;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) sh[i] = k[static_cast<long long>(t) * kv_w + h * hd + i];
  __syncthreads();
  norm_rope(sh, k_norm, hd, rot, pos, inv_freq, eps);
  for (int i = threadIdx.x; i < hd; i += blockDim.x) {
    kc[static_cast<long long>(pos) * kv_w + h * hd + i] = sh[i];
    vc[static_cast<long long>(pos) * kv_w + h * hd + i] = v[static_cast<long long>(t) * kv_w + h * hd + i];
  }
}

// Block (t, head): scores over positions 0 .. pos, softmax, weighted values.
__global__ void attention_kernel(const float* qg, const float* q_norm, const float* kc, const float* vc, const int* d_pos, int heads, int kv_heads,
                                 int hd, int rot, const float* inv_freq, float eps, float* scores, int cap, float* out, QuantX oq, bool quant,
                                 bool nibble) {
  griddep_wait();
  extern __shared__ float q[];
  const int t = blockIdx.x, h = blockIdx.y, kv_w = kv_heads * hd, qg_w = heads * hd * 2;
  const int pos = *d_pos + t, n_ctx = pos + 1;
  const float* qsrc = qg + static_cast<long long>(t) * qg_w + h * 2 * hd;  // query, then gate
  for (int i = threadIdx.x; i < hd; i += blockDim.x) q[i] = qsrc[i];
  __syncthreads();
  norm_rope(q, q_norm, hd, rot, pos, inv_freq, eps);
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
    const float gate = qsrc[hd + d];
    const float y = o * inv * sigmoidf(gate);
    out[static_cast<long long>(t) * heads * hd + h * hd + d] = y;
    if (quant) warp_quantize_block(y, nibble, oq, (static_cast<long long>(t) * heads * hd + h * hd + d0) / 32);
  }
}

}  // namespace

void attn_store_kv(const float* k, const float* v, const float* k_norm, int T, const int* d_pos, int kv_heads, int hd, int rot, const float* inv_freq,
                   float eps, float* kc, float* vc, cudaStream_t s) {
  launch(store_kv_kernel, dim3(T, kv_heads), 128, hd * sizeof(float), s, k, v, k_norm, d_pos, kv_heads, hd, rot, inv_freq, eps, kc, vc);
  check(cudaGetLastError(), "store_kv launch");
}

void attention(const float* qg, const float* q_norm, const float* kc, const float* vc, int T, const int* d_pos, int heads, int kv_heads, int hd,
               int rot, const float* inv_freq, float eps, float* scores, int cap, float* out, cudaStream_t s, const QuantX* q, bool nibble) {
  if (q && hd % 32) throw Error("CUDA: attention output quantized with a head size of " + std::to_string(hd) + " (needs a multiple of 32)");
  launch(attention_kernel, dim3(T, heads), 256, hd * sizeof(float), s, qg, q_norm, kc, vc, d_pos, heads, kv_heads, hd, rot, inv_freq, eps, scores, cap, out,
         q ? *q : QuantX{}, q != nullptr, nibble);
  check(cudaGetLastError(), "attention launch");
}

}  // namespace coli::cuda
