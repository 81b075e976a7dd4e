// CudaBackend's forward pass of a chunk on one GPU, top to bottom as in
// Engine::forward_chunk and the CPU backend, with every activation on the
// device: embedding, per layer the mixer (gated attention or Gated
// DeltaNet), the MoE block (router, shared expert, the routed experts the
// ExpertTier points at, the host's part joined before the combine), then
// the final norm and the lm_head in column ranges. Kernels live in
// kernels/; this file sequences their launches.
#include "backend_impl.cuh"

namespace coli::cuda::detail {

void CudaBackend::attention_layer(const DevLayer& L, CudaState::Layer& st, int T, bool hn_q, int cap, KvRows rows, const SegmentsRun* seg, int l) {
  const int H = s_.hidden_size, hd = s_.head_dim, nh = s_.num_heads, nkv = s_.num_kv_heads;
  const AttnForm form{s_.norm_plus_one, s_.attention_output_gate};
  const int qg_w = nh * hd * (form.gated ? 2 : 1);
  step("attn proj", [&] {
    const MatmulOut outs[] = {{L.q_proj, proj_.get(), qg_w}, {L.k_proj, k_.get(), nkv * hd}, {L.v_proj, v_.get(), nkv * hd}};
    matmul_many(outs, 3, hn_.get(), T, stream_, &qx_, hn_q);
  });
  // The attention kernel quantizes its output for an int8 o_proj (one
  // launch: not in a segments step, whose pieces come one after another).
  const bool out_q = !seg && takes_int8_x(L.o_proj) && hd % 32 == 0;
  // n tokens from token off on: their K / V stored, their attention over
  // cache kc / vc at positions *pos.. (or each row's own: rows).
  auto core = [&](float* kc, float* vc, int off, int n, const int* pos, int cap_n, KvRows kv) {
    const std::size_t kv_off = std::size_t(off) * nkv * hd;
    attn_store_kv(k_.get() + kv_off, v_.get() + kv_off, L.k_norm, n, pos, nkv, hd, s_.rotary_dim, inv_freq_.get(), s_.rms_norm_eps, kc, vc, stream_,
                  form, kv);
    const float* q = proj_.get() + std::size_t(off) * qg_w;
    float* out = heads_out_.get() + std::size_t(off) * nh * hd;
    if (split_kv_)
      attention_split(q, L.q_norm, kc, vc, n, pos, nh, nkv, hd, s_.rotary_dim, inv_freq_.get(), s_.rms_norm_eps, cap_n, part_.get(), out, stream_,
                      out_q ? &qx_ : nullptr, L.o_proj.kind == Kind::kI4, form, kv);
    else
      attention(q, L.q_norm, kc, vc, n, pos, nh, nkv, hd, s_.rotary_dim, inv_freq_.get(), s_.rms_norm_eps, scores_.get(), scores_cap_, out, stream_,
                out_q ? &qx_ : nullptr, L.o_proj.kind == Kind::kI4, form, kv);
  };
  step("attention", [&] {
    if (!seg) return core(st.k.get(), st.v.get(), 0, T, d_pos(), cap, rows);
    if (seg->rows) core(st.k.get(), st.v.get(), 0, seg->rows, d_pos(), cap, rows);
    for (const SegmentsRun::Segment& g : seg->segs) {
      CudaState::Layer& y = g.st->layers[l];
      core(y.k.get(), y.v.get(), g.off, g.len, g.pos, g.st->cap, {});
    }
  });
  step("attn proj", [&] { matmul(L.o_proj, heads_out_.get(), T, mix_.get(), H, stream_, &qx_, out_q); });
}

void CudaBackend::deltanet_layer(const DevLayer& L, CudaState::Layer& st, int T, bool hn_q, const RowsRun* rows, int l, const SegmentsRun* seg) {
  const int H = s_.hidden_size, cd = s_.linear_conv_dim(), nv = s_.linear_num_value_heads;
  step("gdn proj", [&] {
    const MatmulOut outs[] = {{L.in_qkv, proj_.get(), cd}, {L.in_z, z_.get(), s_.linear_value_dim()}, {L.in_b, b_.get(), nv}, {L.in_a, a_.get(), nv}};
    matmul_many(outs, 4, hn_.get(), T, stream_, &qx_, hn_q);
  });
  if (seg) {  // the rows on their sessions' windows and states, then each segment on its session's (no journal: step_segments)
    if (seg->rows) gdn_conv_recurrence(L, st, seg->rows, false, rows, l);
    for (const SegmentsRun::Segment& g : seg->segs) gdn_conv_recurrence(L, g.st->layers[l], g.len, false, nullptr, l, g.off);
    step("gdn proj", [&] { matmul(L.out_proj, heads_out_.get(), T, mix_.get(), H, stream_, &qx_, false); });
    return;
  }
  if (!rows && st.j_proj.get() && st.journal >= 0) {  // a speculative window: what rewind_state replays
    if (st.journal + T > kRewindTokens)
      throw Error("CUDA backend: more than " + std::to_string(kRewindTokens) + " tokens fed between mark_state and rewind_state");
    check(cudaMemcpyAsync(st.j_proj.get() + std::size_t(st.journal) * cd, proj_.get(), std::size_t(T) * cd * 4, cudaMemcpyDeviceToDevice, stream_), "journal");
    check(cudaMemcpyAsync(st.j_b.get() + std::size_t(st.journal) * nv, b_.get(), std::size_t(T) * nv * 4, cudaMemcpyDeviceToDevice, stream_), "journal");
    check(cudaMemcpyAsync(st.j_a.get() + std::size_t(st.journal) * nv, a_.get(), std::size_t(T) * nv * 4, cudaMemcpyDeviceToDevice, stream_), "journal");
    st.journal += T;
  }
  const bool out_q = gdn_conv_recurrence(L, st, T, takes_int8_x(L.out_proj), rows, l);
  step("gdn proj", [&] { matmul(L.out_proj, heads_out_.get(), T, mix_.get(), H, stream_, &qx_, out_q); });
}

bool CudaBackend::gdn_conv_recurrence(const DevLayer& L, CudaState::Layer& st, int T, bool want_q, const RowsRun* rows, int l, int off) {
  const int cd = s_.linear_conv_dim(), nv = s_.linear_num_value_heads, vd = s_.linear_value_dim();
  // Tokens [off, off + T) of the step's buffers (a segments step's piece; else off 0).
  float* const proj = proj_.get() + std::size_t(off) * cd;
  float* const conv_out = conv_out_.get() + std::size_t(off) * cd;
  const float* const z = z_.get() + std::size_t(off) * vd;
  const float* const b = b_.get() + std::size_t(off) * nv;
  const float* const a = a_.get() + std::size_t(off) * nv;
  float* const out = heads_out_.get() + std::size_t(off) * vd;
  if (rows) {  // each row's conv window and state its session's (rows_supported_: the one-token kernels take this model's heads)
    step("gdn conv+norm", [&] {
      gdn_conv_norm_step(proj, L.conv1d, nullptr, cd, s_.linear_conv_kernel, s_.linear_num_key_heads, s_.linear_key_head_dim, conv_out, stream_, T,
                         rows->first(l));
    });
    bool out_q = false;
    step("gdn recurrence", [&] {
      out_q = gdn_recurrence_rows(rows->second(l), conv_out, z, b, a, L.A_log, L.dt_bias, L.gdn_norm, T, s_.linear_num_key_heads, nv,
                                  s_.linear_key_head_dim, s_.linear_value_head_dim, cd, s_.rms_norm_eps, out, stream_, want_q ? &qx_ : nullptr,
                                  L.out_proj.kind == Kind::kI4);
    });
    return out_q;
  }
  step("gdn conv+norm", [&] {
    if (T == 1 && gdn_conv_norm_step(proj, L.conv1d, st.conv.get(), cd, s_.linear_conv_kernel, s_.linear_num_key_heads, s_.linear_key_head_dim,
                                     conv_out, stream_))
      return;
    gdn_conv(proj, L.conv1d, st.conv.get(), T, cd, s_.linear_conv_kernel, conv_out, stream_);
    gdn_qk_norm(conv_out, T, cd, s_.linear_num_key_heads, s_.linear_key_head_dim, stream_);
  });
  // The gated norm quantizes its output for an int8 out projection. Short
  // chunks (a speculative verify window, its replay) token by token: the
  // chunked WY form pays from tens of tokens, and token by token is the
  // decode steps' arithmetic.
  bool out_q = false;
  step("gdn recurrence", [&] {
    out_q = gdn_recurrence(st.S.get(), conv_out, z, b, a, L.A_log, L.dt_bias, L.gdn_norm, T, s_.linear_num_key_heads, nv, s_.linear_key_head_dim,
                           s_.linear_value_head_dim, cd, s_.rms_norm_eps, out, stream_, want_q ? &qx_ : nullptr, L.out_proj.kind == Kind::kI4,
                           chunked_gdn_ && T > kRewindTokens ? gdn_work_.get() : nullptr);
  });
  return out_q;
}

void CudaBackend::router_logits(const DevLayer& L, int T, bool hn_q) {
  if (!matmul_float_tiled(L.router, hn_.get(), T, rlogits_.get(), s_.num_experts, router_work_.get(), stream_))
    matmul(L.router, hn_.get(), T, rlogits_.get(), s_.num_experts, stream_, &qx_, hn_q);
}

void CudaBackend::shared_down(const DevLayer& L, int T) {
  const int H = s_.hidden_size, Is = static_cast<int>(L.sh_down.cols);  // the shared expert's, or a dense layer's width
  if (takes_int8_x(L.sh_down)) {  // SiLU * up fused into the quantization of the down projection's input
    quantize_x(sg_.get(), T, Is, L.sh_down.kind == Kind::kI4, qx_, stream_, su_.get());
    matmul(L.sh_down, sg_.get(), T, sh_.get(), H, stream_, &qx_, /*x_in_q=*/true);
  } else {
    silu_mul(sg_.get(), su_.get(), sg_.get(), std::size_t(T) * Is, stream_);
    matmul(L.sh_down, sg_.get(), T, sh_.get(), H, stream_, &qx_);
  }
}

bool CudaBackend::moe_layer(const DevLayer& L, int l, int T, bool hn_q, bool rows_step) {
  const int E = s_.num_experts, K = s_.num_experts_per_tok, Is = s_.shared_expert_intermediate_size;
  if (!s_.is_sparse(l)) {  // a dense layer: its MLP in the shared expert's place, no gate
    step("shared expert", [&] {
      const MatmulOut outs[] = {{L.sh_gate, sg_.get(), s_.intermediate_size}, {L.sh_up, su_.get(), s_.intermediate_size}};
      matmul_many(outs, 2, hn_.get(), T, stream_, &qx_, hn_q);
      shared_down(L, T);
    });
    return false;
  }
  const bool shared = s_.has_shared_expert();
  const DevExperts& X = tier_->experts(l);
  // A 1-row float shared-expert gate is computed by the routing kernel; in a
  // decode step the shared expert then runs as pair K of the routed ones.
  const bool gate_in_route = L.sh_gate_proj.rows == 1 && !takes_int8_x(L.sh_gate_proj);
  const bool fold = T < kGroupedMinTokens && X.shared_at_E;
  // Hybrid: the misses go to the host now and come back as a partial sum
  // just before the combine; the device meanwhile computes everything else
  // (a miss reads the zero expert: exactly 0). The tier says which table
  // the experts read and whether the layer hands off or uploads.
  const int grouped_min = rows_step ? opt_.tuning.grouped_min_rows : opt_.tuning.grouped_min_tokens;
  const ExpertTier::Step x = tier_->plan_layer(l, T, T < kGroupedMinTokens || T < grouped_min);
  const ExpertTable& table = x.table;
  // A decode step's router, routing and post: one launch (route.cuh).
  const DevMatrix* gate = gate_in_route ? &L.sh_gate_proj : nullptr;
  const bool fused = opt_.fuse_decode && router_route_supported(L.router, T, E, gate);
  unsigned long long* heat = l < s_.num_layers ? heat_.get() + std::size_t(l) * E : nullptr;  // the MTP layer's routing is not heat
  step("router", [&] {
    if (fused) {
      const RouteArgs r{rlogits_.get(), E, K, ridx_.get(), rw_.get(), gate ? *gate : DevMatrix{}, hn_.get(), gate ? sgate_.get() : nullptr, fold, heat};
      if (x.handoff) tier_->route_post(x, l, L.router, r, route_ticket_.get());
      else router_route_topk(L.router, r, route_ticket_.get(), stream_);
      return;
    }
    router_logits(L, T, hn_q);
    route_topk(rlogits_.get(), T, E, K, ridx_.get(), rw_.get(), stream_, gate, hn_.get(), sgate_.get(), fold, heat);
  });
  if (x.handoff && !fused) step("handoff", [&] { tier_->post(x, l, ridx_.get(), rw_.get(), fold ? K + 1 : K, T, hn_.get()); });
  // A one-token join waits inside the norm that follows (run()).
  const bool join_later = x.handoff && opt_.fuse_decode && T == 1;
  const DevMatrix& eg = X.table.gate;
  if (fold) {
    step("experts", [&] {
      moe_gate_up(table, hn_.get(), ridx_.get(), T, K + 1, act_.get(), stream_, &qx_, hn_q, x.lim);
      moe_down(table, act_.get(), ridx_.get(), rw_.get(), T, K + 1, routed_.get(), stream_, &qx_, x.lim);
    });
    if (x.handoff && !join_later) step("handoff", [&] { tier_->join(routed_.get(), T); });
    return join_later;  // a decode step: no uploads
  }
  // Shared expert: sigmoid(shared_gate . hn) * down(silu(gate . hn) * (up . hn));
  // the sigmoid gate is applied where the output joins the residual.
  if (shared)
    step("shared expert", [&] {
      const MatmulOut outs[] = {{L.sh_gate, sg_.get(), Is}, {L.sh_up, su_.get(), Is}, {L.sh_gate_proj, sgate_.get(), 1}};
      matmul_many(outs, gate_in_route ? 2 : 3, hn_.get(), T, stream_, &qx_, hn_q);
    });
  // Routed experts over all T * K pairs; hn is still in qx_ (the norm put
  // it there in the experts' order, or the shared expert's gate did).
  const bool hn_in_q = hn_q || (shared && takes_int8_x(L.sh_gate) && takes_int8_x(eg) && L.sh_gate.kind == eg.kind && L.sh_gate.cols == eg.cols);
  // A prompt chunk groups the pairs by expert (each expert's rows read once
  // per tile of its tokens); a decode step's pairs go straight.
  // An uploading layer's experts come in groups (the tier's staging units:
  // the whole layer, or expert ranges streaming through a ring), each
  // waited for just before its kernels; the shared expert above and the
  // earlier groups ran meanwhile.
  const bool grouped = T >= kGroupedMinTokens && (T >= grouped_min || x.upload) && moe_grouped_supported(table);
  if (x.upload && x.groups > 1 && !grouped) throw Error("CUDA backend: a staged layer in groups needs the grouped expert kernels (internal)");
  step("experts", [&] {
    if (grouped) {
      const MoeScratch sc{order_.get(), offsets_.get(), act_.get(), ey_.get()};
      moe_grouped_begin(table, hn_.get(), ridx_.get(), T, K, E, sc, stream_, qx_, hn_in_q);
      for (int g = 0; g < (x.upload ? x.groups : 1); ++g) {  // not uploading: one group, every expert
        tier_->wait_group(x, g);
        const auto [e0, e1] = tier_->group_range(x, g);
        moe_grouped_experts(table, hn_.get(), e0, e1, E, T, K, sc, stream_, qx_, g == 0);  // later groups quantize hn again: qx_ holds the last group's activations
        tier_->group_done(x, g);
      }
      moe_grouped_end(table, rw_.get(), T, K, sc, routed_.get(), stream_);
    } else {
      tier_->wait_group(x, 0);  // one unit: the whole layer
      moe_gate_up(table, hn_.get(), ridx_.get(), T, K, act_.get(), stream_, &qx_, hn_in_q, x.lim);
    }
  });
  if (shared) step("shared expert", [&] { shared_down(L, T); });
  if (!grouped) {
    step("experts", [&] { moe_down(table, act_.get(), ridx_.get(), rw_.get(), T, K, routed_.get(), stream_, &qx_, x.lim); });
    tier_->group_done(x, 0);
  }
  if (x.handoff && !join_later) step("handoff", [&] { tier_->join(routed_.get(), T); });
  return join_later;
}

void CudaBackend::run(CudaState& st, int T, int logit_rows, bool hidden, const RowsRun* rows, const SegmentsRun* seg) {
  const int H = s_.hidden_size;
  const float eps = s_.rms_norm_eps;
  tier_->start_pass(T);  // a prompt chunk's first uploaded layer, while the trunk starts
  step("embed", [&] {
    embed_rows(embed_, embed_ids(), T, x_.get(), stream_);
    record_embedding_read();
  });
  // Each residual add is fused with the norm that reads its result, and
  // the norm with the quantization of its output for the int8 matmuls.
  bool nibble = false, hn_q = mixer_quant(0, &nibble);
  step("norms+adds", [&] { rms_norm(x_.get(), layers_[0].input_norm, T, H, eps, s_.norm_plus_one, hn_.get(), stream_, hn_q ? &qx_ : nullptr, nibble); });
  for (int l = 0; l < s_.num_layers; ++l) {
    const DevLayer& L = layers_[l];
    if (L.kind == LayerKind::kFullAttention) attention_layer(L, st.layers[l], T, hn_q, rows ? rows->cap : st.cap, rows ? rows->kv(l) : KvRows{}, seg, l);
    else deltanet_layer(L, st.layers[l], T, hn_q, rows, l, seg);
    hn_q = moe_quant(l, &nibble);
    step("norms+adds", [&] {
      add_rms_norm(x_.get(), mix_.get(), nullptr, nullptr, L.post_norm, T, H, eps, hn_.get(), stream_, hn_q ? &qx_ : nullptr, nibble, s_.norm_plus_one);
    });
    const bool join_in_norm = moe_layer(L, l, T, hn_q, rows != nullptr || seg != nullptr);
    const bool last = l + 1 == s_.num_layers;
    hn_q = !last && mixer_quant(l + 1, &nibble);
    // routed_ holds the shared expert too (folded), or there is none (qwen3_moe); a dense layer's MLP is in sh_, ungated.
    const bool sparse = s_.is_sparse(l), folded = sparse && T < kGroupedMinTokens && tier_->experts(l).shared_at_E;
    const bool add_shared = !sparse || (!folded && s_.has_shared_expert());
    step("norms+adds", [&] {
      // x += routed (+ the host's part) + sigmoid(shared gate) * shared, then the next layer's input norm.
      const NormArgs a = add_norm_args(x_.get(), sparse ? routed_.get() : sh_.get(), sparse && add_shared ? sh_.get() : nullptr,
                                       sparse && add_shared ? sgate_.get() : nullptr,
                                       last ? nullptr : layers_[l + 1].input_norm, H, eps, last ? nullptr : hn_.get(), hn_q ? &qx_ : nullptr, nibble,
                                       s_.norm_plus_one);
      if (join_in_norm) tier_->join_norm(a);
      else launch_norm(a, T, stream_);
    });
  }
  if (hidden) step("lm_head", [&] { rms_norm(x_.get(), final_norm_, T, H, eps, s_.norm_plus_one, hid_.get(), stream_); });
  if (logit_rows == 0) return;
  if (seg)  // each segment's last token next to the rows, in the segments' order (a row never lies past the one it takes)
    for (std::size_t k = 0; k < seg->segs.size(); ++k) {
      const SegmentsRun::Segment& g = seg->segs[k];
      float* to = x_.get() + (std::size_t(seg->rows) + k) * H;
      const float* from = x_.get() + std::size_t(g.off + g.len - 1) * H;
      if (to != from) check(cudaMemcpyAsync(to, from, std::size_t(H) * sizeof(float), cudaMemcpyDeviceToDevice, stream_), "gather logit rows");
    }
  const float* last = x_.get() + (seg ? 0 : std::size_t(T - logit_rows) * H);
  hn_q = quantize_for({&lm_head_}, &nibble);
  step("lm_head", [&] {
    rms_norm(last, final_norm_, logit_rows, H, eps, s_.norm_plus_one, hn_.get(), stream_, hn_q ? &qx_ : nullptr, nibble);
    // By column ranges: each range's logits go to the host (copy stream)
    // while the next range is computed. Greedy ids copy no logits: one range.
    const int V = s_.vocab_size;
    for (int i = 0; i < (greedy_only_ ? 1 : logit_parts_); ++i) {
      const auto [r0, r1] = greedy_only_ ? std::pair<int, int>(0, V) : logit_range(i);
      DevMatrix part = lm_head_;
      part.data = lm_head_.data + static_cast<long long>(r0) * lm_head_.row_stride;
      part.scale_offset = lm_head_.scale_offset + static_cast<long long>(r0) * (lm_head_.scale_row_bytes - lm_head_.row_stride);
      part.rows = r1 - r0;
      matmul(part, hn_.get(), logit_rows, logits_.get() + r0, V, stream_, &qx_, hn_q);
      if (greedy_only_) break;
      // Inside a decode graph an external record node, which the copy
      // stream's wait (enqueue_logit_copies, after the launch) can see.
      cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
      check(cudaStreamIsCapturing(stream_, &cs), "capture status");
      check(cudaEventRecordWithFlags(part_ready_[i], stream_, cs == cudaStreamCaptureStatusActive ? cudaEventRecordExternal : cudaEventRecordDefault),
            "event");
    }
    if (greedy_only_) greedy_rows(logits_.get(), logit_rows, V, greedy_scratch_.get(), greedy_dev_.get(), stream_);
  });
}


}  // namespace coli::cuda::detail
