// The CUDA backend's per-layer Backend steps (engine/backend.h) on host
// arrays: each uploads its input, runs the kernels a chunk's forward pass
// runs for that step (cuda_backend.cu: run, attention_layer, deltanet_layer,
// moe_layer) and downloads its output. The engine takes this path when it
// must observe the routing (heat counting, coli-bench's expert bytes); a
// whole chunk on the device (forward_chunk) is the fast path.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend_impl.cuh"

namespace coli::cuda::detail {

void CudaBackend::begin_layer_step(int T) {
  if (pending_.active) {  // a chunk started and never finished: drain it
    BackendState none;
    hidden_dst_ = nullptr;
    finish_chunk(none, nullptr);
  }
  if (T > opt_.max_chunk) throw Error("CUDA backend: a step of " + std::to_string(T) + " tokens exceeds max_chunk " + std::to_string(opt_.max_chunk));
  ensure_buffers(T);
  pdl_wanted() = false;
  gemv_stream_min_rows() = stream_min_rows_, gemv_stream_rows() = stream_rows_;
  launch_tuning() = opt_.tuning;
}

void CudaBackend::upload(float* dst, const float* src, std::size_t n) {
  check(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyHostToDevice, stream_), "upload activations");
}

template <typename V>
void CudaBackend::download(V* dst, const V* src, std::size_t n) {
  check(cudaMemcpyAsync(dst, src, n * sizeof(V), cudaMemcpyDeviceToHost, stream_), "download activations");
  check(cudaStreamSynchronize(stream_), "layer step");
}

void CudaBackend::embed(const int* ids, int T, float* x) {
  begin_layer_step(T);
  h_io_[0] = 0;
  std::memcpy(h_io_ + 1, ids, T * sizeof(int));
  check(cudaMemcpyAsync(io_.get(), h_io_, (T + 1) * sizeof(int), cudaMemcpyHostToDevice, stream_), "copy ids");
  stage_embedding(ids, T);
  embed_rows(embed_, embed_ids(), T, x_.get(), stream_);
  record_embedding_read();
  download(x, x_.get(), std::size_t(T) * s_.hidden_size);
}

void CudaBackend::trunk_step(int layer, BackendState& state, int pos0, int T, float* x) {
  auto& st = static_cast<CudaState&>(state);
  begin_layer_step(T);
  prepare(st, T, pos0);
  const int H = s_.hidden_size;
  const DevLayer& L = layers_[layer];
  h_io_[0] = pos0;
  check(cudaMemcpyAsync(io_.get(), h_io_, sizeof(int), cudaMemcpyHostToDevice, stream_), "copy position");
  upload(x_.get(), x, std::size_t(T) * H);
  bool nibble = false;
  const bool hn_q = mixer_quant(layer, &nibble);
  rms_norm(x_.get(), L.input_norm, T, H, s_.rms_norm_eps, s_.norm_plus_one, hn_.get(), stream_, hn_q ? &qx_ : nullptr, nibble);
  if (L.kind == LayerKind::kFullAttention) attention_layer(L, st.layers[layer], T, hn_q, st.cap);
  else deltanet_layer(L, st.layers[layer], T, hn_q);
  add_rms_norm(x_.get(), mix_.get(), nullptr, nullptr, nullptr, T, H, s_.rms_norm_eps, nullptr, stream_);  // x += mixer output
  download(x, x_.get(), std::size_t(T) * H);
}

void CudaBackend::ffn_norm(int layer, int T, const float* x, float* hn) {
  begin_layer_step(T);
  const int H = s_.hidden_size;
  upload(x_.get(), x, std::size_t(T) * H);
  rms_norm(x_.get(), layers_[layer].post_norm, T, H, s_.rms_norm_eps, s_.norm_plus_one, hn_.get(), stream_);
  download(hn, hn_.get(), std::size_t(T) * H);
}

void CudaBackend::route(int layer, int T, const float* hn, int* idx, float* w) {
  begin_layer_step(T);
  const int E = s_.num_experts, K = s_.num_experts_per_tok;
  const DevLayer& L = layers_[layer];
  upload(hn_.get(), hn, std::size_t(T) * s_.hidden_size);
  router_logits(L, T, /*hn_q=*/false);
  route_topk(rlogits_.get(), T, E, K, ridx_.get(), rw_.get(), stream_);
  download(idx, ridx_.get(), std::size_t(T) * K);
  download(w, rw_.get(), std::size_t(T) * K);
}

