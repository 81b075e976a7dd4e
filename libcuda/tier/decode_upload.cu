// Decode misses over PCIe (CudaOptions::decode_upload_max): in a one-token
// step the handoff's host thread gives part of a layer's misses to this
// device part, which uploads their blobs from pinned host memory into its
// own slots and runs the routed-expert kernels on them on a stream of its
// own, while the CPU computes the other misses; the join adds both rows.
// PCIe is otherwise idle during decode, so the layer's host part shrinks.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "decode_upload.cuh"

namespace coli::cuda::detail {

ExpertTier::DecodeUpload::DecodeUpload(ExpertTier& t) : t_(t) {
  const ModelSpec& s = t.s_;
  const Model& model = t.model_;
  const int L = s.num_layers, E = s.num_experts, H = s.hidden_size, I = s.moe_intermediate_size;
  k_ = std::max(1, t.opt_.decode_upload_max);
  // Which experts' weights are in pinned (registered) host memory: only
  // those can be copied asynchronously at the pinned rate.
  pinned_.assign(static_cast<std::size_t>(L) * E, 0);
  for (int l = 0; l < L; ++l)
    for (int e = 0; e < (s.is_sparse(l) ? E : 0); ++e) pinned_[static_cast<std::size_t>(l) * E + e] = t.in_pinned_memory(model.layer(l).moe.experts[e]);
  BudgetScope scope(t.budget_, "the decode upload slots");
  stage_.resize(static_cast<std::size_t>(k_) * t.slot_bytes_);
  std::vector<const uint8_t*> g(k_), u(k_), d(k_);
  for (int i = 0; i < k_; ++i) {
    const uint8_t* base = stage_.get() + static_cast<std::size_t>(i) * t.slot_bytes_;
    g[i] = base, u[i] = base + t.slot_up_, d[i] = base + t.slot_down_;
  }
  gate_.resize(k_), up_.resize(k_), down_.resize(k_);
  check(cudaMemcpy(gate_.get(), g.data(), k_ * sizeof(void*), cudaMemcpyHostToDevice), "decode upload table");
  check(cudaMemcpy(up_.get(), u.data(), k_ * sizeof(void*), cudaMemcpyHostToDevice), "decode upload table");
  check(cudaMemcpy(down_.get(), d.data(), k_ * sizeof(void*), cudaMemcpyHostToDevice), "decode upload table");
  std::vector<int> iota(k_);
  std::iota(iota.begin(), iota.end(), 0);
  idx_.resize(k_);
  check(cudaMemcpy(idx_.get(), iota.data(), k_ * sizeof(int), cudaMemcpyHostToDevice), "decode upload index");
  w_.resize(k_), act_.resize(static_cast<std::size_t>(k_) * I), out_.resize(H);
  const std::size_t qn = static_cast<std::size_t>(std::max(H, k_ * I)) + 32;
  codes_.resize(qn), scale_.resize(qn / 32 + 1), sum_.resize(qn / 32 + 1);
  check(cudaMallocHost(&h_w_, k_ * sizeof(float)), "cudaMallocHost (decode upload weights)");
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
}

ExpertTier::DecodeUpload::~DecodeUpload() {
  if (stream_) cudaStreamSynchronize(stream_), cudaStreamDestroy(stream_);
  if (done_) cudaEventDestroy(done_);
  if (h_w_) cudaFreeHost(h_w_);
}

int ExpertTier::DecodeUpload::take(int layer, ExpertPair* misses, int n) {
  const int E = t_.s_.num_experts;
  const int want = std::min(k_, static_cast<int>(std::lround(n * std::clamp(t_.opt_.decode_upload_share, 0.0, 1.0))));
  if (want <= 0) return 0;
  // The first `want` misses with pinned weights go to the front, the rest
  // keep their order (by hand: a stateful predicate is copied by the
  // standard algorithms).
  thread_local std::vector<ExpertPair> rest;
  rest.clear();
  int g = 0;
  for (int i = 0; i < n; ++i) {
    const ExpertPair p = misses[i];
    if (g < want && pinned_[static_cast<std::size_t>(layer) * E + p.expert]) misses[g++] = p;
    else rest.push_back(p);
  }
  std::copy(rest.begin(), rest.end(), misses + g);
  if (g == 0) return 0;
  if (g > k_) throw Error("CUDA backend: decode upload took " + std::to_string(g) + " of " + std::to_string(k_) + " slots (internal)");
  check(cudaSetDevice(t_.opt_.device), "cudaSetDevice");  // the handoff's own thread
  for (int i = 0; i < g; ++i) {
    const ExpertWeights& x = t_.model_.layer(layer).moe.experts[misses[i].expert];
    uint8_t* dst = stage_.get() + static_cast<std::size_t>(i) * t_.slot_bytes_;
    check(cudaMemcpyAsync(dst, x.gate.data, x.gate.bytes(), cudaMemcpyHostToDevice, stream_), "decode upload");
    check(cudaMemcpyAsync(dst + t_.slot_up_, x.up.data, x.up.bytes(), cudaMemcpyHostToDevice, stream_), "decode upload");
    check(cudaMemcpyAsync(dst + t_.slot_down_, x.down.data, x.down.bytes(), cudaMemcpyHostToDevice, stream_), "decode upload");
    h_w_[i] = misses[i].weight;
  }
  check(cudaMemcpyAsync(w_.get(), h_w_, g * sizeof(float), cudaMemcpyHostToDevice, stream_), "decode upload weights");
  ExpertTable tab = t_.experts_[layer].table;
  tab.gate_ptrs = gate_.get(), tab.up_ptrs = up_.get(), tab.down_ptrs = down_.get();
  const QuantX q{codes_.get(), scale_.get(), sum_.get()};
  // The normed row is the post's: it stays until the layer's join.
  moe_gate_up(tab, t_.post_rows_, idx_.get(), 1, g, act_.get(), stream_, &q, false);
  moe_down(tab, act_.get(), idx_.get(), w_.get(), 1, g, out_.get(), stream_, &q);
  check(cudaEventRecord(done_, stream_), "event");
  return g;
}

void ExpertTier::DecodeUpload::wait() { check(cudaEventSynchronize(done_), "decode upload"); }

}  // namespace coli::cuda::detail
