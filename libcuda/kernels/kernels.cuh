// Launchers of the CUDA backend's kernels, one concept per .cu file:
//   matmul.cu       y = x W^T for every weight format (warp per row; one
//                   token of int4 / int8 on lane groups of 1-2 rows; 8+
//                   tokens on tensor cores, mma_tile.cuh)
//   elementwise.cu  embedding rows, norms, residual adds, SiLU*up
//   attention.cu    gated attention: k/v into the cache, softmax over it
//   deltanet.cu     Gated DeltaNet: causal conv, q/k norms, recurrence
//   moe.cu          router softmax + top-k, routed experts over all pairs
//   greedy.cu       each logits row's greedy id (no logits to the host)
// All run on the given stream through launch() (cuda_util.cuh: PDL for
// decode steps); positions come from device memory (d_pos: tokens already
// in the session) so a captured decode graph stays valid.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "cuda_tuning.h"
#include "dev_matrix.cuh"
#include "placement/device_sizes.h"

namespace coli::cuda {

// x quantized to int8 per 32-column block for the dp4a kernels (QuantX:
// codes [T][cols], per block the scale absmax / 127 and the sum of codes).
// With up: the values quantized are silu(x) * up (SwiGLU fused in).
void quantize_x(const float* x, int T, int cols, bool nibble_order, const QuantX& q, cudaStream_t s, const float* up = nullptr);
// The rows order[*first .. *last) of x (device pointers to the bounds; at
// most max_rows of them), each as quantize_x quantizes it, into q at the
// same row: a grouped GEMM's range of pairs.
void quantize_x_rows(const float* x, const int* order, const int* first, const int* last, int max_rows, int cols, bool nibble_order, const QuantX& q,
                     cudaStream_t s);
// y[t, r] = W[r, :] . x[t, :], x [T, W.cols], y [T, ldy] (ldy >= W.rows).
// With q (scratch for T x W.cols codes), int4 / int8 matrices with a
// multiple of 32 columns take int8 activations and dp4a.
// x_in_q: q already holds x in the order W needs (int8 path only).
void matmul(const DevMatrix& W, const float* x, int T, float* y, int ldy, cudaStream_t s, const QuantX* q = nullptr, bool x_in_q = false);
// Several matrices with the same input in one launch (one kind and width;
// otherwise one launch each).
constexpr int kMaxBatch = 4;
struct MatmulOut {
  DevMatrix W;
  float* y;
  int ldy;
};
void matmul_many(const MatmulOut* outs, int n, const float* x, int T, cudaStream_t s, const QuantX* q = nullptr, bool x_in_q = false);
// One-token int8-activation matmuls over at least this many rows (all
// matrices of a matmul_many together) run as a grid of resident blocks
// striding over the rows (matmul.cu, gemv_q_stream_kernel), with this many
// rows per lane group (1, 2; 0: gemv_rows_for's choice). The backend sets
// both (CudaOptions::gemv_stream_min_rows, gemv_stream_rows).
inline int& gemv_stream_min_rows() {
  static int rows = 2048;
  return rows;
}
inline int& gemv_stream_rows() {
  static int rows = 1;
  return rows;
}
// The decode kernels' launch shapes (CudaOptions::tuning), set by the
// backend with the two above.
inline CudaTuning& launch_tuning() {
  static CudaTuning t;
  return t;
}

// Prompt chunks (T >= kFloatTiledMinTokens) through a float-format matrix
// (the router): y = W x as tiles of rows x tokens over slices of the
// columns, partial sums in work (float_tiled_work_floats) added in slice
// order. False (nothing launched) for other formats or fewer tokens.
// The sizes are libcore's (placement/device_sizes.h), shared with the VRAM ledger.
using ::coli::kFloatTiledMinTokens;
bool matmul_float_tiled(const DevMatrix& W, const float* x, int T, float* y, int ldy, float* work, cudaStream_t s);
using ::coli::float_tiled_work_floats;

// x[t] = row ids[t] of E (ids null: row t) as floats.
void embed_rows(const DevMatrix& E, const int* ids, int T, float* x, cudaStream_t s);
// y[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * (plus_one ? 1 + w : w), rows of n.
// With q (n % 32 == 0), y is also quantized into q as quantize_x would
// (nibble order for int4 weights): the next matmul takes x_in_q.
void rms_norm(const float* x, const float* w, int rows, int n, float eps, bool plus_one, float* y, cudaStream_t s, const QuantX* q = nullptr,
              bool nibble = false);
// x[r] += a[r] (+ g b[r] when b, g = sigmoid(b_gate[r]) when b_gate, else
// 1); then, when y, y[r] = rms_norm(x[r]) * (1 + w) (and quantized into q
// when given): the residual add, the next norm and its quantization in one pass.
void add_rms_norm(float* x, const float* a, const float* b, const float* b_gate, const float* w, int rows, int n, float eps, float* y,
                  cudaStream_t s, const QuantX* q = nullptr, bool nibble = false, bool plus_one = true);
void silu_mul(const float* g, const float* u, float* out, std::size_t n, cudaStream_t s);     // out = silu(g) u

// Attention. qg [T, heads * 2 * hd] (per head: query, then output gate;
// without form.gated [T, heads * hd], the query only);
// k, v [T, kv_heads * hd]. Normalises and rotates the new keys and writes
// keys and values at positions *d_pos + t of the cache [cap, kv_heads * hd].
// What differs between the families' attention (ModelSpec): the q / k
// norms' weight as (1 + w) or w, and q_proj's rows per head as [q; gate]
// with sigmoid(gate) on the output, or q alone.
struct AttnForm {
  bool plus_one = true;
  bool gated = true;
};
// Rows of different sessions (CudaBackend::forward_rows): token t is one
// session's next token, its cache k[t], v[t] (device arrays of device
// pointers) at position pos[t]; kc, vc and d_pos are then unused. Empty
// (the default): the T tokens of one session's chunk at *d_pos + t.
struct KvRows {
  float* const* k = nullptr;
  float* const* v = nullptr;
  const int* pos = nullptr;
};
void attn_store_kv(const float* k, const float* v, const float* k_norm, int T, const int* d_pos, int kv_heads, int hd, int rot, const float* inv_freq,
                   float eps, float* kc, float* vc, cudaStream_t s, AttnForm form = {}, KvRows rows = {});
// out [T, heads * hd] = sigmoid(gate) * softmax(q K^T / sqrt(hd)) V over
// positions 0 .. *d_pos + t; scores [T * heads, cap] scratch. With q (hd %
// 32 == 0), out is also left quantized there for an int8-activation o_proj.
void attention(const float* qg, const float* q_norm, const float* kc, const float* vc, int T, const int* d_pos, int heads, int kv_heads, int hd,
               int rot, const float* inv_freq, float eps, float* scores, int cap, float* out, cudaStream_t s,
               const QuantX* q = nullptr, bool nibble = false, AttnForm form = {}, KvRows rows = {});
// The same without a score buffer (split-KV, online softmax): keys in
// attention_splits(T, cap) splits of *keys_per_split positions
// (cap: the KV cache's positions), partial results in part [T, heads,
// splits, hd + 2], then merged in split order. hd: 32, 64, 128 or 256.
// With rows, cap is the largest of the rows' caches.
using ::coli::attention_split_supported;  // placement/device_sizes.h
using ::coli::attention_splits;
void attention_split(const float* qg, const float* q_norm, const float* kc, const float* vc, int T, const int* d_pos, int heads, int kv_heads, int hd,
                     int rot, const float* inv_freq, float eps, int cap, float* part, float* out, cudaStream_t s, const QuantX* q = nullptr,
                     bool nibble = false, AttnForm form = {}, KvRows rows = {});

// Gated DeltaNet. conv: out[t, c] = silu(causal conv of qkv over the state
// [K-1, cd] then this token); advances the state.
void gdn_conv(const float* qkv, const float* taps, float* state, int T, int cd, int K, float* out, cudaStream_t s);
// One token: gdn_conv then gdn_qk_norm in one launch where the heads allow
// (dk a power of two <= 128); false, nothing launched, otherwise. With
// states (a device array of `rows` device pointers), the one token of each
// of rows sessions (CudaBackend::forward_rows): row r of qkv and out with
// the conv window states[r]; state is then unused.
bool gdn_conv_norm_step(const float* qkv, const float* taps, float* state, int cd, int K, int nk, int dk, float* out, cudaStream_t s, int rows = 1,
                        float* const* states = nullptr);
// q and k heads of conv_out [T, cd] L2-normalised, q scaled by 1/sqrt(dk).
void gdn_qk_norm(float* conv_out, int T, int cd, int nk, int dk, cudaStream_t s);
// Token by token per value head with S [nv][dv][dk] (each head's state
// stored by column) resident; writes the gated-normed output [T, nv * dv].
// With q, also quantizes that output for the out projection (nibble order
// for int4) when it can: returns whether. chunk_work (a workspace of
// gdn_chunk_workspace_floats(T, ...)): a prompt chunk takes
// gdn_recurrence_chunked where it fits.
bool gdn_recurrence(float* S, const float* conv_out, const float* z, const float* b, const float* a, const float* A_log, const float* dt_bias,
                    const float* norm_w, int T, int nk, int nv, int dk, int dv, int cd, float eps, float* normed, cudaStream_t s,
                    const QuantX* q = nullptr, bool nibble = false, float* chunk_work = nullptr);
// The one-token step of gdn_recurrence for T rows of different sessions
// (CudaBackend::forward_rows): row t with the state states[t] (a device
// array of device pointers). Where gdn_rows_supported(dk, dv), else throws.
bool gdn_recurrence_rows(float* const* states, const float* conv_out, const float* z, const float* b, const float* a, const float* A_log,
                         const float* dt_bias, const float* norm_w, int T, int nk, int nv, int dk, int dv, int cd, float eps, float* normed,
                         cudaStream_t s, const QuantX* q = nullptr, bool nibble = false);
// Whether a head of dk x dv (and a conv over heads of dk) takes the rows
// steps above (gdn_conv_norm_step's and the one-token recurrence's shapes).
bool gdn_rows_supported(int dk, int dv, int K);
// The recurrence of a prompt chunk (T > 1) in the chunked WY form
// (deltanet_chunk.cu) into out [T, nv * dv], before the gated norm, using
// work (gdn_chunk_workspace_floats floats); false (nothing launched) when
// the head shape or its shared memory does not fit.
bool gdn_recurrence_chunked(float* S, const float* conv_out, const float* b, const float* a, const float* A_log, const float* dt_bias, int T, int nk,
                            int nv, int dk, int dv, int cd, float* work, float* out, cudaStream_t s);
using ::coli::gdn_chunk_workspace_floats;  // placement/device_sizes.h

// Routed experts of one layer: every expert's gate, up and down matrix
// share a format and shape; gate[e] etc. are the device addresses (entry E,
// when the backend made it, is the shared expert of the same layout).
struct ExpertTable {
  DevMatrix gate, up, down;                       // format and shape (data unused)
  const uint8_t* const* gate_ptrs = nullptr;      // [E] device array
  const uint8_t* const* up_ptrs = nullptr;
  const uint8_t* const* down_ptrs = nullptr;
};
// Softmax over E logits per token, top-K (ties to the lower index), weights
// renormalised: idx, w [T, K].
// With gate (1 row, float path), also gate_out[t] = gate . hn[t]; with
// with_shared (E <= 512, gate given) idx and w have K + 1 columns, the last
// the shared expert as expert E with weight sigmoid(gate_out[t]).
// With counts [E] (the layer's routing heat), counts[e] += 1 for each of
// the T x K routed picks (one atomic each; the shared expert not counted).
void route_topk(const float* logits, int T, int E, int K, int* idx, float* w, cudaStream_t s, const DevMatrix* gate = nullptr,
                const float* hn = nullptr, float* gate_out = nullptr, bool with_shared = false, unsigned long long* counts = nullptr);
// act[p, :] = silu(gate_e . x_t) * (up_e . x_t) for every pair p = t*K + k.
// With q (scratch), int4 / int8 experts take int8 activations and dp4a.
// With lim [T*K] (device; a decode expert split with the host), pair p's
// rows from lim[p] on are 0 and their weights not read (lim[p]: a multiple
// of 32, the expert's rows for the whole one).
void moe_gate_up(const ExpertTable& tab, const float* hn, const int* idx, int T, int K, float* act, cudaStream_t s, const QuantX* q = nullptr,
                 bool hn_in_q = false, const int* lim = nullptr);
// out[t, :] = sum_k w[t, k] * down_e(act[t*K + k]). With lim (moe_gate_up's),
// pair p's columns from lim[p] on, whose activations are 0, are skipped
// where the kernel reads 32-column blocks (the same sum, fewer bytes).
void moe_down(const ExpertTable& tab, const float* act, const int* idx, const float* w, int T, int K, float* out, cudaStream_t s,
              const QuantX* q = nullptr, const int* lim = nullptr);

// Prefill: the T * K pairs grouped by expert on the device, each expert's
// weight rows read once per tile of its tokens (tensor cores on sm_80+,
// dp4a 8 tokens at a time otherwise; int8 / int4 experts with a multiple of
// 32 columns; false, nothing launched, otherwise). Scratch:
// order [T K], offsets [2 (E + 1)], act [T K, I], y [T K, H].
struct MoeScratch {
  int* order = nullptr;
  int* offsets = nullptr;  // each expert's first pair in order, then its first chunk of pairs (a block's work)
  float* act = nullptr;
  float* y = nullptr;
};
bool moe_grouped(const ExpertTable& tab, const float* hn, const int* idx, const float* w, int T, int K, int E, const MoeScratch& sc, float* out,
                 cudaStream_t s, const QuantX& q, bool hn_in_q);
// The same in three phases, for experts that arrive in groups of expert
// ids (hybrid prefill's staging ring): begin groups the pairs (and
// quantizes hn into q unless hn_in_q); experts computes the pairs of
// experts [e0, e1) into y (quantizing hn first unless hn_in_q: a range
// after the first finds the activations in q); end combines y into out.
// begin + experts(0, E) + end is moe_grouped, launch for launch; any
// partition of [0, E) into ranges gives the same values.
bool moe_grouped_supported(const ExpertTable& tab);
void moe_grouped_begin(const ExpertTable& tab, const float* hn, const int* idx, int T, int K, int E, const MoeScratch& sc, cudaStream_t s,
                       const QuantX& q, bool hn_in_q);
void moe_grouped_experts(const ExpertTable& tab, const float* hn, int e0, int e1, int E, int T, int K, const MoeScratch& sc, cudaStream_t s,
                         const QuantX& q, bool hn_in_q);
void moe_grouped_end(const ExpertTable& tab, const float* w, int T, int K, const MoeScratch& sc, float* out, cudaStream_t s);

// Greedy ids (greedy.cu): out[r] for each row r of logits [rows, V] is the
// id of its largest logit, ties to the lower id (Sampler::sample at
// temperature 0 without penalties); -1 where no logit is above -Inf, and
// -2 - i where id i is the row's first NaN or +Inf. scratch: at least
// greedy_scratch_bytes(rows) of device memory (with the ids:
// greedy_row_bytes() a row, placement/device_sizes.h).
std::size_t greedy_scratch_bytes(int rows);
void greedy_rows(const float* logits, int rows, int V, void* scratch, int* out, cudaStream_t s);

}  // namespace coli::cuda