void CudaBackend::shared_expert(int layer, int T, const float* hn, float* out) {
  begin_layer_step(T);
  const int H = s_.hidden_size, Is = s_.shared_expert_intermediate_size;
  const DevLayer& L = layers_[layer];
  upload(hn_.get(), hn, std::size_t(T) * H);
  const MatmulOut outs[] = {{L.sh_gate, sg_.get(), Is}, {L.sh_up, su_.get(), Is}, {L.sh_gate_proj, sgate_.get(), 1}};
  matmul_many(outs, 3, hn_.get(), T, stream_, &qx_);
  shared_down(L, T);
  std::vector<float> gate(T);
  download(out, sh_.get(), std::size_t(T) * H);
  download(gate.data(), sgate_.get(), T);
  for (int t = 0; t < T; ++t) {
    const float g = 1.0f / (1.0f + std::exp(-gate[t]));
    for (int i = 0; i < H; ++i) out[std::size_t(t) * H + i] *= g;
  }
}

// Each pair runs as its own token with one expert (K = 1): its row of hn
// gathered, its expert's SwiGLU times its weight on the device, in batches
// of at most max_chunk pairs; the host adds each pair's row into its
// token's, in pair order.
void CudaBackend::routed_experts(int layer, const ExpertPair* pairs, int n, const float* hn, float* out) {
  const int H = s_.hidden_size, E = s_.num_experts;
  if (layer >= s_.num_layers) need_mtp("routed experts");
  if (layer >= s_.num_layers && tiered_) {  // under a tier the MTP layer's experts are the host's
    int rows = 0;
    for (int p = 0; p < n; ++p) {
      if (pairs[p].expert < 0 || pairs[p].expert >= E) throw Error("CUDA backend: routed_experts: expert " + std::to_string(pairs[p].expert) + " out of range");
      rows = std::max(rows, pairs[p].token + 1);
    }
    tier_->host().compute(layer, pairs, n, hn, rows, out);
    return;
  }
  const ExpertTable& table = tier_->experts(layer).table;
  int rows = 0;
  for (int p = 0; p < n; ++p) {
    if (pairs[p].expert < 0 || pairs[p].expert >= E) throw Error("CUDA backend: routed_experts: expert " + std::to_string(pairs[p].expert) + " out of range");
    rows = std::max(rows, pairs[p].token + 1);
  }
  std::fill(out, out + std::size_t(rows) * H, 0.0f);
  std::vector<float> x, y, w;
  std::vector<int> idx;
  for (int p0 = 0; p0 < n; p0 += opt_.max_chunk) {
    const int m = std::min(n - p0, opt_.max_chunk);
    begin_layer_step(m);
    x.resize(std::size_t(m) * H), y.resize(x.size()), w.resize(m), idx.resize(m);
    for (int i = 0; i < m; ++i) {
      const ExpertPair& pr = pairs[p0 + i];
      std::memcpy(x.data() + std::size_t(i) * H, hn + std::size_t(pr.token) * H, H * sizeof(float));
      idx[i] = pr.expert, w[i] = pr.weight;
    }
    upload(hn_.get(), x.data(), x.size());
    upload(rw_.get(), w.data(), m);
    check(cudaMemcpyAsync(ridx_.get(), idx.data(), m * sizeof(int), cudaMemcpyHostToDevice, stream_), "upload pairs");
    bool grouped = false;
    if (m >= kGroupedMinTokens)
      grouped = moe_grouped(table, hn_.get(), ridx_.get(), rw_.get(), m, 1, E, MoeScratch{order_.get(), offsets_.get(), act_.get(), ey_.get()},
                            routed_.get(), stream_, qx_, false);
    if (!grouped) {
      moe_gate_up(table, hn_.get(), ridx_.get(), m, 1, act_.get(), stream_, &qx_);
      moe_down(table, act_.get(), ridx_.get(), rw_.get(), m, 1, routed_.get(), stream_, &qx_);
    }
    download(y.data(), routed_.get(), y.size());
    for (int i = 0; i < m; ++i) {
      float* o = out + std::size_t(pairs[p0 + i].token) * H;
      const float* yi = y.data() + std::size_t(i) * H;
      for (int h = 0; h < H; ++h) o[h] += yi[h];
    }
  }
  // Hybrid: the device gave 0 for experts outside the tier; the host adds them.
  if (tier_->hands_off(layer)) {
    std::vector<ExpertPair> misses;
    for (int p = 0; p < n; ++p)
      if (!tier_->is_resident(layer, pairs[p].expert)) misses.push_back(pairs[p]);
    if (!misses.empty()) {
      std::vector<float> part(std::size_t(rows) * H);
      tier_->host().compute(layer, misses.data(), static_cast<int>(misses.size()), hn, rows, part.data());
      for (std::size_t i = 0; i < part.size(); ++i) out[i] += part[i];
    }
  }
}

