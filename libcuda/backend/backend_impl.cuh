// CudaBackend's declaration, shared by the files that implement it:
// cuda_backend.cu (construction: the weights, the tier, buffers),
// mtp.cu (the MTP layer's pass, the speculative window's rewind),
// forward.cu (a chunk's forward pass, top to bottom), chunk.cu (a chunk's
// launch and finish, decode graphs, routing heat) and layer_steps.cu (the
// per-layer Backend steps on host arrays). The routed experts' tables,
// slots and handoff are the ExpertTier's (tier/expert_tier.cuh). Internal
// to libcuda: callers use cuda_backend.h.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cuda_backend.h"
#include "cuda_util.cuh"
#include "expert_tier.cuh"
#include "host_registry.cuh"
#include "kernels.cuh"
#include "norm.cuh"
#include "route.cuh"
#include "staged_upload.cuh"

namespace coli::cuda::detail {

// Device copies of the weights, sub-allocated from one allocation.
class WeightArena {
 public:
  void reserve(std::size_t bytes) { base_.resize(bytes); }
  // Large copies go through the uploader (done at its flush; their sources
  // must outlive it: the model's tensors do), small ones at once.
  void set_uploader(StagedUploader* u, std::size_t min_bytes) { uploader_ = u, min_bytes_ = min_bytes; }
  // Copies n bytes from host; returns the device address (256-byte aligned).
  const uint8_t* put(const void* src, std::size_t n) {
    used_ = (used_ + 255) / 256 * 256;
    if (used_ + n > base_.size()) throw Error("CUDA: weight arena overflow (internal)");
    uint8_t* dst = base_.get() + used_;
    if (uploader_ && n >= min_bytes_) uploader_->add(dst, src, n);
    else check(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice), "upload weights");
    used_ += n;
    return dst;
  }

 private:
  DeviceArray<uint8_t> base_;
  std::size_t used_ = 0;
  StagedUploader* uploader_ = nullptr;
  std::size_t min_bytes_ = 0;
};

// A container matrix's device description (data: its bytes on the device);
// what names it in errors.
DevMatrix describe(const Matrix& m, const uint8_t* data, const char* what);

// Whether a norm should quantize its output for the int8-activation matmuls
// that read it: some of them take int8 x and all of those want one code
// order (*nibble: int4's). Float-path readers use the float output.
bool quantize_for(std::initializer_list<const DevMatrix*> readers, bool* nibble);

struct DevLayer {
  LayerKind kind;
  const float *input_norm, *post_norm;
  // attention
  DevMatrix q_proj, k_proj, v_proj, o_proj;
  const float *q_norm, *k_norm;
  // Gated DeltaNet
  DevMatrix in_qkv, in_z, in_b, in_a, out_proj;
  const float *conv1d, *dt_bias, *A_log, *gdn_norm;
  // MoE
  DevMatrix router, sh_gate, sh_up, sh_down, sh_gate_proj;
};

// Under a VRAM budget a session's KV cache is made for the whole context
// at once (ensure_cap): two arrays an attention layer, 128 MiB for 8
// layers at 4,096 positions. A session that goes leaves its arrays here and
// the next one takes them, so a new conversation (a coli-serve request, a
// benchmark's repetition) does not pay their cudaMalloc calls again. The
// arrays stay charged to the budget, which the ledger planned for one
// sequence's cache. Shared by the backend and its states: the last owner
// frees what is left.
struct KvSpare {
  std::mutex mu;
  std::size_t n = 0;                     // each array's floats: context positions x kv heads x head dim
  std::vector<DeviceArray<float>> arrays;
};

// A rows step's sessions (CudaBackend::step_rows): in device memory, row
// t's position and, per layer, its cache or state: K and V of an attention
// layer, the conv window and recurrent state of a Gated DeltaNet layer.
// The kernels read them at run time, so one captured graph serves any
// sessions of the same row count.
struct RowsRun {
  int cap = 0;                    // the largest of the rows' KV caches (the split-KV attention's splits)
  float* const* table = nullptr;  // [layer][2][stride] device pointers
  int stride = 0;                 // rows a table entry has room for
  const int* pos = nullptr;       // [rows]
  float* const* first(int l) const { return table + std::size_t(2 * l) * stride; }
  float* const* second(int l) const { return table + std::size_t(2 * l + 1) * stride; }
  KvRows kv(int l) const { return {first(l), second(l), pos}; }
};

