// CudaBackend's chunks: start_chunk launches (a decode step as one captured
// graph, a prompt chunk's kernels one by one) and returns; finish_chunk
// waits for the logits range by range. The routing heat comes off the
// device between chunks.
#include <cstring>
#include <vector>
#include <utility>

#include "backend_impl.cuh"

namespace coli::cuda::detail {

void CudaBackend::enqueue_logit_copies(int logit_rows) {
  // Each range goes to the host on the copy stream as soon as it is
  // computed, while the next range is. Enqueued outside the decode graph:
  // a graph of one stream's kernels launches in a few microseconds, one
  // that forks to a second stream and back costs tens.
  if (greedy_only_) {  // the rows' ids, after the graph's greedy kernels on the same stream
    if (logit_rows) check(cudaMemcpyAsync(h_greedy_, greedy_dev_.get(), logit_rows * sizeof(int), cudaMemcpyDeviceToHost, stream_), "copy greedy ids");
    return;
  }
  const int V = s_.vocab_size;
  for (int i = 0; logit_rows && i < logit_parts_; ++i) {
    const auto [r0, r1] = logit_range(i);
    check(cudaStreamWaitEvent(copy_stream_, part_ready_[i]), "wait event");
    check(cudaMemcpy2DAsync(h_logits_ + r0, V * sizeof(float), logits_.get() + r0, V * sizeof(float), (r1 - r0) * sizeof(float), logit_rows,
                            cudaMemcpyDeviceToHost, copy_stream_),
          "copy logits");
    check(cudaEventRecord(part_copied_[i], copy_stream_), "event");
  }
}

void CudaBackend::prepare(CudaState& st, int T, int pos0) {
  if (T > opt_.max_chunk) throw Error("CUDA backend: chunk of " + std::to_string(T) + " tokens exceeds max_chunk " + std::to_string(opt_.max_chunk));
  ensure_buffers(T);
  ensure_cap(st, pos0 + T);
  ensure_attention_scratch(T, st.cap);
}

void CudaBackend::ensure_attention_scratch(int T, int cap) {
  BudgetScope scope(budget_.get(), "the attention scratch");
  if (s_.num_attention_layers() > 0 && split_kv_) {
    int kps = 0;
    const std::size_t need = std::size_t(T) * s_.num_heads * (s_.head_dim + 2) * attention_splits(T, cap, &kps);
    if (part_.size() < need) part_.resize(need), ++buffer_gen_;
  } else if (s_.num_attention_layers() > 0 && (scores_cap_ < cap || scores_.size() < std::size_t(buf_T_) * s_.num_heads * cap)) {
    scores_.resize(std::size_t(buf_T_) * s_.num_heads * cap);
    ++buffer_gen_;
    scores_cap_ = cap;
  }
}

void CudaBackend::ensure_pinned_logits(std::size_t nlog) {
  if (nlog <= h_logits_n_) return;
  if (h_logits_) cudaFreeHost(h_logits_);
  h_logits_ = nullptr, h_logits_n_ = 0;
  check(cudaMallocHost(&h_logits_, nlog * sizeof(float)), "cudaMallocHost");
  h_logits_n_ = nlog;
  ++buffer_gen_;  // the decode graph copies into it
}

void CudaBackend::ensure_logits(int logit_rows, int T, bool hidden) {
  const std::size_t nlog = std::size_t(logit_rows) * s_.vocab_size;
  ensure_pinned_logits(nlog);
  if (logits_.size() < nlog) {
    BudgetScope scope(budget_.get(), "the logits");
    logits_.resize(nlog), ++buffer_gen_;
  }
  if (greedy_only_ && greedy_dev_.size() < std::size_t(logit_rows)) {
    BudgetScope scope(budget_.get(), "the greedy ids");
    const int rows = std::min(std::max({logit_rows, opt_.sequences, 2 * int(greedy_dev_.size())}), std::max(1, opt_.max_chunk));
    greedy_dev_.resize(rows), greedy_scratch_.resize(greedy_scratch_bytes(rows)), ++buffer_gen_;
  }
  if (hidden && hid_.size() < std::size_t(T) * s_.hidden_size) {
    BudgetScope scope(budget_.get(), "a chunk's hidden rows (the MTP layer's input)");
    hid_.resize(std::size_t(T) * s_.hidden_size), ++buffer_gen_;
  }
}

void CudaBackend::stage_embedding(const int* ids, int T) {
  if (!host_embed_) return;
  // The rows the previous chunk's embedding kernel read are free once it ran.
  check(cudaEventSynchronize(emb_read_), "embedding rows");
  const int64_t V = host_embed_->rows;
  for (int t = 0; t < T; ++t) {
    if (ids[t] < 0 || ids[t] >= V) throw Error("CUDA backend: token id " + std::to_string(ids[t]) + " is outside the vocabulary of " + std::to_string(V));
    std::memcpy(h_emb_ + std::size_t(t) * emb_row_bytes_, host_embed_->data + std::size_t(ids[t]) * emb_row_bytes_, emb_row_bytes_);
  }
}

void CudaBackend::record_embedding_read() {
  if (!host_embed_) return;
  // Inside a decode graph an external record node, which the host's wait can see.
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream_, &cs), "capture status");
  check(cudaEventRecordWithFlags(emb_read_, stream_, cs == cudaStreamCaptureStatusActive ? cudaEventRecordExternal : cudaEventRecordDefault), "event");
}