void CudaBackend::logits(int T, const float* x, float* out) {
  begin_layer_step(T);
  const int H = s_.hidden_size, V = s_.vocab_size;
  if (logits_.size() < std::size_t(T) * V) logits_.resize(std::size_t(T) * V), ++buffer_gen_;
  upload(x_.get(), x, std::size_t(T) * H);
  bool nibble = false;
  const bool hn_q = quantize_for({&lm_head_}, &nibble);
  rms_norm(x_.get(), final_norm_, T, H, s_.rms_norm_eps, s_.norm_plus_one, hn_.get(), stream_, hn_q ? &qx_ : nullptr, nibble);
  matmul(lm_head_, hn_.get(), T, logits_.get(), V, stream_, &qx_, hn_q);
  download(out, logits_.get(), std::size_t(T) * V);
}

void CudaBackend::need_mtp(const char* step) const {
  if (!mtp_)
    throw Error(std::string("CUDA backend: ") + step + ": the MTP module is not on the device (" +
                (s_.mtp_layers > 0 ? "CudaOptions::mtp is off" : "the model has none") + ")");
}

void CudaBackend::output_norm(int T, const float* x, float* h, bool mtp) {
  if (mtp) need_mtp("the MTP norm");
  begin_layer_step(T);
  const int H = s_.hidden_size;
  upload(x_.get(), x, std::size_t(T) * H);
  rms_norm(x_.get(), mtp ? mtp_norm_ : final_norm_, T, H, s_.rms_norm_eps, s_.norm_plus_one, hn_.get(), stream_);
  download(h, hn_.get(), std::size_t(T) * H);
}

void CudaBackend::lm_head(int T, const float* h, float* out) {
  begin_layer_step(T);
  const int H = s_.hidden_size, V = s_.vocab_size;
  if (logits_.size() < std::size_t(T) * V) {
    BudgetScope scope(budget_.get(), "the logits");
    logits_.resize(std::size_t(T) * V), ++buffer_gen_;
  }
  upload(hn_.get(), h, std::size_t(T) * H);
  matmul(lm_head_, hn_.get(), T, logits_.get(), V, stream_, &qx_);
  download(out, logits_.get(), std::size_t(T) * V);
}

// x = fc([norm_embedding(e) | norm_hidden(h)]): the two norms side by side
// in mtp_in_ [T, 2H], then one matmul.
void CudaBackend::mtp_input(int T, const float* e, const float* h, float* x) {
  need_mtp("the MTP input");
  begin_layer_step(T);
  const int H = s_.hidden_size;
  const std::size_t row = std::size_t(H) * sizeof(float);
  if (mtp_in_.size() < std::size_t(T) * 2 * H) {
    BudgetScope scope(budget_.get(), "the MTP layer's input");
    mtp_in_.resize(std::size_t(T) * 2 * H);
  }
  upload(x_.get(), e, std::size_t(T) * H);
  rms_norm(x_.get(), mtp_norm_embedding_, T, H, s_.rms_norm_eps, s_.norm_plus_one, hn_.get(), stream_);
  check(cudaMemcpy2DAsync(mtp_in_.get(), 2 * row, hn_.get(), row, row, T, cudaMemcpyDeviceToDevice, stream_), "MTP input");
  upload(x_.get(), h, std::size_t(T) * H);
  rms_norm(x_.get(), mtp_norm_hidden_, T, H, s_.rms_norm_eps, s_.norm_plus_one, hn_.get(), stream_);
  check(cudaMemcpy2DAsync(mtp_in_.get() + H, 2 * row, hn_.get(), row, row, T, cudaMemcpyDeviceToDevice, stream_), "MTP input");
  matmul(mtp_fc_, mtp_in_.get(), T, x_.get(), H, stream_, &qx_);
  download(x, x_.get(), std::size_t(T) * H);
}

}  // namespace coli::cuda::detail