struct CudaState;
// A segments step's pieces (CudaBackend::step_segments): the first `rows`
// tokens are rows (a RowsRun), then each segment is tokens [off, off +
// len) of one session, at positions *pos, *pos + 1, .. (device memory).
struct SegmentsRun {
  int rows = 0;
  struct Segment {
    CudaState* st;
    int off, len;
    const int* pos;
  };
  std::vector<Segment> segs;
};

// Per-session state on the device.
struct CudaState : BackendState {
  std::shared_ptr<DeviceBudget> budget;  // first: outlives the arrays charged to it
  std::shared_ptr<KvSpare> kv_spare;     // set while this state's KV arrays have the spare size; destroyed before budget
  struct Layer {
    DeviceArray<float> k, v;       // attention: [cap, kv_heads * hd]
    DeviceArray<float> conv, S;    // DeltaNet: [K-1, cd], [nv, dk, dv]
    // The rewind journal of a DeltaNet layer (mark_state .. rewind_state):
    // conv and S at the mark, and the conv inputs and the beta and decay
    // inputs of each token fed since ([kRewindTokens, cd], [.., nv] x 2).
    DeviceArray<float> mark_conv, mark_S, j_proj, j_b, j_a;
    int journal = -1;              // tokens in it; -1: not keeping
  };
  std::vector<Layer> layers;       // the model's, then the MTP layer's (CudaOptions::mtp)
  bool keeping = false;            // between mark_state and rewind_state
  int cap = 0;                     // KV cache positions allocated
  // A graph holds the addresses of this state's and the backend's buffers:
  // valid while the cache size, the backend's buffer generation, the chunk's
  // size, logit rows and hidden rows are the ones it was captured with.
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    int cap = -1, rows = -1, T = -1;
    long gen = -1;
    bool hidden = false, greedy = false;
    uint64_t bytes = 0;  // device memory the instantiation took, charged to budget
  };
  // decode: one-token steps; window: a speculative verify chunk (T <=
  // kRewindTokens tokens right after mark_state, its journal at 0).
  Graph decode, window;
  ~CudaState() override {
    for (Graph* g : {&decode, &window}) {
      if (g->exec) cudaGraphExecDestroy(g->exec);
      if (budget && g->bytes) budget->credit(g->bytes);
    }
    if (!kv_spare) return;
    std::lock_guard<std::mutex> lock(kv_spare->mu);
    for (Layer& L : layers)
      for (DeviceArray<float>* a : {&L.k, &L.v})
        if (a->size() == kv_spare->n && a->size()) kv_spare->arrays.push_back(std::move(*a));
  }
};

class CudaBackend : public Backend {
 public:
  CudaBackend(const Model& model, const CudaOptions& opt);
  ~CudaBackend() override;
  std::string name() const override { return "cuda"; }
  TierStats tier_stats() const override;
  std::vector<std::pair<std::string, double>> start_phases() const override { return start_phases_; }
  std::unique_ptr<BackendState> new_state() const override;
  bool runs_whole_chunks() const override { return true; }
  void forward_chunk(BackendState& state, const int* ids, int T, int pos0, int logit_rows, float* logits) override {
    start_chunk(state, ids, T, pos0, logit_rows);
    finish_chunk(state, logits);
  }
  void start_chunk(BackendState& state, const int* ids, int T, int pos0, int logit_rows) override;
  // start_chunk's launches once the ids are on their way: the decode graph or a prompt chunk's kernels.
  void launch_chunk(CudaState& st, int T, int logit_rows, std::chrono::steady_clock::time_point t_start, bool hidden);
  // The chunk's kernels captured into g (again when a buffer moved) and launched.
  // rows: a rows step's (step_rows), captured once per row count and cap.
  void launch_graph(CudaState& st, CudaState::Graph& g, int T, int logit_rows, bool hidden, const RowsRun* rows = nullptr);
  void finish_chunk(BackendState& state, float* logits) override;
  // Routing heat of whole chunks: heat_, counted by the router's top-k kernel.
  bool read_heat(std::vector<uint64_t>& counts) override;