void CudaBackend::start_chunk(BackendState& state, const int* ids, int T, int pos0, int logit_rows) {
  auto& st = static_cast<CudaState&>(state);
  if (pending_.active) hidden_dst_ = nullptr, finish_chunk(state, nullptr);  // a chunk started and never finished: drain it
  float* const hidden = std::exchange(hidden_next_, nullptr);  // chunk_hidden's, for this chunk
  adopt_pending_pin(T);  // a background pin that is ready switches the run over here
  const auto t_start = std::chrono::steady_clock::now();
  prepare(st, T, pos0);
  ensure_logits(logit_rows, T, hidden != nullptr);
  h_io_[0] = pos0;
  std::memcpy(h_io_ + 1, ids, T * sizeof(int));
  stage_embedding(ids, T);
  const auto t_copy = std::chrono::steady_clock::now();
  chunk_timing_ = opt_.profile == CudaProfile::kPrefill && T > 1;
  if (chunk_timing_) {
    if (!chunk_ev_[0]) check(cudaEventCreate(&chunk_ev_[0]), "cudaEventCreate"), check(cudaEventCreate(&chunk_ev_[1]), "cudaEventCreate");
    check(cudaEventRecord(chunk_ev_[0], stream_), "event");
    chunk_prepared_ = t_copy;
  }
  check(cudaMemcpyAsync(io_.get(), h_io_, (T + 1) * sizeof(int), cudaMemcpyHostToDevice, stream_), "copy ids");
  if (graph_timing_ && T == 1) {
    using ms_d = std::chrono::duration<double, std::milli>;
    pre_copy_ms_ += ms_d(t_copy - t_start).count();
    copy_call_ms_ += ms_d(std::chrono::steady_clock::now() - t_copy).count();
  }
  prof_tokens_ += T;
  const auto t_begin = std::chrono::steady_clock::now();
  tier_->speculative_window(st.keeping);  // a verify chunk's misses go to the host
  tier_->begin_chunk(T);  // swaps' table updates before this chunk's kernels; the handoff serves its posts
  if (graph_timing_ && T == 1) begin_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_begin).count();
  try {
    launch_chunk(st, T, logit_rows, t_start, hidden != nullptr);
    hidden_dst_ = hidden;
  } catch (...) {
    cudaStreamSynchronize(stream_);  // serve what was launched until it drains, then stop
    tier_->abandon_chunk();
    throw;
  }
}

