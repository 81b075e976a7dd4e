// CudaBackend's rows step: the decode steps of several sessions (coli-serve's
// slots, Engine::forward_rows) as one forward pass. The rows go through the
// chunk's kernels as T = S tokens: the trunk's matmuls read each weight once
// for all of them and the routed experts run grouped over the union of the
// rows' experts (under a budget the host computes the misses of all rows in
// one handoff), while each row's attention or Gated DeltaNet step reads and
// advances its own session's cache or state through a RowsRun table in
// device memory. On the whole model the pass is a captured graph, one per
// row count and kept, valid for any sessions: the table is data, rewritten
// each step.
#include <algorithm>
#include <cstring>
#include <functional>

#include "backend_impl.cuh"

namespace coli::cuda::detail {

RowsRun CudaBackend::rows_table(BackendState* const* states, const int* positions, int S, int cap) {
  if (S > rows_stride_) {  // the table, for at least 16 rows
    const int stride = std::max({S, 16, 2 * rows_stride_});
    BudgetScope scope(budget_.get(), "the rows step's table (--parallel)");
    if (h_rows_) cudaFreeHost(h_rows_), h_rows_ = nullptr;
    check(cudaMallocHost(&h_rows_, rows_bytes(stride)), "cudaMallocHost");
    rows_dev_.resize(0);
    rows_dev_.resize(rows_bytes(stride));
    rows_stride_ = stride;
    ++buffer_gen_;  // a captured graph reads the table's address
  }
  // The table: positions, then per layer the rows' K / V or conv window / state.
  const int L = s_.num_layers;
  int* pos = reinterpret_cast<int*>(h_rows_);
  auto* ptrs = reinterpret_cast<float**>(h_rows_ + device_padded(std::size_t(rows_stride_) * 4));
  for (int i = 0; i < S; ++i) {
    auto& st = *static_cast<CudaState*>(states[i]);
    pos[i] = positions[i];
    for (int l = 0; l < L; ++l) {
      CudaState::Layer& y = st.layers[l];
      const bool attn = layers_[l].kind == LayerKind::kFullAttention;
      ptrs[std::size_t(2 * l) * rows_stride_ + i] = attn ? y.k.get() : y.conv.get();
      ptrs[std::size_t(2 * l + 1) * rows_stride_ + i] = attn ? y.v.get() : y.S.get();
    }
  }
  RowsRun rows;
  rows.cap = cap, rows.stride = rows_stride_, rows.pos = reinterpret_cast<const int*>(rows_dev_.get());
  rows.table = reinterpret_cast<float* const*>(rows_dev_.get() + device_padded(std::size_t(rows_stride_) * 4));
  return rows;
}

bool CudaBackend::step_rows(BackendState* const* states, const int* ids, const int* positions, int S, float* logits) {
  if (!rows_supported_ || S < 2 || S > opt_.max_chunk || hidden_next_ || !begin_step(states, S, S)) return false;
  CudaState& st0 = *static_cast<CudaState*>(states[0]);
  const auto t_start = std::chrono::steady_clock::now();
  ensure_buffers(S);
  int cap = 0;
  for (int i = 0; i < S; ++i) {
    auto& st = *static_cast<CudaState*>(states[i]);
    ensure_cap(st, positions[i] + 1);
    cap = std::max(cap, st.cap);
  }
  // Split-KV attention of several tokens takes one split of `cap` keys a
  // row, each row stopping at its own position: any cap at least every
  // row's gives the same values. The context's size keeps the row count's
  // graph when the longest session grows or ends.
  if (split_kv_) cap = std::max(cap, context_tokens());
  // The rows' scratch and logits for every session at once (the ledger
  // counts one row a sequence): row counts come and go with the requests,
  // and each growth would capture every row count's graph again.
  const int rows_max = std::max(S, opt_.sequences);
  ensure_attention_scratch(rows_max, cap);
  ensure_logits(rows_max, S, false);
  RowsRun rows = rows_table(states, positions, S, cap);
  h_io_[0] = positions[0];  // not read: each row's position is in the table
  std::memcpy(h_io_ + 1, ids, S * sizeof(int));
  stage_embedding(ids, S);
  if (graph_timing_) {
    if (!rows_ev_) check(cudaEventCreate(&rows_ev_), "cudaEventCreate"), check(cudaEventCreate(&rows_end_ev_), "cudaEventCreate");
    check(cudaEventRecord(rows_ev_, stream_), "event");
  }
  check(cudaMemcpyAsync(io_.get(), h_io_, (S + 1) * sizeof(int), cudaMemcpyHostToDevice, stream_), "copy ids");
  check(cudaMemcpyAsync(rows_dev_.get(), h_rows_, rows_bytes(rows_stride_), cudaMemcpyHostToDevice, stream_), "copy the rows' table");
  prof_tokens_ += S;
  tier_->speculative_window(true);  // no prompt uploads: the rows' misses go to the host, as a verify chunk's
  struct WindowOff {
    ExpertTier* tier;
    ~WindowOff() { tier->speculative_window(false); }
  } window_off{tier_.get()};
  tier_->begin_chunk(S);
  return launch_and_finish(st0, S, S, true, t_start, logits, [&] {
    pdl_wanted() = opt_.pdl && S <= opt_.tuning.pdl_rows;
    // Graphs on the whole model only: under a budget the ledger keeps room
    // for the decode graphs alone (RuntimeReserve::fixed), and a step there
    // waits on the host's experts, not on launches.
    if (opt_.graphs && !tiered_) {
      if (rows_graphs_.size() <= std::size_t(S)) rows_graphs_.resize(S + 1);
      launch_graph(st0, rows_graphs_[S], S, S, false, &rows);
    }
    else run(st0, S, S, false, &rows);
  });
}

bool CudaBackend::begin_step(BackendState* const* states, int n, int T) {
  for (int i = 0; i < n; ++i)
    if (static_cast<CudaState*>(states[i])->keeping) return false;  // a speculative window's journal is per session: stepped alone
  if (pending_.active) hidden_dst_ = nullptr, finish_chunk(*states[0], nullptr);  // a chunk started and never finished: drain it
  adopt_pending_pin(T);
  return true;
}

bool CudaBackend::launch_and_finish(CudaState& st0, int T, int logit_rows, bool rows_step, std::chrono::steady_clock::time_point t_start, float* logits,
                                    const std::function<void()>& launch) {
  try {
    gemv_stream_min_rows() = stream_min_rows_, gemv_stream_rows() = stream_rows_;
    launch_tuning() = opt_.tuning;
    launch();
    enqueue_logit_copies(logit_rows);
    if (rows_step && graph_timing_) check(cudaEventRecord(rows_end_ev_, greedy_only_ ? stream_ : copy_stream_), "event");
    pending_ = {true, T, logit_rows, t_start, std::chrono::steady_clock::now(), rows_step, greedy_only_};
  } catch (...) {
    cudaStreamSynchronize(stream_);
    tier_->abandon_chunk();
    throw;
  }
  finish_chunk(st0, logits);
  return true;
}

bool CudaBackend::step_segments(BackendState* const* states, const int* ids, const int* positions, const int* lens, int n, float* logits) {
  int T = 0, r = 0;
  for (int i = 0; i < n; ++i) T += lens[i];
  while (r < n && lens[r] == 1) ++r;
  if (r == n) return step_rows(states, ids, positions, n, logits);
  if (!opt_.batch_rows || T > opt_.max_chunk || hidden_next_ || !begin_step(states, n, T)) return false;
  if (!rows_supported_ || r < 2) r = 0;  // every segment through the chunk's kernels (one row's too)
  CudaState& st0 = *static_cast<CudaState*>(states[0]);
  const auto t_start = std::chrono::steady_clock::now();
  ensure_buffers(T);
  // The rows' caches as step_rows takes them (one split of cap keys a row);
  // each segment's attention over its own session's cache.
  int cap = 0;
  for (int i = 0; i < n; ++i) {
    auto& st = *static_cast<CudaState*>(states[i]);
    ensure_cap(st, positions[i] + lens[i]);
    if (i < r) cap = std::max(cap, st.cap);
  }
  if (r) ensure_attention_scratch(r, cap);
  for (int i = r; i < n; ++i) ensure_attention_scratch(lens[i], static_cast<CudaState*>(states[i])->cap);
  ensure_logits(std::max(n, opt_.sequences), T, false);
  RowsRun rows;
  if (r) rows = rows_table(states, positions, r, cap);
  // io_: a position (not read), the ids, then each segment's first position.
  h_io_[0] = positions[0];
  std::memcpy(h_io_ + 1, ids, T * sizeof(int));
  SegmentsRun seg;
  seg.rows = r;
  for (int i = r, off = r; i < n; off += lens[i], ++i) {
    h_io_[1 + T + (i - r)] = positions[i];
    seg.segs.push_back({static_cast<CudaState*>(states[i]), off, lens[i], io_.get() + 1 + T + (i - r)});
  }
  stage_embedding(ids, T);
  check(cudaMemcpyAsync(io_.get(), h_io_, (1 + T + n - r) * sizeof(int), cudaMemcpyHostToDevice, stream_), "copy ids");
  if (r) check(cudaMemcpyAsync(rows_dev_.get(), h_rows_, rows_bytes(rows_stride_), cudaMemcpyHostToDevice, stream_), "copy the rows' table");
  prof_tokens_ += T;
  // A few tokens' misses go to the host as a rows step's (most experts a
  // pair or two); more, uploaded as a prompt chunk's.
  tier_->speculative_window(T <= opt_.tuning.segments_host_max);
  struct WindowOff {
    ExpertTier* tier;
    ~WindowOff() { tier->speculative_window(false); }
  } window_off{tier_.get()};
  tier_->begin_chunk(T);
  return launch_and_finish(st0, T, n, false, t_start, logits, [&] {
    pdl_wanted() = false;
    run(st0, T, n, false, r ? &rows : nullptr, &seg);
  });
}

}  // namespace coli::cuda::detail