  // The per-layer steps on host arrays (layer_steps.cu): each uploads its
  // input, runs a chunk's kernels for that step and downloads its output.
  // The engine takes them when it must observe the routing.
  void embed(const int* ids, int T, float* x) override;
  void trunk_step(int layer, BackendState& state, int pos0, int T, float* x) override;
  void ffn_norm(int layer, int T, const float* x, float* hn) override;
  void route(int layer, int T, const float* hn, int* idx, float* w) override;
  void shared_expert(int layer, int T, const float* hn, float* out) override;
  void routed_experts(int layer, const ExpertPair* pairs, int n, const float* hn, float* out) override;
  void logits(int T, const float* x, float* out) override;
  // The MTP module's parts (CudaOptions::mtp; its layer runs through the
  // steps above as layer num_layers) and the speculative window.
  void output_norm(int T, const float* x, float* h, bool mtp) override;
  void lm_head(int T, const float* h, float* out) override;
  void mtp_input(int T, const float* e, const float* h, float* x) override;
  void mark_state(BackendState& state) override;
  void rewind_state(BackendState& state, int tokens) override;
  bool chunk_hidden(float* hidden) override;
  // The decode step of S sessions as one pass (CudaOptions::batch_rows):
  // the chunk's kernels over S rows, each row's mixer on its own cache or
  // state through a RowsRun; on the whole model a captured graph per S.
  bool step_rows(BackendState* const* states, const int* ids, const int* positions, int S, float* logits) override;
  // Rows and prompt chunks of several sessions as one pass (rows.cu): the
  // leading one-token segments as a rows step's rows, each longer one
  // through the chunk's mixer kernels on its session; every matmul and the
  // routed experts over all the tokens. No graph; under a budget the misses
  // go to the host as a rows step's do.
  bool step_segments(BackendState* const* states, const int* ids, const int* positions, const int* lens, int n, float* logits) override;
  // The pinned buffer each chunk's logits come to (null before the first).
  const float* kept_logits() const override { return h_logits_; }
  // Greedy ids on the device (greedy.cu) after the lm_head, copied instead of the logits.
  bool greedy_only(bool on) override;
  const int* kept_greedy() const override { return h_greedy_; }
  bool mtp_chunk(BackendState& state, const int* ids, const float* h, int T, int pos0, int logit_rows, float* logits, float* g) override;