void CudaBackend::launch_chunk(CudaState& st, int T, int logit_rows, std::chrono::steady_clock::time_point t_start, bool hidden) {
  pdl_wanted() = T == 1 && opt_.pdl;  // decode: overlap each kernel's launch with the previous one's tail
  gemv_stream_min_rows() = stream_min_rows_, gemv_stream_rows() = stream_rows_;
  launch_tuning() = opt_.tuning;
  // A one-token step as the decode graph, not in a speculative window (its
  // journal's offsets change) nor with the hidden rows asked for.
  // A speculative verify chunk as a graph of its own: its journal copies
  // go to the journal's start, where a chunk right after mark_state writes.
  bool at_mark = st.keeping;
  for (const CudaState::Layer& L : st.layers) at_mark = at_mark && L.journal <= 0;
  if (T == 1 && opt_.graphs && !st.keeping && !hidden) {
    launch_graph(st, st.decode, T, logit_rows, hidden);
  } else if (opt_.graphs && at_mark && T > 1 && T <= kRewindTokens) {
    launch_graph(st, st.window, T, logit_rows, hidden);
    for (CudaState::Layer& L : st.layers)
      if (L.journal >= 0) L.journal += T;  // what deltanet_layer counts when it runs outside a graph
  } else {
    run(st, T, logit_rows, hidden);
  }
  const auto t_launched = std::chrono::steady_clock::now();
  enqueue_logit_copies(logit_rows);
  if (chunk_timing_) check(cudaEventRecord(chunk_ev_[1], stream_), "event");
  pending_ = {true, T, logit_rows, t_start, t_launched};
  pending_.greedy = greedy_only_;
}

bool CudaBackend::greedy_only(bool on) {
  if (pending_.active) throw Error("CUDA backend: greedy_only between start_chunk and finish_chunk (internal)");
  greedy_only_ = on && opt_.tuning.device_greedy;
  return greedy_only_ || !on;
}

void CudaBackend::launch_graph(CudaState& st, CudaState::Graph& g, int T, int logit_rows, bool hidden, const RowsRun* rows) {
  const int cap = rows ? rows->cap : st.cap;
  if (!g.exec || g.cap != cap || g.rows != logit_rows || g.gen != buffer_gen_ || g.T != T || g.hidden != hidden || g.greedy != greedy_only_) {
    const auto t_capture = std::chrono::steady_clock::now();
    if (g.exec) cudaGraphExecDestroy(g.exec), g.exec = nullptr;
    std::vector<int> journal;  // capturing runs deltanet_layer's counting: undone after
    for (const CudaState::Layer& L : st.layers) journal.push_back(L.journal);
    cudaGraph_t graph;
    check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "begin capture");
    try {
      run(st, T, logit_rows, hidden, rows);
    } catch (...) {  // leave the stream usable: end the broken capture
      cudaGraph_t broken = nullptr;
      cudaStreamEndCapture(stream_, &broken);
      if (broken) cudaGraphDestroy(broken);
      cudaGetLastError();
      throw;
    }
    for (std::size_t i = 0; i < journal.size(); ++i) st.layers[i].journal = journal[i];
    check(cudaStreamEndCapture(stream_, &graph), "end capture");
    std::size_t free0 = 0, free1 = 0, total_b = 0;
    cudaMemGetInfo(&free0, &total_b);
    check(cudaGraphInstantiate(&g.exec, graph, 0), "graph instantiate");
    cudaGraphDestroy(graph);
    // What instantiation took on the device, charged while the graph lives.
    cudaMemGetInfo(&free1, &total_b);
    if (st.budget && g.bytes) st.budget->credit(g.bytes), g.bytes = 0;
    if (st.budget && free1 < free0) st.budget->charge("a captured graph", free0 - free1), g.bytes = free0 - free1;
    g.cap = cap, g.rows = logit_rows, g.gen = buffer_gen_, g.T = T, g.hidden = hidden, g.greedy = greedy_only_;
    ++captures_, capture_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_capture).count();
  }
  const bool timing = graph_timing_ && (T == 1 || rows);
  if (timing && !graph_ev_[0]) cudaEventCreate(&graph_ev_[0]), cudaEventCreate(&graph_ev_[1]);
  if (timing) cudaEventRecord(graph_ev_[0], stream_);
  const auto t_call = std::chrono::steady_clock::now();
  check(cudaGraphLaunch(g.exec, stream_), "graph launch");
  if (timing && !rows) graph_call_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_call).count();
  if (timing) cudaEventRecord(graph_ev_[1], stream_);
}

