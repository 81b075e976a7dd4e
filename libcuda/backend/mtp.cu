// CudaBackend's side of speculative decoding with the checkpoint's MTP
// module (engine/speculative.h): the MTP layer's pass over a few rows on
// the device in one call (mtp_chunk), the chunk's hidden rows the MTP reads
// (chunk_hidden), and the rewind of the Gated DeltaNet states to the last
// accepted token (mark_state / rewind_state: a journal of each layer's
// inputs since the mark, replayed over the kept tokens).
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "backend_impl.cuh"

namespace coli::cuda::detail {

// The MTP layer as Engine::mtp_forward's per-layer steps run it, on the
// device: x = fc([norm_e(embed(ids)) | norm_h(h)]), its attention at
// positions pos0.., its MoE block (without a tier on the device; under one
// the routed experts on the host: the rows and routing go there and the
// sum comes back while the device computes the shared expert), then its
// norm (g) and the lm_head of the last logit_rows rows.
bool CudaBackend::mtp_chunk(BackendState& state, const int* ids, const float* h, int T, int pos0, int logit_rows, float* logits, float* g) {
  need_mtp("the MTP layer");
  auto& st = static_cast<CudaState&>(state);
  begin_layer_step(T);
  prepare(st, T, pos0);
  const int H = s_.hidden_size, V = s_.vocab_size, L = s_.num_layers, E = s_.num_experts, K = s_.num_experts_per_tok;
  const float eps = s_.rms_norm_eps;
  const std::size_t row = std::size_t(H) * sizeof(float);
  {
    BudgetScope scope(budget_.get(), "the MTP layer's input");
    if (mtp_in_.size() < std::size_t(T) * 2 * H) mtp_in_.resize(std::size_t(T) * 2 * H);
    if (logits_.size() < std::size_t(logit_rows) * V) logits_.resize(std::size_t(logit_rows) * V), ++buffer_gen_;
  }
  h_io_[0] = pos0;
  std::memcpy(h_io_ + 1, ids, T * sizeof(int));
  stage_embedding(ids, T);
  check(cudaMemcpyAsync(io_.get(), h_io_, (T + 1) * sizeof(int), cudaMemcpyHostToDevice, stream_), "copy ids");
  embed_rows(embed_, embed_ids(), T, x_.get(), stream_);
  record_embedding_read();
  rms_norm(x_.get(), mtp_norm_embedding_, T, H, eps, s_.norm_plus_one, hn_.get(), stream_);
  check(cudaMemcpy2DAsync(mtp_in_.get(), 2 * row, hn_.get(), row, row, T, cudaMemcpyDeviceToDevice, stream_), "MTP input");
  upload(x_.get(), h, std::size_t(T) * H);
  rms_norm(x_.get(), mtp_norm_hidden_, T, H, eps, s_.norm_plus_one, hn_.get(), stream_);
  check(cudaMemcpy2DAsync(mtp_in_.get() + H, 2 * row, hn_.get(), row, row, T, cudaMemcpyDeviceToDevice, stream_), "MTP input");
  matmul(mtp_fc_, mtp_in_.get(), T, x_.get(), H, stream_, &qx_);
  // The decoder layer.
  const DevLayer& D = layers_[L];
  bool nibble = false, hn_q = mixer_quant(L, &nibble);
  rms_norm(x_.get(), D.input_norm, T, H, eps, s_.norm_plus_one, hn_.get(), stream_, hn_q ? &qx_ : nullptr, nibble);
  attention_layer(D, st.layers[L], T, hn_q, st.cap);
  if (!tiered_) {
    hn_q = moe_quant(L, &nibble);
    add_rms_norm(x_.get(), mix_.get(), nullptr, nullptr, D.post_norm, T, H, eps, hn_.get(), stream_, hn_q ? &qx_ : nullptr, nibble, s_.norm_plus_one);
    moe_layer(D, L, T, hn_q);  // no tier: no handoff, nothing to join
    const bool folded = T < kGroupedMinTokens && tier_->experts(L).shared_at_E, add_shared = !folded && s_.has_shared_expert();
    launch_norm(add_norm_args(x_.get(), routed_.get(), add_shared ? sh_.get() : nullptr, add_shared ? sgate_.get() : nullptr, mtp_norm_, H, eps,
                              hn_.get(), nullptr, false, s_.norm_plus_one),
                T, stream_);
  } else {
    add_rms_norm(x_.get(), mix_.get(), nullptr, nullptr, D.post_norm, T, H, eps, hn_.get(), stream_, nullptr, false, s_.norm_plus_one);
    router_logits(D, T, false);
    route_topk(rlogits_.get(), T, E, K, ridx_.get(), rw_.get(), stream_);
    std::vector<int> idx(std::size_t(T) * K);
    std::vector<float> w(idx.size()), hn(std::size_t(T) * H), out(hn.size());
    check(cudaMemcpyAsync(idx.data(), ridx_.get(), idx.size() * sizeof(int), cudaMemcpyDeviceToHost, stream_), "routing");
    check(cudaMemcpyAsync(w.data(), rw_.get(), w.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_), "routing");
    check(cudaMemcpyAsync(hn.data(), hn_.get(), hn.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_), "routing");
    check(cudaStreamSynchronize(stream_), "MTP routing");
    // The shared expert on the device while the host computes the routed ones.
    const int Is = s_.shared_expert_intermediate_size;
    if (s_.has_shared_expert()) {
      const MatmulOut outs[] = {{D.sh_gate, sg_.get(), Is}, {D.sh_up, su_.get(), Is}, {D.sh_gate_proj, sgate_.get(), 1}};
      matmul_many(outs, 3, hn_.get(), T, stream_, &qx_);
      shared_down(D, T);
    }
    std::vector<ExpertPair> pairs(idx.size());
    for (std::size_t i = 0; i < idx.size(); ++i) pairs[i] = {static_cast<int>(i / K), idx[i], w[i]};
    tier_->host().compute(L, pairs.data(), static_cast<int>(pairs.size()), hn.data(), T, out.data());
    upload(routed_.get(), out.data(), out.size());
    const bool add_shared = s_.has_shared_expert();
    launch_norm(add_norm_args(x_.get(), routed_.get(), add_shared ? sh_.get() : nullptr, add_shared ? sgate_.get() : nullptr, mtp_norm_, H, eps,
                              hn_.get(), nullptr, false, s_.norm_plus_one),
                T, stream_);
  }
  // hn_: the MTP's output rows after its norm; the logits of the last rows.
  if (logit_rows > 0) matmul(lm_head_, hn_.get() + std::size_t(T - logit_rows) * H, logit_rows, logits_.get(), V, stream_, &qx_);
  if (g) check(cudaMemcpyAsync(g, hn_.get(), std::size_t(T) * row, cudaMemcpyDeviceToHost, stream_), "MTP output rows");
  // The logits through the chunks' pinned buffer (a pageable copy of 1 MB
  // goes through the driver's staging at a fraction of the rate).
  const std::size_t nlog = std::size_t(logit_rows) * V;
  ensure_pinned_logits(nlog);
  if (nlog) check(cudaMemcpyAsync(h_logits_, logits_.get(), nlog * sizeof(float), cudaMemcpyDeviceToHost, stream_), "MTP logits");
  check(cudaStreamSynchronize(stream_), "MTP layer");
  if (nlog) std::memcpy(logits, h_logits_, nlog * sizeof(float));
  return true;
}

bool CudaBackend::chunk_hidden(float* hidden) {
  if (!mtp_ || !hidden) return false;  // its buffer is the MTP's reserve (VramSettings::mtp)
  hidden_next_ = hidden;
  return true;
}

// The mark: each Gated DeltaNet layer's conv window and state copied aside
// (device to device), its journal emptied. Attention caches need nothing:
// a later step at position p writes over p on.
void CudaBackend::mark_state(BackendState& state) {
  need_mtp("mark_state (speculative decoding)");
  auto& st = static_cast<CudaState&>(state);
  begin_layer_step(1);
  const int cd = s_.linear_conv_dim(), nv = s_.linear_num_value_heads;
  for (int l = 0; l < s_.num_layers; ++l) {
    if (s_.kind_of(l) != LayerKind::kLinearAttention) continue;
    CudaState::Layer& L = st.layers[l];
    if (!L.j_proj.get()) {
      BudgetScope scope(st.budget.get(), "the speculative rewind journal");
      L.mark_conv.resize(L.conv.size()), L.mark_S.resize(L.S.size());
      L.j_proj.resize(std::size_t(kRewindTokens) * cd), L.j_b.resize(std::size_t(kRewindTokens) * nv), L.j_a.resize(std::size_t(kRewindTokens) * nv);
    }
    check(cudaMemcpyAsync(L.mark_conv.get(), L.conv.get(), L.conv.size() * 4, cudaMemcpyDeviceToDevice, stream_), "mark");
    check(cudaMemcpyAsync(L.mark_S.get(), L.S.get(), L.S.size() * 4, cudaMemcpyDeviceToDevice, stream_), "mark");
    L.journal = 0;
  }
  st.keeping = true;
}

// The rewind: a layer that took more than `tokens` tokens since the mark
// gets its marked conv window and state back and runs its conv and
// recurrence again over the first `tokens` journaled inputs (the same
// kernels as a chunk of that many tokens: no projection, no expert).
void CudaBackend::rewind_state(BackendState& state, int tokens) {
  auto& st = static_cast<CudaState&>(state);
  if (!st.keeping) throw Error("CUDA backend: rewind_state without mark_state (internal)");
  st.keeping = false;
  const int cd = s_.linear_conv_dim(), nv = s_.linear_num_value_heads;
  if (tokens > 0) begin_layer_step(tokens);
  for (int l = 0; l < s_.num_layers; ++l) {
    if (s_.kind_of(l) != LayerKind::kLinearAttention) continue;
    CudaState::Layer& L = st.layers[l];
    const int fed = std::exchange(L.journal, -1);
    if (tokens < 0 || tokens > fed) throw Error("CUDA backend: rewind to " + std::to_string(tokens) + " of " + std::to_string(fed) + " tokens (internal)");
    if (tokens == fed) continue;
    check(cudaMemcpyAsync(L.conv.get(), L.mark_conv.get(), L.conv.size() * 4, cudaMemcpyDeviceToDevice, stream_), "rewind");
    check(cudaMemcpyAsync(L.S.get(), L.mark_S.get(), L.S.size() * 4, cudaMemcpyDeviceToDevice, stream_), "rewind");
    if (tokens == 0) continue;
    check(cudaMemcpyAsync(proj_.get(), L.j_proj.get(), std::size_t(tokens) * cd * 4, cudaMemcpyDeviceToDevice, stream_), "rewind");
    check(cudaMemcpyAsync(b_.get(), L.j_b.get(), std::size_t(tokens) * nv * 4, cudaMemcpyDeviceToDevice, stream_), "rewind");
    check(cudaMemcpyAsync(a_.get(), L.j_a.get(), std::size_t(tokens) * nv * 4, cudaMemcpyDeviceToDevice, stream_), "rewind");
    gdn_conv_recurrence(layers_[l], L, tokens, /*want_q=*/false);
  }
  check(cudaStreamSynchronize(stream_), "rewind");
}

}  // namespace coli::cuda::detail