 private:
  // A per-layer step's start: a started chunk finished, buffers for T
  // tokens (T <= max_chunk), launch settings of a prompt chunk.
  void begin_layer_step(int T);
  void upload(float* dst, const float* src, std::size_t n);
  // Waits for the stream, then copies n values back.
  template <typename V>
  void download(V* dst, const V* src, std::size_t n);
  const float* put_floats(const std::vector<float>& v) { return reinterpret_cast<const float*>(arena_.put(v.data(), v.size() * 4)); }
  DevMatrix put_matrix(const Matrix& m, const std::string& what) {
    if (const uint8_t* p = twin_at(m.data, m.bytes())) {
      twin_shared_ += m.bytes();
      return describe(m, p, what.c_str());
    }
    return describe(m, arena_.put(m.data, m.bytes()), what.c_str());
  }
  // The twin's copy of host bytes [src, src + n), 256-byte aligned as the
  // arena's, or null (no twin, outside it, misaligned).
  const uint8_t* twin_at(const void* src, std::size_t n) const {
    if (!twin_dev_ || !within(twin_host_, twin_bytes_, src, n)) return nullptr;
    const uint8_t* d = twin_dev_ + (static_cast<const uint8_t*>(src) - twin_host_);
    return reinterpret_cast<std::uintptr_t>(d) % 256 == 0 ? d : nullptr;
  }
  const uint8_t* twin_dev_ = nullptr;   // the mapped twin (CudaOptions::twin)
  const uint8_t* twin_host_ = nullptr;
  std::size_t twin_bytes_ = 0;
  uint64_t twin_shared_ = 0;            // weight bytes read from the twin in place
  void ensure_buffers(int T);
  void enqueue_logit_copies(int logit_rows);
  // Vocabulary columns [first, second) of logit range i: ranges shrink in
  // the ratio n : n-1 : ... : 1, so the copy and host work that remain after
  // the last range is computed are a small share of the vocabulary.
  std::pair<int, int> logit_range(int i) const {
    const long long n = logit_parts_, total = n * (n + 1) / 2, V = s_.vocab_size;
    auto edge = [&](long long k) { return static_cast<int>(V * (k * n - k * (k - 1) / 2) / total); };  // sum of the first k weights
    return {edge(i), edge(i + 1)};
  }
  void ensure_cap(CudaState& st, int needed);
  // The attention's scratch (split-KV partials or scores) for T tokens over caches of cap positions.
  void ensure_attention_scratch(int T, int cap);
  // The device and pinned logits of logit_rows rows, and hidden rows for T tokens.
  void ensure_logits(int logit_rows, int T, bool hidden);
  // The pinned host buffer the logits are copied into: at least nlog floats.
  void ensure_pinned_logits(std::size_t nlog);
  // step_rows: whether the model's mixers take rows (the one-token DeltaNet
  // kernels fit its heads), the table's pinned and device copies
  // (RowsRun: positions, then the pointers), and the captured graphs, one
  // per row count (coli-serve's steps change rows as requests come and go:
  // a graph made again at each change costs more than the step).
  bool rows_supported_ = false;
  int rows_stride_ = 0;
  uint8_t* h_rows_ = nullptr;
  DeviceArray<uint8_t> rows_dev_;
  std::vector<CudaState::Graph> rows_graphs_;  // [S]
  // A rows or segments step's start: false (nothing done) where a session
  // keeps a speculative window (its journal is per session: stepped
  // alone); else a chunk started and never finished drained and a ready
  // background pin adopted (T tokens).
  bool begin_step(BackendState* const* states, int n, int T);
  // A rows or segments step's launch (its kernels or graph), its logits'
  // copies, then finish_chunk into logits; the tier's chunk abandoned
  // where a launch throws.
  bool launch_and_finish(CudaState& st0, int T, int logit_rows, bool rows_step, std::chrono::steady_clock::time_point t_start, float* logits,
                         const std::function<void()>& launch);
  // The rows' table for states[0..S) (grown as needed) in h_rows_, copied
  // to rows_dev_ on the stream; the RowsRun over it.
  RowsRun rows_table(BackendState* const* states, const int* positions, int S, int cap);
  std::size_t rows_bytes(int stride) const { return device_padded(std::size_t(stride) * 4) + std::size_t(2) * s_.num_layers * stride * sizeof(float*); }
  // Buffers, KV cache and attention scratch for T tokens at positions pos0.. (T <= max_chunk).
  void prepare(CudaState& st, int T, int pos0);
  // The forward pass of T tokens whose position and ids are in io_.
  // hidden: also every row's final-normed hidden into hid_ (chunk_hidden).
  // rows: a rows step (step_rows), st then one of its sessions (not read).
  // seg: a segments step (step_segments): its rows through rows, then each
  // segment on its own session's cache and state; logit_rows is then the
  // rows' and segments' count, each segment's last token's logits.
  void run(CudaState& st, int T, int logit_rows, bool hidden = false, const RowsRun* rows = nullptr, const SegmentsRun* seg = nullptr);
  // A Gated DeltaNet layer's conv, q/k norm and recurrence over the conv
  // inputs in proj_ and the beta / decay inputs in b_, a_ (deltanet_layer;
  // rewind_state replays them from the journal); whether the output is in qx_.
  // off: the T tokens from token off on of the step's buffers (a segments step's piece).
  bool gdn_conv_recurrence(const DevLayer& L, CudaState::Layer& st, int T, bool want_q, const RowsRun* rows = nullptr, int l = 0, int off = 0);
  // Throws unless the MTP module is on the device.
  void need_mtp(const char* step) const;
  // hn_q: the norm before left hn quantized for this step's int8 readers.
  // rows (a rows step, layer l): each row's cache or state instead of st's.
  // seg (a segments step, layer l): its rows as above, each segment on its session's.
  void attention_layer(const DevLayer& L, CudaState::Layer& st, int T, bool hn_q, int cap, KvRows rows = {}, const SegmentsRun* seg = nullptr, int l = 0);
  void deltanet_layer(const DevLayer& L, CudaState::Layer& st, int T, bool hn_q, const RowsRun* rows = nullptr, int l = 0, const SegmentsRun* seg = nullptr);
  // Returns whether the host's part is still to be joined: a one-token
  // step's join goes into the residual add and norm after the block
  // (CudaOptions::fuse_decode; ExpertTier::join_norm).
  // rows_step: a rows step's T rows (CudaTuning::grouped_min_rows).
  bool moe_layer(const DevLayer& L, int l, int T, bool hn_q, bool rows_step = false);
  // rlogits_ = router(hn_); hn_q: hn_ is also in qx_ in the router's order.
  void router_logits(const DevLayer& L, int T, bool hn_q);
  // sh_ = shared down(silu(sg_) * su_).
  void shared_down(const DevLayer& L, int T);
  // The int8 readers of the norm before layer l's mixer / MoE block.
  bool mixer_quant(int l, bool* nibble) const;
  bool moe_quant(int l, bool* nibble) const;