void CudaBackend::finish_chunk(BackendState&, float* logits) {
  if (!pending_.active) throw Error("CUDA backend: finish_chunk without start_chunk (internal)");
  const Pending p = pending_;
  pending_.active = false;
  const int V = s_.vocab_size;
  tier_->stage_swaps();  // while the device runs the chunk
  // Each column range as soon as it is on the host.
  auto t_last = std::chrono::steady_clock::now();
  for (int i = 0; p.logit_rows && !p.greedy && i < logit_parts_; ++i) {
    check(cudaEventSynchronize(part_copied_[i]), "logits");
    t_last = std::chrono::steady_clock::now();
    if (!logits) continue;
    const auto [r0, r1] = logit_range(i);
    for (int t = 0; t < p.logit_rows; ++t)
      std::memcpy(logits + std::size_t(t) * V + r0, h_logits_ + std::size_t(t) * V + r0, (r1 - r0) * sizeof(float));
  }
  check(cudaStreamSynchronize(stream_), "forward");
  if (p.greedy) t_last = std::chrono::steady_clock::now();  // the ids came on the stream
  tier_->end_chunk();  // rethrows a host-side failure of the chunk
  if (float* h = std::exchange(hidden_dst_, nullptr))
    check(cudaMemcpy(h, hid_.get(), std::size_t(p.T) * s_.hidden_size * sizeof(float), cudaMemcpyDeviceToHost), "copy hidden rows");
  if (profile_) collect_profile();
  if (std::exchange(chunk_timing_, false)) {
    using ms_d = std::chrono::duration<double, std::milli>;
    float gpu = -1;
    if (cudaEventElapsedTime(&gpu, chunk_ev_[0], chunk_ev_[1]) != cudaSuccess) cudaGetLastError(), gpu = -1;
    std::fprintf(stderr,
                 "coli prefill chunk: %d tokens; host %.3f ms preparing (buffers, cache, embedding rows), %.3f ms launching, %.3f ms to the "
                 "logits, %.3f ms in all; device %.3f ms from the chunk's first work to its logits copied\n",
                 p.T, ms_d(chunk_prepared_ - p.t0).count(), ms_d(p.launched - chunk_prepared_).count(), ms_d(t_last - p.launched).count(),
                 ms_d(std::chrono::steady_clock::now() - p.t0).count(), gpu);
  }
  if (graph_timing_ && p.rows) {
    float ms = 0, device = 0;  // no graph under a budget
    if (opt_.graphs && !tiered_ && cudaEventElapsedTime(&ms, graph_ev_[0], graph_ev_[1]) != cudaSuccess) cudaGetLastError(), ms = 0;
    if (rows_ev_ && cudaEventElapsedTime(&device, rows_ev_, rows_end_ev_) != cudaSuccess) cudaGetLastError(), device = 0;
    rows_.add(p, ms, t_last, std::chrono::steady_clock::now());
    rows_.device_ms += device;
  }
  if (graph_timing_ && p.T == 1 && !p.rows && opt_.graphs) {
    float ms = 0;
    cudaEventElapsedTime(&ms, graph_ev_[0], graph_ev_[1]);
    const auto now = std::chrono::steady_clock::now();
    one_.add(p, ms, t_last, now);
    if (last_finish_.time_since_epoch().count()) gap_ms_ += std::chrono::duration<double, std::milli>(p.t0 - last_finish_).count();
    last_finish_ = now;
  }
}

void CudaBackend::StepTimes::add(const Pending& p, float graph, std::chrono::steady_clock::time_point last, std::chrono::steady_clock::time_point now) {
  using ms_d = std::chrono::duration<double, std::milli>;
  ++steps, rows += p.T, graph_ms += graph;
  step_ms += ms_d(now - p.t0).count(), launch_ms += ms_d(p.launched - p.t0).count(), tail_ms += ms_d(now - last).count();
}

bool CudaBackend::read_heat(std::vector<uint64_t>& counts) {
  if (pending_.active) throw Error("CUDA backend: read_heat between start_chunk and finish_chunk (internal)");
  static_assert(sizeof(unsigned long long) == sizeof(uint64_t));
  counts.resize(heat_.size());
  const std::size_t bytes = heat_.size() * sizeof(uint64_t);
  // On the compute stream: after every chunk launched so far, before the next.
  check(cudaMemcpyAsync(counts.data(), heat_.get(), bytes, cudaMemcpyDeviceToHost, stream_), "copy routing heat");
  check(cudaMemsetAsync(heat_.get(), 0, bytes, stream_), "cudaMemset");
  check(cudaStreamSynchronize(stream_), "routing heat");
  tier_->heat_cleared();
  tier_->take_heat(counts);  // and what the swaps' windows took off the device
  return true;
}

}  // namespace coli::cuda::detail
