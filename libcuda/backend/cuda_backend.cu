// CudaBackend's construction and buffers: the trunk's weights uploaded
// into one arena (or read in place from a device twin), the mirror's pages
// pinned through the process's HostRegistry, the ExpertTier built over the
// routed experts, the session state and the activations of a chunk. The
// forward pass is forward.cu, a chunk's launch and finish chunk.cu.
#include "backend_impl.cuh"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <type_traits>

#include "cuda_device.h"
#include "model/layer_tensors.h"

namespace coli::cuda {

namespace detail {

namespace {

Kind kind_of(QuantFormat f, const char* what) {
  switch (f) {
    case QuantFormat::F32: return Kind::kF32;
    case QuantFormat::BF16: return Kind::kBF16;
    case QuantFormat::F16: return Kind::kF16;
    case QuantFormat::I8: return Kind::kI8;
    case QuantFormat::FP8_E4M3_B128:
      throw Error(std::string("CUDA backend: ") + what + " is fp8 (a checkpoint format); convert the model with coli-convert first");
    default: return Kind::kI4;
  }
}

// Same format and shape: one kernel can read both through one DevMatrix.
bool same_layout(const DevMatrix& a, const DevMatrix& b) {
  return a.kind == b.kind && a.rows == b.rows && a.cols == b.cols && a.row_stride == b.row_stride && a.scale_offset == b.scale_offset &&
         a.scale_row_bytes == b.scale_row_bytes && a.group == b.group && a.asym == b.asym && a.f16_scales == b.f16_scales;
}

// Bytes a table entry of the model takes on the device, unpadded.
std::size_t bytes_of(const Model& model, const TensorDesc& t) {
  return t.form == TensorForm::kVector ? vector_of(model, t).size() * 4 : matrix_of(model, t).bytes();
}

// Where a layer's non-expert table entries live in DevLayer.
DevMatrix* dev_matrix(DevLayer& d, const TensorDesc& t) {
  switch (t.role) {
    case TensorRole::kQProj: return &d.q_proj;
    case TensorRole::kKProj: return &d.k_proj;
    case TensorRole::kVProj: return &d.v_proj;
    case TensorRole::kOProj: return &d.o_proj;
    case TensorRole::kInProjQkv: return &d.in_qkv;
    case TensorRole::kInProjZ: return &d.in_z;
    case TensorRole::kInProjB: return &d.in_b;
    case TensorRole::kInProjA: return &d.in_a;
    case TensorRole::kOutProj: return &d.out_proj;
    case TensorRole::kRouter: return &d.router;
    case TensorRole::kSharedGate: return &d.sh_gate;
    case TensorRole::kSharedUp: return &d.sh_up;
    case TensorRole::kSharedDown: return &d.sh_down;
    case TensorRole::kSharedExpertGate: return &d.sh_gate_proj;
    case TensorRole::kDenseGate: return &d.sh_gate;  // a dense layer's MLP where a sparse one keeps its shared expert
    case TensorRole::kDenseUp: return &d.sh_up;
    case TensorRole::kDenseDown: return &d.sh_down;
    default: throw Error("CUDA backend: no place for matrix '" + t.name + "' (internal)");
  }
}
const float** dev_vector(DevLayer& d, const TensorDesc& t) {
  switch (t.role) {
    case TensorRole::kInputNorm: return &d.input_norm;
    case TensorRole::kPostNorm: return &d.post_norm;
    case TensorRole::kQNorm: return &d.q_norm;
    case TensorRole::kKNorm: return &d.k_norm;
    case TensorRole::kConv1d: return &d.conv1d;
    case TensorRole::kDtBias: return &d.dt_bias;
    case TensorRole::kALog: return &d.A_log;
    case TensorRole::kLinearNorm: return &d.gdn_norm;
    default: throw Error("CUDA backend: no place for vector '" + t.name + "' (internal)");
  }
}

}  // namespace

DevMatrix describe(const Matrix& m, const uint8_t* data, const char* what) {
  const MatrixLayout l = layout_of(m.format, m.rows, m.cols);
  const FormatInfo& fi = format_info(m.format);
  DevMatrix d;
  d.kind = kind_of(m.format, what);
  d.data = data;
  d.rows = static_cast<int>(m.rows);
  d.cols = static_cast<int>(m.cols);
  d.row_stride = static_cast<int>(l.row_stride);
  d.scale_offset = static_cast<long long>(l.scale_offset);
  d.scale_row_bytes = static_cast<int>(l.scale_row_bytes);
  d.group = fi.group ? fi.group : d.cols;
  d.asym = fi.asym;
  d.f16_scales = d.kind == Kind::kI4 && fi.group;
  if (d.group % 32 == 0 && ((d.group / 32) & (d.group / 32 - 1)) == 0) d.group_shift = std::countr_zero(static_cast<unsigned>(d.group / 32));
  if (d.cols % 4) throw Error(std::string("CUDA backend: ") + what + " has " + std::to_string(d.cols) + " columns; the kernels need a multiple of 4");
  return d;
}

bool quantize_for(std::initializer_list<const DevMatrix*> readers, bool* nibble) {
  const DevMatrix* first = nullptr;
  for (const DevMatrix* m : readers) {
    if (!takes_int8_x(*m)) continue;
    if (!first) first = m;
    else if (m->kind != first->kind || m->cols != first->cols) return false;
  }
  if (first) *nibble = first->kind == Kind::kI4;
  return first != nullptr;
}


namespace {
// All cores but one: the issuing thread spins for the filled pieces.
int default_upload_threads() { return static_cast<int>(std::max(2u, std::thread::hardware_concurrency()) - 1); }
}  // namespace

CudaBackend::CudaBackend(const Model& model, const CudaOptions& opt) : s_(model.spec()), opt_(opt) {
  auto t_phase = std::chrono::steady_clock::now();
  auto phase = [&](const char* name) {
    const auto now = std::chrono::steady_clock::now();
    start_phases_.push_back({name, std::chrono::duration<double, std::milli>(now - t_phase).count()});
    t_phase = now;
  };
  split_kv_ = opt_.split_kv && attention_split_supported(s_.head_dim);
  chunked_gdn_ = opt_.chunked_gdn;
  // A rows step runs each row's Gated DeltaNet with the one-token kernels.
  rows_supported_ = opt_.batch_rows && (s_.num_attention_layers() == s_.num_layers ||
                                        gdn_rows_supported(s_.linear_key_head_dim, s_.linear_value_head_dim, s_.linear_conv_kernel));
  stream_min_rows_ = opt_.gemv_stream_min_rows;
  stream_rows_ = opt_.gemv_stream_rows;
  if (stream_rows_ < 0 || stream_rows_ > 2) throw UsageError("CUDA backend: gemv_stream_rows must be 0, 1 or 2");
  std::string why;
  if (device_count(&why) == 0) throw Error("CUDA backend: no usable device: " + why);
  check(cudaSetDevice(opt.device), "cudaSetDevice");
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  phase("context");
  tiered_ = vram_settings(opt_).tiered();
  graph_timing_ = opt_.profile == CudaProfile::kGraph;
  profile_ = opt_.profile == CudaProfile::kSteps;
  if (profile_ || opt_.serve_handoff_inline) opt_.graphs = false;  // neither can run inside a captured graph
  {
    // The mirror's pages, pinned through the process's registry (a second
    // backend over the same mirror takes a reference, not a second
    // registration) when an option copies experts from them during the run.
    const bool needed = tiered_ && (opt_.decode_upload_max > 0 || opt_.pcie_read_share > 0 || opt_.prefill_upload);
    const bool reg = opt_.register_hosts == CudaOptions::Register::kAlways || (opt_.register_hosts == CudaOptions::Register::kWhenNeeded && needed);
    auto take = [&](const void* p, std::size_t n, bool read_only) {
      HostRegistry::Lease lease = HostRegistry::instance().lease(p, n, read_only);
      for (auto piece : lease.pieces()) pinned_.push_back(piece);
      registration_.adopt(std::move(lease));
    };
    for (auto [p, n] : opt_.host_regions)
      if (reg) take(p, n, false);
    // A pin in progress elsewhere (CudaOptions::pending_pin) covers the
    // read-only regions: taken over between chunks (adopt_pending_pin).
    pin_pending_ = reg && opt_.pending_pin.valid() && !opt_.read_only_host_regions.empty();
    for (auto [p, n] : opt_.read_only_host_regions)
      if (reg && !pin_pending_) take(p, n, true);
  }
  phase("register");
  // A device twin (coli-pin start --gpu) on this device: mapped once.
  if (opt_.twin.host && opt_.twin.device == opt_.device) {
    cudaIpcMemHandle_t h;
    static_assert(sizeof h == sizeof opt_.twin.handle);
    std::memcpy(&h, opt_.twin.handle, sizeof h);
    void* p = nullptr;
    if (cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess) == cudaSuccess) {
      twin_dev_ = static_cast<const uint8_t*>(p);
      twin_host_ = static_cast<const uint8_t*>(opt_.twin.host), twin_bytes_ = opt_.twin.bytes;
    } else {
      cudaGetLastError();  // not mappable here (another process's device, no IPC): uploads as usual
    }
  }
  phase("map twin");
  budget_ = std::make_shared<DeviceBudget>(opt_.vram_budget);
  BudgetScope scope(budget_.get(), "the weights outside the routed experts");
  // One allocation for every weight (in a tiered run: every weight but the
  // routed experts, which get slots of their own), as the VRAM ledger
  // counts it; a matrix the twin holds takes no room here (put_matrix
  // reads it there).
  if (embedding_on_host(tiered_, model.embed().format)) host_embed_ = &model.embed();
  mtp_ = opt_.mtp && model.has_mtp();
  const std::size_t total = arena_bytes(s_, device_bytes([&](const TensorDesc& t) -> uint64_t {
    if (t.form != TensorForm::kVector && twin_at(matrix_of(model, t).data, matrix_of(model, t).bytes())) return 0;
    return bytes_of(model, t);
  }, host_embed_ != nullptr), tiered_, mtp_);
  std::size_t free_b = 0, total_b = 0;
  check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  // Under a budget every allocation is charged to it: the budget is what
  // must be free (the tools take it from the free memory less a margin).
  // Without one, the weights and 256 MiB for the rest.
  if (opt_.vram_budget > 0 && opt_.vram_budget > free_b)
    throw Error("CUDA backend: --vram-budget " + std::to_string(opt_.vram_budget >> 20) + " MiB is more than the device's " +
                std::to_string(free_b >> 20) + " MiB free");
  if (opt_.vram_budget == 0 && total + (256u << 20) > free_b)
    throw Error("CUDA backend: the weights need " + std::to_string(total >> 20) + " MiB, the device has " + std::to_string(free_b >> 20) +
                " MiB free");
  arena_.reserve(total);
  phase("allocate");
  // The weights' large copies are pipelined through pinned staging on
  // every core and complete before the constructor returns.
  StagedUploader uploader(default_upload_threads(), opt_.tuning.upload_piece_bytes);
  for (auto [p, n] : pinned_) uploader.add_pinned(p, n);  // copied from where they are
  if (twin_dev_) uploader.add_twin(twin_host_, twin_bytes_, twin_dev_);  // device to device (the tier's slots)
  arena_.set_uploader(&uploader, opt_.tuning.upload_min_bytes);
  if (host_embed_) {
    // Staged per chunk (stage_embedding): max_chunk rows in pinned memory
    // the kernel reads over PCIe, 4 KB a token at bf16.
    embed_ = describe(model.embed(), nullptr, "embed_tokens");
    emb_row_bytes_ = layout_of(model.embed().format, model.embed().rows, model.embed().cols).row_stride;
    check(cudaHostAlloc(reinterpret_cast<void**>(&h_emb_), emb_row_bytes_ * std::max(1, opt_.max_chunk), cudaHostAllocMapped), "cudaHostAlloc (embedding rows)");
    void* d = nullptr;
    check(cudaHostGetDevicePointer(&d, h_emb_, 0), "cudaHostGetDevicePointer");
    embed_.data = static_cast<const uint8_t*>(d);
    embed_.rows = std::max(1, opt_.max_chunk);
    check(cudaEventCreateWithFlags(&emb_read_, cudaEventDisableTiming), "cudaEventCreate");
  } else {
    embed_ = put_matrix(model.embed(), "embed_tokens");
  }
  lm_head_ = put_matrix(model.lm_head(), "lm_head");
  final_norm_ = put_floats(model.final_norm());
  if (mtp_) {  // the MTP module around its layer (CudaOptions::mtp)
    mtp_fc_ = put_matrix(model.mtp().fc, "mtp.fc.weight");
    mtp_norm_embedding_ = put_floats(model.mtp().norm_embedding);
    mtp_norm_hidden_ = put_floats(model.mtp().norm_hidden);
    mtp_norm_ = put_floats(model.mtp().norm);
  }
  {
    std::vector<float> f(std::max(1, s_.rotary_dim / 2));
    for (int i = 0; i < s_.rotary_dim / 2; ++i) f[i] = static_cast<float>(1.0 / std::pow(s_.rope_theta, double(2 * i) / s_.rotary_dim));
    inv_freq_.resize(f.size());
    check(cudaMemcpy(inv_freq_.get(), f.data(), f.size() * 4, cudaMemcpyHostToDevice), "upload rotary frequencies");
  }
  // The MTP decoder layer (CudaOptions::mtp) last, as layer num_layers;
  // under a tier its routed experts stay on the host (routed_experts).
  const int n_layers = mtp_ ? s_.num_layers_with_mtp() : s_.num_layers;
  layers_.resize(n_layers);
  std::vector<ExpertTier::LayerInput> experts(n_layers);
  for (int l = 0; l < n_layers; ++l) {
    DevLayer& d = layers_[l];
    d.kind = s_.kind_of(l);
    const int E = s_.num_experts;
    ExpertTier::LayerInput& x = experts[l];
    std::vector<const uint8_t*> gp(E), upp(E), dp(E);
    for (const TensorDesc& t : layer_tensors(s_, l)) {
      if (t.form == TensorForm::kVector) {
        *dev_vector(d, t) = put_floats(vector_of(model, t));
        continue;
      }
      // A tiered run's routed experts are only described here; the tier
      // places them in slots.
      const bool slotted = tiered_ && t.expert >= 0;
      const DevMatrix m = slotted ? describe(matrix_of(model, t), nullptr, t.name.c_str()) : put_matrix(matrix_of(model, t), t.name);
      if (t.expert < 0) {
        *dev_matrix(d, t) = m;
        continue;
      }
      // A routed expert's part: one format for every expert (expert 0's
      // describes them all), its address in the pointer table.
      const bool gate = t.role == TensorRole::kExpertGate, up = t.role == TensorRole::kExpertUp;
      DevMatrix& first = gate ? x.formats.gate : up ? x.formats.up : x.formats.down;
      if (t.expert == 0) first = m;
      else if (m.kind != first.kind) throw Error("CUDA backend: " + t.name + " differs in format from expert 0");
      (gate ? gp : up ? upp : dp)[t.expert] = m.data;
    }
    // The shared expert as entry E when it has the routed experts' layout
    // and a 1-row float gate: a decode step runs it as one more pair.
    const ExpertTable& et = x.formats;
    x.shared_at_E = E > 0 && E <= 512 && same_layout(d.sh_gate, et.gate) && same_layout(d.sh_up, et.up) && same_layout(d.sh_down, et.down) &&
                            takes_int8_x(et.gate) && takes_int8_x(et.down) && d.sh_gate_proj.rows == 1 && !takes_int8_x(d.sh_gate_proj);
    x.shared = {d.sh_gate.data, d.sh_up.data, d.sh_down.data};
    if (!tiered_) x.gate = std::move(gp), x.up = std::move(upp), x.down = std::move(dp);  // else the tier's slots
  }
  if (tiered_) ensure_buffers(std::max(1, opt_.max_chunk));  // charged before the slots take the rest
  ExpertTier::Setup ts;
  ts.model = &model, ts.opt = &opt_, ts.budget = budget_.get(), ts.stream = stream_, ts.pinned = &pinned_, ts.uploader = &uploader;
  ts.pins_pending = pin_pending_;
  tier_ = std::make_unique<ExpertTier>(ts, std::move(experts));
  phase("describe");
  const std::size_t staged = uploader.pending_bytes();
  uploader.flush(stream_);
  phase(("upload " + std::to_string(staged >> 20) + " MiB").c_str());
  if (twin_dev_) start_phases_.push_back({"twin read in place " + std::to_string(twin_shared_ >> 10) + " KiB", 0.0});
  arena_.set_uploader(nullptr, 0);
  // A position, max_chunk ids, and a segments step's first positions (step_segments).
  check(cudaMallocHost(&h_io_, sizeof(int) * (2 * std::max(1, opt_.max_chunk) + 1)), "cudaMallocHost");
  io_.resize(2 * std::max(1, opt_.max_chunk) + 1);
  check(cudaMallocHost(&h_greedy_, sizeof(int) * std::max(1, opt_.max_chunk)), "cudaMallocHost");
  check(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  for (int i = 0; i < kMaxLogitParts; ++i) {
    check(cudaEventCreateWithFlags(&part_ready_[i], cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventCreateWithFlags(&part_copied_[i], cudaEventDisableTiming), "cudaEventCreate");
  }
  heat_.resize(std::size_t(s_.num_layers) * std::max(1, s_.num_experts));
  check(cudaMemsetAsync(heat_.get(), 0, heat_.size() * sizeof(unsigned long long), stream_), "cudaMemset");
  tier_->attach_heat(heat_.get());  // the swaps' windows read it
  route_ticket_.resize(1);
  check(cudaMemsetAsync(route_ticket_.get(), 0, sizeof(unsigned), stream_), "cudaMemset");
  const int parts = std::clamp(opt_.tuning.logit_parts, 1, kMaxLogitParts);
  logit_parts_ = s_.vocab_size >= 4096 * parts ? parts : 1;
  phase("rest");
}

int CudaBackend::context_tokens() const { return vram_settings(opt_).context_tokens(); }

TierStats CudaBackend::tier_stats() const {
  TierStats t;
  tier_->fill_stats(t);
  t.vram_budget = opt_.vram_budget;
  t.vram_peak = budget_->peak();
  for (auto [p, n] : pinned_) t.pinned_host_bytes += n;
  t.pin_pending = pin_pending_, t.pin_wait_ms = pin_wait_ms_, t.pin_switch_tokens = pin_switch_tokens_;
  return t;
}

// The background pin of CudaOptions::pending_pin, taken over between two
// chunks: when it is ready, or before a prompt chunk that would upload
// (it waits). The registry holds the ranges already: the leases here are
// references. Then the tier turns on what pinned memory allows (or, when
// the driver refused, turns the prompt uploads off) and the decode graph
// is captured again (its one-token tables change).
void CudaBackend::adopt_pending_pin(int T) {
  if (!pin_pending_) return;
  using namespace std::chrono;
  if (opt_.pending_pin.wait_for(seconds(0)) != std::future_status::ready) {
    if (T < CudaOptions::kPinWaitTokens || !tier_->wants_pins(T)) return;
    const auto t0 = steady_clock::now();
    opt_.pending_pin.wait();
    pin_wait_ms_ += duration<double, std::milli>(steady_clock::now() - t0).count();
  }
  bool pinned = false;
  try {
    pinned = opt_.pending_pin.get().bytes() > 0;
  } catch (...) {  // the pinning thread failed: as refused
  }
  if (pinned)
    for (auto [p, n] : opt_.read_only_host_regions) {
      HostRegistry::Lease lease = HostRegistry::instance().lease(p, n, true);
      for (auto piece : lease.pieces()) pinned_.push_back(piece);
      registration_.adopt(std::move(lease));
    }
  opt_.pending_pin = {};  // the backend's leases hold the registration from now on
  pin_pending_ = false;
  pin_switch_tokens_ = prof_tokens_;
  tier_->adopt_pins();
  ++buffer_gen_;
}

void CudaBackend::collect_profile() {
  for (auto& [name, ev] : prof_pending_) {
    float ms = 0;
    cudaEventElapsedTime(&ms, ev.first, ev.second);
    cudaEventDestroy(ev.first), cudaEventDestroy(ev.second);
    auto it = std::find_if(prof_.begin(), prof_.end(), [&](const auto& p) { return p.first == name; });
    if (it == prof_.end()) prof_.push_back({name, {}}), it = prof_.end() - 1;
    it->second.ms += ms, ++it->second.calls;
  }
  prof_pending_.clear();
}

CudaBackend::~CudaBackend() {
  const double n1 = one_.steps ? 1000.0 / one_.steps : 0, nr = rows_.steps ? 1000.0 / rows_.steps : 0;  // us per step
  if (graph_timing_ && one_.steps)
    std::fprintf(stderr, "coli cuda graph timing: %ld decode steps, %.1f us per graph replay on the device, %.1f us per step on the host\n",
                 one_.steps, n1 * one_.graph_ms, n1 * one_.step_ms);
  if (graph_timing_ && one_.steps)
    std::fprintf(stderr, "coli cuda graph timing: host per step: %.1f us to launch (%.1f us before copying the ids, %.1f us in their cudaMemcpyAsync, %.1f us in the tier's begin_chunk, %.1f us in cudaGraphLaunch), %.1f us after the last logits range arrived, %.1f us between steps\n",
                 n1 * one_.launch_ms, n1 * pre_copy_ms_, n1 * copy_call_ms_, n1 * begin_ms_, n1 * graph_call_ms_, n1 * one_.tail_ms, n1 * gap_ms_);
  if (graph_timing_ && rows_.steps)
    std::fprintf(stderr,
                 "coli cuda graph timing: %ld rows steps, %.1f rows a step, %.1f us per graph replay on the device, %.1f us from the step's first "
                 "copy to its last logits on the host, %.1f us per step on the host (%.1f us to launch, %.1f us after the last logits range arrived)\n",
                 rows_.steps, double(rows_.rows) / rows_.steps, nr * rows_.graph_ms, nr * rows_.device_ms, nr * rows_.step_ms, nr * rows_.launch_ms,
                 nr * rows_.tail_ms);
  if (rows_ev_) cudaEventDestroy(rows_ev_), cudaEventDestroy(rows_end_ev_);
  if (graph_timing_ && captures_)
    std::fprintf(stderr, "coli cuda graph timing: %ld graphs captured, %.2f ms each on the host (capture and instantiation)\n", captures_,
                 capture_ms_ / captures_);
  for (cudaEvent_t e : graph_ev_)
    if (e) cudaEventDestroy(e);
  for (cudaEvent_t e : chunk_ev_)
    if (e) cudaEventDestroy(e);
  if (profile_ && !prof_.empty()) {
    double total = 0;
    for (const auto& p : prof_) total += p.second.ms;
    std::fprintf(stderr, "coli cuda profile: %ld tokens, %.3f ms of kernels\n%-14s %10s %8s %7s\n", prof_tokens_, total, "step", "ms", "calls", "share");
    for (const auto& [name, row] : prof_)
      std::fprintf(stderr, "%-14s %10.3f %8ld %6.1f%%\n", name.c_str(), row.ms, row.calls, 100.0 * row.ms / total);
  }
  tier_.reset();  // waits for the stream: a pending chunk's joins need the handoff's thread
  registration_.release();
  if (twin_dev_) {
    cudaIpcCloseMemHandle(const_cast<uint8_t*>(twin_dev_));
  }
  if (h_io_) cudaFreeHost(h_io_);
  if (h_greedy_) cudaFreeHost(h_greedy_);
  if (h_rows_) cudaFreeHost(h_rows_);
  for (CudaState::Graph& g : rows_graphs_) {
    if (g.exec) cudaGraphExecDestroy(g.exec);
    if (g.bytes) budget_->credit(g.bytes);
  }
  if (h_emb_) cudaFreeHost(h_emb_);
  if (emb_read_) cudaEventDestroy(emb_read_);
  for (int i = 0; i < kMaxLogitParts; ++i) {
    if (part_ready_[i]) cudaEventDestroy(part_ready_[i]);
    if (part_copied_[i]) cudaEventDestroy(part_copied_[i]);
  }
  if (copy_stream_) cudaStreamDestroy(copy_stream_);
  if (h_logits_) cudaFreeHost(h_logits_);
  if (stream_) cudaStreamDestroy(stream_);
}

std::unique_ptr<BackendState> CudaBackend::new_state() const {
  auto st = std::make_unique<CudaState>();
  st->budget = budget_;
  BudgetScope scope(budget_.get(), "the Gated DeltaNet state");
  st->layers.resize(layers_.size());  // the MTP layer's KV cache last (CudaOptions::mtp)
  for (int l = 0; l < s_.num_layers; ++l) {
    if (s_.layer_kinds[l] != LayerKind::kLinearAttention) continue;
    auto& L = st->layers[l];
    L.conv.resize(static_cast<std::size_t>(s_.linear_conv_kernel - 1) * s_.linear_conv_dim());
    L.S.resize(static_cast<std::size_t>(s_.linear_num_value_heads) * s_.linear_key_head_dim * s_.linear_value_head_dim);
    check(cudaMemset(L.conv.get(), 0, L.conv.size() * 4), "cudaMemset");
    check(cudaMemset(L.S.get(), 0, L.S.size() * 4), "cudaMemset");
  }
  return st;
}

void CudaBackend::ensure_buffers(int T) {
  if (T <= buf_T_) return;
  // Growing moves the buffers, and every captured graph is captured again
  // (buffer_gen_): on the whole model, where they grow with the chunks
  // that come, at least double (up to max_chunk, as the ledger counts) and
  // at least one row a session, so that rows steps of one row more, or a
  // prompt a few tokens longer, do not recapture every graph each time.
  if (!tiered_) T = std::max(T, std::min(std::max(2 * buf_T_, opt_.sequences), opt_.max_chunk));
  BudgetScope scope(budget_.get(), "the activations of a chunk (--prefill-chunk / -ub)");
  // Every buffer's size from the VRAM ledger, which the planner reads too.
  const ChunkBuffers n = chunk_buffers(s_, T, chunked_gdn_);
  x_.resize(n.x), hn_.resize(n.hn), mix_.resize(n.mix), sh_.resize(n.sh), routed_.resize(n.routed);
  sgate_.resize(n.sgate);
  // The mixer's and the MoE block's buffers, carved in the ledger's order.
  scratch_.resize(0);  // the old one goes before the new one is charged
  scratch_.resize(n.shared_bytes());
  std::size_t at = 0;
  auto carve = [&](auto& view, std::size_t count) {
    using T = std::remove_pointer_t<decltype(view.get())>;
    static_assert(sizeof(T) == 4, "the ledger counts 4-byte elements");
    view.set(count ? reinterpret_cast<T*>(scratch_.get() + at) : nullptr, count);
    at += device_padded(count * 4);
  };
  carve(proj_, n.proj), carve(z_, n.z), carve(b_, n.b), carve(a_, n.a), carve(conv_out_, n.conv_out), carve(heads_out_, n.heads_out);
  carve(k_, n.k), carve(v_, n.v), carve(gdn_work_, n.gdn_work);
  at = 0;
  carve(rlogits_, n.rlogits), carve(router_work_, n.router_work), carve(ridx_, n.ridx), carve(rw_, n.rw), carve(sg_, n.sg), carve(su_, n.su);
  carve(act_, n.act), carve(order_, n.order), carve(offsets_, n.offsets), carve(ey_, n.ey);
  qx_codes_.resize(n.qx_codes), qx_scale_.resize(n.qx_scale), qx_sum_.resize(n.qx_sum);
  qx_ = QuantX{qx_codes_.get(), qx_scale_.get(), qx_sum_.get()};

  buf_T_ = T;
  ++buffer_gen_;
}

void CudaBackend::ensure_cap(CudaState& st, int needed) {
  if (needed <= st.cap) return;
  // Under a budget the cache is made for the context size at once: its
  // share was left aside when the tier was filled.
  const int cap = tiered_ ? std::max(needed + (st.cap ? 1024 : 0), context_tokens()) : std::max({needed, 2 * st.cap, 256});
  BudgetScope scope(st.budget.get(), "the KV cache (-c/--ctx-size)");
  const std::size_t kv = std::size_t(s_.num_kv_heads) * s_.head_dim;
  // A budget's first cache of a session comes from the sessions gone
  // (KvSpare), and goes back there: the context's size, as the ledger made room for.
  const bool spare = tiered_ && st.cap == 0 && cap == context_tokens();
  if (spare) {
    std::lock_guard<std::mutex> lock(kv_spare_->mu);
    if (kv_spare_->n != std::size_t(cap) * kv) kv_spare_->arrays.clear(), kv_spare_->n = std::size_t(cap) * kv;
  }
  st.kv_spare = spare ? kv_spare_ : nullptr;  // a grown cache is its own
  auto take = [&] {
    if (spare) {
      std::lock_guard<std::mutex> lock(kv_spare_->mu);
      if (!kv_spare_->arrays.empty()) {
        DeviceArray<float> a = std::move(kv_spare_->arrays.back());
        kv_spare_->arrays.pop_back();
        return a;
      }
    }
    return DeviceArray<float>(cap * kv);
  };
  for (int l = 0; l < static_cast<int>(st.layers.size()); ++l) {
    if (s_.kind_of(l) != LayerKind::kFullAttention) continue;
    auto& L = st.layers[l];
    DeviceArray<float> k = take(), v = take();
    if (st.cap) {
      check(cudaMemcpy(k.get(), L.k.get(), st.cap * kv * 4, cudaMemcpyDeviceToDevice), "grow KV cache");
      check(cudaMemcpy(v.get(), L.v.get(), st.cap * kv * 4, cudaMemcpyDeviceToDevice), "grow KV cache");
    }
    L.k = std::move(k), L.v = std::move(v);
  }
  st.cap = cap;
}

bool CudaBackend::mixer_quant(int l, bool* nibble) const {
  const DevLayer& L = layers_[l];
  if (L.kind == LayerKind::kFullAttention) return quantize_for({&L.q_proj, &L.k_proj, &L.v_proj}, nibble);
  return quantize_for({&L.in_qkv, &L.in_z, &L.in_b, &L.in_a}, nibble);
}

bool CudaBackend::moe_quant(int l, bool* nibble) const {
  const DevLayer& L = layers_[l];
  return quantize_for({&L.router, &L.sh_gate, &L.sh_up, &L.sh_gate_proj, &tier_->experts(l).table.gate, &tier_->experts(l).table.up}, nibble);
}

}  // namespace detail

std::unique_ptr<Backend> make_cuda_backend(const Model& model, const CudaOptions& opt) { return std::make_unique<detail::CudaBackend>(model, opt); }

std::vector<int> device_greedy_ids(const float* logits, int rows, int V) {
  std::string why;
  if (device_count(&why) == 0) throw Error("CUDA: no usable device: " + why);
  DeviceArray<float> d(std::size_t(rows) * V);
  DeviceArray<int> ids(rows);
  DeviceArray<uint8_t> scratch(greedy_scratch_bytes(rows));
  check(cudaMemcpy(d.get(), logits, std::size_t(rows) * V * sizeof(float), cudaMemcpyHostToDevice), "copy logits");
  pdl_wanted() = false;
  greedy_rows(d.get(), rows, V, scratch.get(), ids.get(), nullptr);
  std::vector<int> out(rows);
  check(cudaMemcpy(out.data(), ids.get(), rows * sizeof(int), cudaMemcpyDeviceToHost), "copy greedy ids");
  return out;
}

}  // namespace coli::cuda