  int context_tokens() const;  // CudaOptions::n_ctx, or 4096
  HostRegistry::Lease registration_;  // CudaOptions::host_regions' pieces pinned for this backend
  HostRanges pinned_;                 // those pieces: copies from them run at the pinned rate
  bool pin_pending_ = false;          // CudaOptions::pending_pin not yet taken over
  double pin_wait_ms_ = 0;            // prompt chunks waited for it
  long long pin_switch_tokens_ = -1;  // tokens launched before it was taken over
  void adopt_pending_pin(int T);      // between chunks (start_chunk)
  std::vector<std::pair<std::string, double>> start_phases_;  // the constructor's timed phases

  const ModelSpec& s_;
  CudaOptions opt_;
  std::shared_ptr<DeviceBudget> budget_;  // declared first among device owners: destroyed after them (sessions share it)
  std::shared_ptr<KvSpare> kv_spare_ = std::make_shared<KvSpare>();  // under a budget: KV arrays of sessions gone
  bool tiered_ = false;
  cudaStream_t stream_ = nullptr;
  WeightArena arena_;
  DevMatrix embed_, lm_head_;
  // Under a tier the embedding may stay on the host (embedding_on_host):
  // then embed_ describes h_emb_, pinned and mapped, max_chunk rows that
  // stage_embedding() copies a chunk's rows into (row t: token t) before
  // its kernels; emb_read_ is recorded once the embedding kernel ran.
  const Matrix* host_embed_ = nullptr;
  uint8_t* h_emb_ = nullptr;
  std::size_t emb_row_bytes_ = 0;
  cudaEvent_t emb_read_ = nullptr;
  void stage_embedding(const int* ids, int T);
  const int* embed_ids() const { return host_embed_ ? nullptr : d_ids(); }  // null: row t is token t's
  void record_embedding_read();
  const float* final_norm_ = nullptr;
  // The MTP module (CudaOptions::mtp with Model::has_mtp()); its decoder
  // layer is layers_[num_layers].
  bool mtp_ = false;
  DevMatrix mtp_fc_;
  const float *mtp_norm_embedding_ = nullptr, *mtp_norm_hidden_ = nullptr, *mtp_norm_ = nullptr;
  DeviceArray<float> mtp_in_;     // [T, 2H]: the fc's input
  DeviceArray<float> hid_;        // [T, H]: a chunk's final-normed hidden rows (chunk_hidden)
  float* hidden_next_ = nullptr;  // chunk_hidden's destination for the next chunk started
  float* hidden_dst_ = nullptr;   // the started chunk's, written by finish_chunk
  DeviceArray<float> inv_freq_;  // rotary inverse frequencies, f32(1 / theta^(2i / rot)) made on the host as the reference does
  std::vector<DevLayer> layers_;
  // The routed experts: their tables, and under a budget the slots, the
  // handoff to the host and the tier's levers. After budget_ and stream_
  // (destroyed before them), built at the end of the constructor.
  std::unique_ptr<ExpertTier> tier_;
  // Activations, sized for buf_T_ tokens.
  int buf_T_ = 0;
  // The buffers only a layer's mixer uses and those only its MoE block
  // uses lie in one allocation (ChunkBuffers::shared_bytes): the forward
  // pass runs the two in turn on stream_, so neither set outlives its half
  // of the layer. Views into it; null where the ledger sizes one at 0.
  DeviceArray<uint8_t> scratch_;
  DeviceView<float> proj_, z_, b_, a_, conv_out_, heads_out_, k_, v_;
  DeviceView<float> gdn_work_;     // chunked DeltaNet prefill's workspace (chunked_gdn_)
  DeviceView<float> rlogits_, rw_, sg_, su_, act_;
  DeviceView<float> router_work_;  // matmul_float_tiled's partial sums (prompt chunks)
  DeviceView<int> ridx_, order_, offsets_;
  DeviceView<float> ey_;  // grouped experts: per-pair down outputs [T K, H]
  DeviceArray<float> x_, hn_, mix_, sh_, sgate_, routed_, logits_, scores_, part_;
  DeviceArray<unsigned long long> heat_;  // [layers, experts] routing counts since read_heat
  DeviceArray<unsigned> route_ticket_;    // router_route's (route.cuh): 0 between launches
  // x in int8 for the dp4a kernels (largest input: T x widest matrix, or
  // the T * K experts' activations).
  DeviceArray<int8_t> qx_codes_;
  DeviceArray<float> qx_scale_;
  DeviceArray<int> qx_sum_;
  QuantX qx_;
  int scores_cap_ = 0;
  bool split_kv_ = false;  // attention_split with part_ instead of attention with scores_
  bool chunked_gdn_ = false;  // prompt chunks' DeltaNet recurrence in the WY form
  int stream_min_rows_ = 0, stream_rows_ = 0;  // gemv_stream_min_rows(), gemv_stream_rows() while this backend launches
  long buffer_gen_ = 0;  // bumped whenever an activation buffer moves (decode graphs re-capture)
  // COLI_CUDA_PROFILE=1: kernel time per step kind (events around each group
  // of launches, graphs off), printed to stderr when the backend goes.
  struct ProfRow {
    double ms = 0;
    long calls = 0;
  };
  bool profile_ = false;
  // COLI_CUDA_PROFILE=graph: graphs on; device time of each decode graph
  // replay and host time of each decode step, printed when the backend goes.
  bool graph_timing_ = false;
  cudaEvent_t graph_ev_[2] = {nullptr, nullptr};
  // Sums over the timed steps: the graph's replay on the device, the whole
  // step on the host, its launch, and the logits' work left after the last
  // range is on the host; for rows steps also their rows and the device
  // time from the step's first copy to its last logits on the host.
  struct Pending;
  struct StepTimes {
    long steps = 0, rows = 0;
    double graph_ms = 0, step_ms = 0, launch_ms = 0, tail_ms = 0, device_ms = 0;
    void add(const Pending& p, float graph, std::chrono::steady_clock::time_point last, std::chrono::steady_clock::time_point now);
  };
  StepTimes one_, rows_;  // one-token decode steps; rows steps (step_rows: coli-serve's slots, coli-bench --n-parallel)
  // The one-token step's host side more finely, and the time between steps (the caller's).
  double graph_call_ms_ = 0, pre_copy_ms_ = 0, copy_call_ms_ = 0, begin_ms_ = 0, gap_ms_ = 0;
  std::chrono::steady_clock::time_point last_finish_{};
  cudaEvent_t rows_ev_ = nullptr, rows_end_ev_ = nullptr;  // a rows step's first copy; its last logits copied (part_copied_ times nothing)
  // Every graph captured (a new row count, cache size or buffer): how many and their host time.
  double capture_ms_ = 0;
  long captures_ = 0;
  // COLI_CUDA_PROFILE=prefill: a prompt chunk's host and device time from
  // start_chunk to finish_chunk (beside the tier's timeline of its uploads).
  bool chunk_timing_ = false;
  cudaEvent_t chunk_ev_[2] = {nullptr, nullptr};  // the chunk's first device work, its logits copied
  std::chrono::steady_clock::time_point chunk_prepared_{};
  std::vector<std::pair<const char*, std::pair<cudaEvent_t, cudaEvent_t>>> prof_pending_;
  std::vector<std::pair<std::string, ProfRow>> prof_;
  long prof_tokens_ = 0;
  template <typename F>
  void step(const char* name, F&& f) {
    if (!profile_) return f();
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    cudaEventRecord(a, stream_);
    f();
    cudaEventRecord(b, stream_);
    prof_pending_.push_back({name, {a, b}});
  }
  void collect_profile();
  // The chunk's position then its ids (then a segments step's positions), pinned on the host and on the device (one copy).
  int* h_io_ = nullptr;
  DeviceArray<int> io_;
  const int* d_pos() const { return io_.get(); }
  const int* d_ids() const { return io_.get() + 1; }
  // The logits come back in logit_parts_ (CudaTuning::logit_parts, at most
  // kMaxLogitParts) column ranges, each copied (on copy_stream_) while the
  // lm_head computes the next and waited for on its own event by finish_chunk.
  static constexpr int kMaxLogitParts = 8;
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t part_ready_[kMaxLogitParts] = {}, part_copied_[kMaxLogitParts] = {};
  int logit_parts_ = 1;
  struct Pending {
    bool active = false;
    int T = 0, logit_rows = 0;
    std::chrono::steady_clock::time_point t0, launched;
    bool rows = false;    // a rows step (step_rows)
    bool greedy = false;  // greedy ids copied, no logits (greedy_only)
  } pending_;
  float* h_logits_ = nullptr;
  std::size_t h_logits_n_ = 0;
  // greedy_only: on; the ids of max_chunk rows on the device and pinned; the kernels' partials.
  bool greedy_only_ = false;
  DeviceArray<int> greedy_dev_;
  int* h_greedy_ = nullptr;
  DeviceArray<uint8_t> greedy_scratch_;
};

}  // namespace coli::cuda::detail
