// CudaBackend: the forward pass of a chunk on one GPU, top to bottom as in
// Engine::forward_chunk and the CPU backend, with every activation on the
// device. Kernels live in the other .cu files; this file uploads weights,
// owns the buffers and sequences the launches.
#include "backend_impl.cuh"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

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

// The device pointer tables of a layer's experts: entry e -> its gate / up
// / down bytes, then entry E: the shared expert, when it folds in.
// one_token: the one-token steps' table instead (DevExperts::one_table),
// whose entry E + 1 is the zero expert (zero: its gate, up and down; entry
// E too when the shared expert does not fold in); the main table is set
// too whenever it is, so one_table defaults to it.
void set_expert_pointers(DevLayer& d, std::vector<const uint8_t*> gp, std::vector<const uint8_t*> upp, std::vector<const uint8_t*> dp,
                         bool one_token = false, const std::array<const uint8_t*, 3>& zero = {}) {
  if (d.experts.shared_at_E) gp.push_back(d.sh_gate.data), upp.push_back(d.sh_up.data), dp.push_back(d.sh_down.data);
  else if (one_token) gp.push_back(zero[0]), upp.push_back(zero[1]), dp.push_back(zero[2]);
  if (one_token) gp.push_back(zero[0]), upp.push_back(zero[1]), dp.push_back(zero[2]);  // entry E + 1
  const std::size_t np = gp.size();
  DevExperts& x = d.experts;
  auto& g = one_token ? x.one_gate_ptrs : x.gate_ptrs;
  auto& u = one_token ? x.one_up_ptrs : x.up_ptrs;
  auto& w = one_token ? x.one_down_ptrs : x.down_ptrs;
  g.resize(np), u.resize(np), w.resize(np);
  check(cudaMemcpy(g.get(), gp.data(), np * sizeof(void*), cudaMemcpyHostToDevice), "expert table");
  check(cudaMemcpy(u.get(), upp.data(), np * sizeof(void*), cudaMemcpyHostToDevice), "expert table");
  check(cudaMemcpy(w.get(), dp.data(), np * sizeof(void*), cudaMemcpyHostToDevice), "expert table");
  ExpertTable& t = one_token ? x.one_table : x.table;
  t = x.table;  // format and shape
  t.gate_ptrs = g.get(), t.up_ptrs = u.get(), t.down_ptrs = w.get();
  if (!one_token && !x.one_gate_ptrs.get()) x.one_table = t;
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
  stream_min_rows_ = opt_.gemv_stream_min_rows;
  stream_rows_ = opt_.gemv_stream_rows;
  if (stream_rows_ < 0 || stream_rows_ > 2) throw UsageError("CUDA backend: gemv_stream_rows must be 0, 1 or 2");
  std::string why;
  if (device_count(&why) == 0) throw Error("CUDA backend: no usable device: " + why);
  check(cudaSetDevice(opt.device), "cudaSetDevice");
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  phase("context");
  tiered_ = opt_.vram_budget > 0 || opt_.expert_slots >= 0;
  graph_timing_ = opt_.profile == CudaProfile::kGraph;
  profile_ = opt_.profile == CudaProfile::kSteps;
  if (profile_) opt_.graphs = false;
  {
    const auto t0 = std::chrono::steady_clock::now();
    // One registration per region where the driver allows (512 GiB per call):
    // a copy whose source spans two registrations is refused.
    constexpr std::size_t kPiece = std::size_t(256) << 30;
    const bool needed = tiered_ && (opt_.decode_upload_max > 0 || opt_.pcie_read_share > 0 || opt_.prefill_upload);
    const bool reg = opt_.register_hosts == CudaOptions::Register::kAlways || (opt_.register_hosts == CudaOptions::Register::kWhenNeeded && needed);
    for (auto [p, n] : opt_.host_regions)
      for (std::size_t o = 0; reg && o < n; o += kPiece) {
        void* piece = const_cast<uint8_t*>(static_cast<const uint8_t*>(p)) + o;
        const std::size_t len = std::min(kPiece, n - o);
        const cudaError_t r = cudaHostRegister(piece, len, cudaHostRegisterDefault);
        if (r == cudaSuccess) registered_.push_back({piece, len}), pinned_ranges_.push_back({piece, len});
        else if (r == cudaErrorHostMemoryAlreadyRegistered) cudaGetLastError(), pinned_ranges_.push_back({piece, len});  // by another backend here: not ours to unregister
        else cudaGetLastError();  // not registrable: the pageable path
      }
    register_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
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
  // routed experts, which get slots of their own).
  std::size_t total = 0;
  // A matrix the twin holds takes no room here (put_matrix reads it there).
  auto arena_bytes = [&](const TensorDesc& t) -> std::size_t {
    if (t.form != TensorForm::kVector && twin_at(matrix_of(model, t).data, matrix_of(model, t).bytes())) return 0;
    return WeightArena::padded(bytes_of(model, t));
  };
  for (const TensorDesc& t : model_tensors(s_, true)) total += arena_bytes(t);  // lm_head even when tied
  for (int l = 0; l < s_.num_layers; ++l)
    for (const TensorDesc& t : layer_tensors(s_, l))
      if (!tiered_ || t.expert < 0) total += arena_bytes(t);
  std::size_t free_b = 0, total_b = 0;
  check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  if (total + (256u << 20) > free_b)
    throw Error("CUDA backend: the weights need " + std::to_string(total >> 20) + " MiB, the device has " + std::to_string(free_b >> 20) +
                " MiB free");
  arena_.reserve(total);
  phase("allocate");
  // The weights' large copies are pipelined through pinned staging on
  // every core and complete before the constructor returns.
  StagedUploader uploader(default_upload_threads(), opt_.tuning.upload_piece_bytes);
  for (auto [p, n] : pinned_ranges_) uploader.add_pinned(p, n);  // copied from where they are
  if (twin_dev_) uploader.add_twin(twin_host_, twin_bytes_, twin_dev_);  // device to device (the tier's slots)
  arena_.set_uploader(&uploader, opt_.tuning.upload_min_bytes);
  uploader_ = &uploader;
  embed_ = put_matrix(model.embed(), "embed_tokens");
  lm_head_ = put_matrix(model.lm_head(), "lm_head");
  final_norm_ = put_floats(model.final_norm());
  {
    std::vector<float> f(std::max(1, s_.rotary_dim / 2));
    for (int i = 0; i < s_.rotary_dim / 2; ++i) f[i] = static_cast<float>(1.0 / std::pow(s_.rope_theta, double(2 * i) / s_.rotary_dim));
    inv_freq_.resize(f.size());
    check(cudaMemcpy(inv_freq_.get(), f.data(), f.size() * 4, cudaMemcpyHostToDevice), "upload rotary frequencies");
  }
  layers_.resize(s_.num_layers);
  for (int l = 0; l < s_.num_layers; ++l) {
    DevLayer& d = layers_[l];
    d.kind = model.layer(l).kind;
    const int E = s_.num_experts;
    std::vector<const uint8_t*> gp(E), upp(E), dp(E);
    for (const TensorDesc& t : layer_tensors(s_, l)) {
      if (t.form == TensorForm::kVector) {
        *dev_vector(d, t) = put_floats(vector_of(model, t));
        continue;
      }
      // A tiered run's routed experts are only described here; build_tier
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
      DevMatrix& first = gate ? d.experts.table.gate : up ? d.experts.table.up : d.experts.table.down;
      if (t.expert == 0) first = m;
      else if (m.kind != first.kind) throw Error("CUDA backend: " + t.name + " differs in format from expert 0");
      (gate ? gp : up ? upp : dp)[t.expert] = m.data;
    }
    // The shared expert as entry E when it has the routed experts' layout
    // and a 1-row float gate: a decode step runs it as one more pair.
    const ExpertTable& et = d.experts.table;
    d.experts.shared_at_E = E > 0 && E <= 512 && same_layout(d.sh_gate, et.gate) && same_layout(d.sh_up, et.up) && same_layout(d.sh_down, et.down) &&
                            takes_int8_x(et.gate) && takes_int8_x(et.down) && d.sh_gate_proj.rows == 1 && !takes_int8_x(d.sh_gate_proj);
    if (!tiered_) set_expert_pointers(d, std::move(gp), std::move(upp), std::move(dp));  // else build_tier's
  }
  if (tiered_) build_tier(model);
  phase("describe");
  const std::size_t staged = uploader.pending_bytes();
  uploader.flush(stream_);
  phase(("upload " + std::to_string(staged >> 20) + " MiB").c_str());
  if (twin_dev_) start_phases_.push_back({"twin read in place " + std::to_string(twin_shared_ >> 10) + " KiB", 0.0});
  arena_.set_uploader(nullptr, 0);
  uploader_ = nullptr;
  check(cudaMallocHost(&h_io_, sizeof(int) * (std::max(1, opt_.max_chunk) + 1)), "cudaMallocHost");
  io_.resize(std::max(1, opt_.max_chunk) + 1);
  check(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  for (int i = 0; i < kMaxLogitParts; ++i) {
    check(cudaEventCreateWithFlags(&part_ready_[i], cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventCreateWithFlags(&part_copied_[i], cudaEventDisableTiming), "cudaEventCreate");
  }
  heat_.resize(std::size_t(s_.num_layers) * std::max(1, s_.num_experts));
  check(cudaMemsetAsync(heat_.get(), 0, heat_.size() * sizeof(unsigned long long), stream_), "cudaMemset");
  const int parts = std::clamp(opt_.tuning.logit_parts, 1, kMaxLogitParts);
  logit_parts_ = s_.vocab_size >= 4096 * parts ? parts : 1;
  phase("rest");
}

int CudaBackend::context_tokens() const { return opt_.n_ctx > 0 ? opt_.n_ctx : 4096; }

std::size_t CudaBackend::runtime_reserve() const {
  const std::size_t n_ctx = context_tokens(), T = std::max(1, opt_.max_chunk);
  const std::size_t kv = std::size_t(s_.num_kv_heads) * s_.head_dim;
  std::size_t bytes = std::size_t(s_.num_attention_layers()) * n_ctx * kv * 2 * sizeof(float);  // K and V
  const std::size_t linear = s_.num_layers - s_.num_attention_layers();
  bytes += linear * (std::size_t(s_.linear_conv_kernel - 1) * s_.linear_conv_dim() +
                     std::size_t(s_.linear_num_value_heads) * s_.linear_key_head_dim * s_.linear_value_head_dim) * sizeof(float);
  if (s_.num_attention_layers() > 0) {  // attention scratch at the context size (prepare())
    int kps = 0;
    std::size_t scratch = 0;
    for (std::size_t t : {std::size_t(1), T})
      scratch = split_kv_ ? std::max(scratch, t * s_.num_heads * (s_.head_dim + 2) * attention_splits(int(t), int(n_ctx), &kps))
                          : std::max(scratch, t * s_.num_heads * n_ctx);
    bytes += scratch * sizeof(float);
  }
  bytes += std::size_t(s_.vocab_size) * sizeof(float);  // the last row's logits
  return bytes + (8u << 20);  // decode graphs (measured 0.7 MiB), allocation rounding
}

// The device address of host bytes in a registered range: the same
// address where the device can use host pointers (host_ptrs_, asked once
// by pcie_read_set), else the driver's.
const uint8_t* CudaBackend::mapped(const uint8_t* host) const {
  if (host_ptrs_) return host;
  void* d = nullptr;
  check(cudaHostGetDevicePointer(&d, const_cast<uint8_t*>(host), 0), "cudaHostGetDevicePointer (PCIe reads)");
  return static_cast<const uint8_t*>(d);
}

// Which experts outside the tier one-token steps may read over PCIe in
// place (CudaOptions::pcie_read_share): those whose three matrices lie in a
// registered range; each step's split post picks among a layer's misses.
// Empty: none (off, or nothing registered).
std::vector<uint8_t> CudaBackend::pcie_read_set(const Model& model) {
  const int L = s_.num_layers, E = s_.num_experts;
  pcie_read_ = 0;
  if (!(opt_.pcie_read_share > 0) || plan_.all() || pinned_ranges_.empty()) return {};
  if (opt_.decode_upload_max > 0) throw Error("CUDA backend: pcie_read_share and decode_upload_max are two ways to the same misses: choose one");
  std::vector<uint8_t> set(static_cast<std::size_t>(L) * E, 0);
  for (int l = 0; l < L; ++l)
    for (int e = 0; e < E; ++e) {
      const std::size_t i = static_cast<std::size_t>(l) * E + e;
      if (!plan_.resident[i] && pcie_readable(model.layer(l).moe.experts[e])) set[i] = 1, ++pcie_read_;
    }
  if (!pcie_read_) return {};
  int same = 0;
  host_ptrs_ = cudaDeviceGetAttribute(&same, cudaDevAttrCanUseHostPointerForRegisteredMem, opt_.device) == cudaSuccess && same;
  cudaGetLastError();
  return set;
}

bool CudaBackend::pcie_readable(const ExpertWeights& x) const {
  auto pinned = [&](const Matrix& m) { return within_any(pinned_ranges_, m.data, m.bytes()); };
  return pinned(x.gate) && pinned(x.up) && pinned(x.down);
}

void CudaBackend::build_tier(const Model& model) {
  const int L = s_.num_layers, E = s_.num_experts;
  ensure_buffers(std::max(1, opt_.max_chunk));  // charged before the slots take the rest
  // A slot holds one expert's gate, up and down, each 256-byte aligned.
  const MoeWeights& m0 = model.layer(0).moe;
  const std::size_t pg = WeightArena::padded(m0.experts[0].gate.bytes()), pu = WeightArena::padded(m0.experts[0].up.bytes()),
                    pd = WeightArena::padded(m0.experts[0].down.bytes());
  const std::size_t slot = pg + pu + pd;
  expert_bytes_ = m0.experts[0].gate.bytes() + m0.experts[0].up.bytes() + m0.experts[0].down.bytes();
  long long slots = opt_.expert_slots;
  const uint64_t avail = budget_->available();
  // What the decode upload's slots and buffers will take (DecodeUpload).
  const std::size_t up_k = std::max(0, opt_.decode_upload_max);
  // And the one-token tables of the PCIe reads (pcie_read_share).
  const uint64_t one_tables = opt_.pcie_read_share > 0 ? uint64_t(L) * ((E + 2) * 3 * sizeof(void*) + E + 3 * 256) : 0;
  const uint64_t reserve = runtime_reserve() + one_tables +
                           (up_k ? up_k * slot + (up_k * s_.moe_intermediate_size + s_.hidden_size + up_k) * 4 * 3 + (2u << 20) : 0);
  // What the run will charge later (KV cache, state, scratch, logits) and
  // the zero expert must fit now, or the run would fail part-way.
  if (avail != UINT64_MAX && avail < reserve + slot)
    throw Error("--vram-budget " + format_bytes(budget_->limit()) + " exceeded: the KV cache for " + std::to_string(context_tokens()) +
                " tokens, the recurrent state and the scratch need " + format_bytes(reserve + slot) + " with " + format_bytes(budget_->in_use()) +
                " already in use by the trunk and the activations");
  if (slots < 0) slots = avail == UINT64_MAX ? static_cast<long long>(L) * E : static_cast<long long>((avail - reserve) / slot) - 1;
  if (!opt_.heat.empty() && opt_.heat.size() != std::size_t(L) * E)
    throw Error("CUDA backend: the heat has " + std::to_string(opt_.heat.size()) + " counts, the model " + std::to_string(L * E) + " experts");
  plan_ = plan_tier(L, E, slots, opt_.heat.empty() ? nullptr : &opt_.heat);
  slot_bytes_ = slot;
  // Hybrid prefill's two staging areas come out of what the slots would take.
  bool prefill = opt_.prefill_upload && !plan_.all();
  if (prefill && avail != UINT64_MAX) {
    const TierPlan full = plan_;
    const long long full_slots = slots;
    // The tables: three pointer arrays of E + 1 per layer (charged as allocated).
    const uint64_t tables = uint64_t(L) * (E + 1) * sizeof(void*) * 3;
    auto fits = [&] { return reserve + slot * (plan_.count + 1) + prefill_stage_bytes(plan_) + tables <= avail; };
    while (!fits() && opt_.expert_slots < 0 && plan_.count > 0) {
      slots = std::max(0LL, slots - std::max(1LL, slots / 64));
      plan_ = plan_tier(L, E, slots, opt_.heat.empty() ? nullptr : &opt_.heat);
    }
    prefill = fits();
    if (!prefill) plan_ = full, slots = full_slots;  // prompts hand their misses to the host as decode steps do
  }
  if (!plan_.all() && !opt_.expert_host)
    throw Error("CUDA backend: the expert tier holds " + std::to_string(plan_.count) + " of " + std::to_string(L * E) +
                " experts and no host computes the others (CudaOptions::expert_host)");
  {
    BudgetScope scope(budget_.get(), "the expert slots");
    slots_.resize(slot * (plan_.count + (plan_.all() ? 0 : 1)));
  }
  uint8_t* next = slots_.get();
  const uint8_t* zero = nullptr;
  slot_bytes_ = slot, slot_up_ = pg, slot_down_ = pg + pu;
  slot_of_.assign(static_cast<std::size_t>(L) * E, -1);
  if (!plan_.all()) {  // slot 0: the zero expert every miss reads on the device
    check(cudaMemset(next, 0, slot), "zero expert");
    zero = next, next += slot;
  }
  resident_.resize(L);
  layer_full_.assign(L, 0);
  const std::vector<uint8_t> pcie = pcie_read_set(model);
  if (!pcie.empty()) one_resident_.resize(L);
  for (int l = 0; l < L; ++l) {
    DevLayer& d = layers_[l];
    const MoeWeights& moe = model.layer(l).moe;
    std::vector<const uint8_t*> gp(E), upp(E), dp(E);
    std::vector<uint8_t> flags(E);
    for (int e = 0; e < E; ++e) {
      flags[e] = plan_.is_resident(l, e);
      if (!flags[e]) {
        gp[e] = zero, upp[e] = zero + pg, dp[e] = zero + pg + pu;
        continue;
      }
      const ExpertWeights& x = moe.experts[e];
      uploader_->add(next, x.gate.data, x.gate.bytes());
      uploader_->add(next + pg, x.up.data, x.up.bytes());
      uploader_->add(next + pg + pu, x.down.data, x.down.bytes());
      gp[e] = next, upp[e] = next + pg, dp[e] = next + pg + pu;
      slot_of_[static_cast<std::size_t>(l) * E + e] = (next - slots_.get()) / static_cast<std::ptrdiff_t>(slot);
      next += slot;
    }
    layer_full_[l] = plan_.resident_in_layer(l) == E;
    full_layers_ += layer_full_[l];
    {
      BudgetScope scope(budget_.get(), "the expert tables");
      resident_[l].resize(E);
      check(cudaMemcpy(resident_[l].get(), flags.data(), E, cudaMemcpyHostToDevice), "expert tier flags");
      if (!pcie.empty()) {  // the one-token table: the tier's, the PCIe experts' entries pointing at their host bytes (flag 2)
        std::vector<const uint8_t*> og = gp, ou = upp, od = dp;
        std::vector<uint8_t> of = flags;
        for (int e = 0; e < E; ++e) {
          if (!pcie[static_cast<std::size_t>(l) * E + e]) continue;
          const ExpertWeights& x = moe.experts[e];
          og[e] = mapped(x.gate.data), ou[e] = mapped(x.up.data), od[e] = mapped(x.down.data), of[e] = 2;
        }
        one_resident_[l].resize(E);
        check(cudaMemcpy(one_resident_[l].get(), of.data(), E, cudaMemcpyHostToDevice), "expert tier flags");
        set_expert_pointers(d, std::move(og), std::move(ou), std::move(od), true, {zero, zero + pg, zero + pg + pu});
      }
      set_expert_pointers(d, std::move(gp), std::move(upp), std::move(dp));
    }
  }
  if (!plan_.all()) {
    handoff_ = std::make_unique<ExpertHandoff>(*opt_.expert_host, std::max(1, opt_.max_chunk), s_.num_experts_per_tok, s_.hidden_size, E);
    if (opt_.decode_upload_max > 0) {
      decode_upload_ = std::make_unique<DecodeUpload>(*this, model);
      if (decode_upload_->any_pinned()) handoff_->set_device_part(decode_upload_.get(), decode_upload_->out());
      else decode_upload_.reset();  // no expert in pinned memory (no registered mirror): nothing to upload from
    }
  }
  model_ = &model;
  if (prefill) init_prefill_upload(0);
  if (!plan_.all() && opt_.swap && plan_.count > 0) init_swaps(model);  // after: its policy depends on the prefill uploads
}

TierStats CudaBackend::tier_stats() const {
  TierStats t;
  t.tiered = tiered_;
  t.experts = static_cast<long long>(s_.num_layers) * s_.num_experts;
  t.resident = tiered_ ? plan_.count : t.experts;
  t.pairs = full_layer_pairs_ + upload_pairs_;
  if (handoff_) {
    const ExpertHandoff::Stats h = handoff_->stats();
    t.pairs += h.pairs, t.misses = h.misses, t.handoffs = h.handoffs, t.device_misses = h.device_misses, t.pcie_misses = h.pcie_misses;
    t.host_experts_ms = h.host_ms, t.device_wait_ms = h.device_wait_ms, t.device_experts_ms = h.device_work_ms;
    t.host_expert_bytes = static_cast<uint64_t>(h.misses - h.device_misses) * expert_bytes_;
  }
  t.tokens = tokens_;
  t.swaps = swaps_done_, t.swap_bytes = swap_bytes_;
  t.prefill_upload_bytes = pu_.bytes;
  t.pcie_read = pcie_read_;
  t.pcie_read_share = pcie_read_ ? opt_.pcie_read_share : 0.0;
  t.vram_budget = opt_.vram_budget;
  t.vram_peak = budget_->peak();
  return t;
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
  if (graph_timing_ && graph_steps_)
    std::fprintf(stderr, "coli cuda graph timing: %ld decode steps, %.1f us per graph replay on the device, %.1f us per step on the host\n",
                 graph_steps_, 1000 * graph_ms_ / graph_steps_, 1000 * step_ms_ / graph_steps_);
  if (graph_timing_ && graph_steps_)
    std::fprintf(stderr, "coli cuda graph timing: host per step: %.1f us to launch (%.1f us before copying the ids, %.1f us in their cudaMemcpyAsync, %.1f us in cudaGraphLaunch), %.1f us after the last logits range arrived, %.1f us between steps\n",
                 1000 * launch_ms_ / graph_steps_, 1000 * pre_copy_ms_ / graph_steps_, 1000 * copy_call_ms_ / graph_steps_, 1000 * graph_call_ms_ / graph_steps_, 1000 * tail_ms_ / graph_steps_, 1000 * gap_ms_ / graph_steps_);
  for (cudaEvent_t e : graph_ev_)
    if (e) cudaEventDestroy(e);
  if (profile_ && !prof_.empty()) {
    double total = 0;
    for (const auto& p : prof_) total += p.second.ms;
    std::fprintf(stderr, "coli cuda profile: %ld tokens, %.3f ms of kernels\n%-14s %10s %8s %7s\n", prof_tokens_, total, "step", "ms", "calls", "share");
    for (const auto& [name, row] : prof_)
      std::fprintf(stderr, "%-14s %10.3f %8ld %6.1f%%\n", name.c_str(), row.ms, row.calls, 100.0 * row.ms / total);
  }
  free_swaps();
  if (stream_) cudaStreamSynchronize(stream_);  // a pending chunk's joins need the handoff's thread
  handoff_.reset();  // its thread calls the decode upload
  decode_upload_.reset();
  free_prefill_upload();
  for (auto [p, n] : registered_) cudaHostUnregister(p);
  if (twin_dev_) {
    cudaIpcCloseMemHandle(const_cast<uint8_t*>(twin_dev_));
  }
  if (h_io_) cudaFreeHost(h_io_);
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
  st->layers.resize(s_.num_layers);
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
  BudgetScope scope(budget_.get(), "the activations of a chunk (--prefill-chunk / -ub)");
  const std::size_t H = s_.hidden_size, t = T;
  const std::size_t qg = std::size_t(s_.num_heads) * s_.head_dim * 2, cd = s_.linear_conv_dim();
  const std::size_t heads_out = std::max<std::size_t>(std::size_t(s_.num_heads) * s_.head_dim, s_.linear_value_dim());
  const std::size_t kv = std::size_t(s_.num_kv_heads) * s_.head_dim, K = s_.num_experts_per_tok;
  x_.resize(t * H), hn_.resize(t * H), mix_.resize(t * H), sh_.resize(t * H), routed_.resize(t * H);
  proj_.resize(t * std::max(qg, cd));
  z_.resize(t * s_.linear_value_dim()), b_.resize(t * s_.linear_num_value_heads), a_.resize(t * s_.linear_num_value_heads);
  conv_out_.resize(t * cd), heads_out_.resize(t * heads_out), k_.resize(t * kv), v_.resize(t * kv);
  rlogits_.resize(t * s_.num_experts), ridx_.resize(t * (K + 1)), rw_.resize(t * (K + 1));
  sg_.resize(t * s_.shared_expert_intermediate_size), su_.resize(t * s_.shared_expert_intermediate_size), sgate_.resize(t);
  act_.resize(t * (K + 1) * s_.moe_intermediate_size);
  order_.resize(t * K), offsets_.resize(s_.num_experts + 1);
  ey_.resize(t >= std::size_t(kGroupedMinTokens) ? t * K * H : 1);
  if (T >= kFloatTiledMinTokens) router_work_.resize(float_tiled_work_floats(T, s_.num_experts, s_.hidden_size));
  if (chunked_gdn_ && s_.num_attention_layers() < s_.num_layers)
    gdn_work_.resize(gdn_chunk_workspace_floats(T, s_.linear_num_value_heads, s_.linear_key_head_dim, s_.linear_value_head_dim));
  const std::size_t widest = std::max({H, std::size_t(s_.linear_value_dim()), std::size_t(s_.num_heads) * s_.head_dim,
                                       std::size_t(s_.moe_intermediate_size), std::size_t(s_.shared_expert_intermediate_size)});
  const std::size_t qn = std::max(t * widest, t * (K + 1) * s_.moe_intermediate_size) + 32;
  qx_codes_.resize(qn), qx_scale_.resize(qn / 32 + 1), qx_sum_.resize(qn / 32 + 1);
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
  for (int l = 0; l < s_.num_layers; ++l) {
    if (s_.layer_kinds[l] != LayerKind::kFullAttention) continue;
    auto& L = st.layers[l];
    DeviceArray<float> k(cap * kv), v(cap * kv);
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
  return quantize_for({&L.router, &L.sh_gate, &L.sh_up, &L.sh_gate_proj, &L.experts.table.gate, &L.experts.table.up}, nibble);
}

void CudaBackend::attention_layer(const DevLayer& L, CudaState::Layer& st, int T, bool hn_q, int cap) {
  const int H = s_.hidden_size, hd = s_.head_dim, nh = s_.num_heads, nkv = s_.num_kv_heads, qg_w = nh * hd * 2;
  step("attn proj", [&] {
    const MatmulOut outs[] = {{L.q_proj, proj_.get(), qg_w}, {L.k_proj, k_.get(), nkv * hd}, {L.v_proj, v_.get(), nkv * hd}};
    matmul_many(outs, 3, hn_.get(), T, stream_, &qx_, hn_q);
  });
  // The attention kernel quantizes its output for an int8 o_proj.
  const bool out_q = takes_int8_x(L.o_proj) && hd % 32 == 0;
  step("attention", [&] {
    attn_store_kv(k_.get(), v_.get(), L.k_norm, T, d_pos(), nkv, hd, s_.rotary_dim, inv_freq_.get(), s_.rms_norm_eps, st.k.get(), st.v.get(),
                  stream_);
    if (split_kv_)
      attention_split(proj_.get(), L.q_norm, st.k.get(), st.v.get(), T, d_pos(), nh, nkv, hd, s_.rotary_dim, inv_freq_.get(), s_.rms_norm_eps, cap,
                      part_.get(), heads_out_.get(), stream_, out_q ? &qx_ : nullptr, L.o_proj.kind == Kind::kI4);
    else
      attention(proj_.get(), L.q_norm, st.k.get(), st.v.get(), T, d_pos(), nh, nkv, hd, s_.rotary_dim, inv_freq_.get(), s_.rms_norm_eps,
                scores_.get(), scores_cap_, heads_out_.get(), stream_, out_q ? &qx_ : nullptr, L.o_proj.kind == Kind::kI4);
  });
  step("attn proj", [&] { matmul(L.o_proj, heads_out_.get(), T, mix_.get(), H, stream_, &qx_, out_q); });
}

void CudaBackend::deltanet_layer(const DevLayer& L, CudaState::Layer& st, int T, bool hn_q) {
  const int H = s_.hidden_size, cd = s_.linear_conv_dim(), nv = s_.linear_num_value_heads;
  step("gdn proj", [&] {
    const MatmulOut outs[] = {{L.in_qkv, proj_.get(), cd}, {L.in_z, z_.get(), s_.linear_value_dim()}, {L.in_b, b_.get(), nv}, {L.in_a, a_.get(), nv}};
    matmul_many(outs, 4, hn_.get(), T, stream_, &qx_, hn_q);
  });
  step("gdn conv+norm", [&] {
    if (T == 1 && gdn_conv_norm_step(proj_.get(), L.conv1d, st.conv.get(), cd, s_.linear_conv_kernel, s_.linear_num_key_heads,
                                     s_.linear_key_head_dim, conv_out_.get(), stream_))
      return;
    gdn_conv(proj_.get(), L.conv1d, st.conv.get(), T, cd, s_.linear_conv_kernel, conv_out_.get(), stream_);
    gdn_qk_norm(conv_out_.get(), T, cd, s_.linear_num_key_heads, s_.linear_key_head_dim, stream_);
  });
  // The gated norm quantizes its output for an int8 out projection.
  const bool want_q = takes_int8_x(L.out_proj);
  bool out_q = false;
  step("gdn recurrence", [&] {
    out_q = gdn_recurrence(st.S.get(), conv_out_.get(), z_.get(), b_.get(), a_.get(), L.A_log, L.dt_bias, L.gdn_norm, T, s_.linear_num_key_heads, nv,
                           s_.linear_key_head_dim, s_.linear_value_head_dim, cd, s_.rms_norm_eps, heads_out_.get(), stream_,
                           want_q ? &qx_ : nullptr, L.out_proj.kind == Kind::kI4, chunked_gdn_ && T > 1 ? gdn_work_.get() : nullptr);
  });
  step("gdn proj", [&] { matmul(L.out_proj, heads_out_.get(), T, mix_.get(), H, stream_, &qx_, out_q); });
}

void CudaBackend::router_logits(const DevLayer& L, int T, bool hn_q) {
  if (!matmul_float_tiled(L.router, hn_.get(), T, rlogits_.get(), s_.num_experts, router_work_.get(), stream_))
    matmul(L.router, hn_.get(), T, rlogits_.get(), s_.num_experts, stream_, &qx_, hn_q);
}

void CudaBackend::shared_down(const DevLayer& L, int T) {
  const int H = s_.hidden_size, Is = s_.shared_expert_intermediate_size;
  if (takes_int8_x(L.sh_down)) {  // SiLU * up fused into the quantization of the down projection's input
    quantize_x(sg_.get(), T, Is, L.sh_down.kind == Kind::kI4, qx_, stream_, su_.get());
    matmul(L.sh_down, sg_.get(), T, sh_.get(), H, stream_, &qx_, /*x_in_q=*/true);
  } else {
    silu_mul(sg_.get(), su_.get(), sg_.get(), std::size_t(T) * Is, stream_);
    matmul(L.sh_down, sg_.get(), T, sh_.get(), H, stream_, &qx_);
  }
}

void CudaBackend::moe_layer(const DevLayer& L, int l, int T, bool hn_q) {
  const int E = s_.num_experts, K = s_.num_experts_per_tok, Is = s_.shared_expert_intermediate_size;
  // A 1-row float shared-expert gate is computed by the routing kernel; in a
  // decode step the shared expert then runs as pair K of the routed ones.
  const bool gate_in_route = L.sh_gate_proj.rows == 1 && !takes_int8_x(L.sh_gate_proj);
  const bool fold = T < kGroupedMinTokens && L.experts.shared_at_E;
  step("router", [&] {
    router_logits(L, T, hn_q);
    route_topk(rlogits_.get(), T, E, K, ridx_.get(), rw_.get(), stream_, gate_in_route ? &L.sh_gate_proj : nullptr, hn_.get(), sgate_.get(), fold,
               heat_.get() + std::size_t(l) * E);
  });
  // Hybrid: the misses go to the host now and come back as a partial sum
  // just before the combine; the device meanwhile computes everything else
  // (a miss reads the zero expert: exactly 0).
  // A prompt chunk's non-residents come uploaded (prefill_upload.cu); else
  // the host computes them, as in a decode step.
  const bool upload = uploads_layer(l, T);
  if (upload) upload_pairs_ += static_cast<long long>(T) * K;
  const bool handoff = handoff_ && !layer_full_[l] && !upload;
  // One-token steps read the PCIe experts in place (pcie_read_share): their
  // table and flags; prompt chunks the tier's.
  const bool one = T == 1 && !one_resident_.empty();
  ExpertTable table = one ? L.experts.one_table : L.experts.table;
  const uint8_t* resident = one ? one_resident_[l].get() : handoff ? resident_[l].get() : nullptr;  // a whole model has no flags
  if (upload) {
    table.gate_ptrs = pu_.gate[l].get(), table.up_ptrs = pu_.up[l].get(), table.down_ptrs = pu_.down[l].get();
    // The next uploaded layer's copies start now when they go to the other
    // area, else once this layer's kernels are enqueued (below).
    const int next = next_upload_layer(l);
    if (next >= 0 && next % 2 != l % 2) upload_layer_experts(next);
  }
  // A one-token step splits its misses between the PCIe reads and the host.
  const float share = one ? static_cast<float>(opt_.pcie_read_share) : 0.0f;
  if (handoff) step("handoff", [&] { handoff_->post(l, ridx_.get(), rw_.get(), fold ? K + 1 : K, T, resident, hn_.get(), stream_, share,
                                                  static_cast<float>(opt_.pcie_read_offset), E + 1); });
  const DevMatrix& eg = L.experts.table.gate;
  if (fold) {
    step("experts", [&] {
      moe_gate_up(table, hn_.get(), ridx_.get(), T, K + 1, act_.get(), stream_, &qx_, hn_q);
      moe_down(table, act_.get(), ridx_.get(), rw_.get(), T, K + 1, routed_.get(), stream_, &qx_);
    });
    if (handoff) step("handoff", [&] { handoff_->join(routed_.get(), T, stream_); });
    return;
  }
  // Shared expert: sigmoid(shared_gate . hn) * down(silu(gate . hn) * (up . hn));
  // the sigmoid gate is applied where the output joins the residual.
  step("shared expert", [&] {
    const MatmulOut outs[] = {{L.sh_gate, sg_.get(), Is}, {L.sh_up, su_.get(), Is}, {L.sh_gate_proj, sgate_.get(), 1}};
    matmul_many(outs, gate_in_route ? 2 : 3, hn_.get(), T, stream_, &qx_, hn_q);
  });
  // Routed experts over all T * K pairs; hn is still in qx_ (the norm put
  // it there in the experts' order, or the shared expert's gate did).
  const bool hn_in_q = hn_q || (takes_int8_x(L.sh_gate) && takes_int8_x(eg) && L.sh_gate.kind == eg.kind && L.sh_gate.cols == eg.cols);
  // A prompt chunk groups the pairs by expert (each expert's rows read once
  // per tile of its tokens); a decode step's pairs go straight.
  bool grouped = false;
  step("experts", [&] {
    // This layer's uploads: only the routed experts need them (the shared
    // expert above ran meanwhile).
    if (upload) {
      pu_.stager->wait_issued(pu_.ticket[l % 2]);  // this layer's copies issued (not the next layer's, posted meanwhile)
      check(cudaStreamWaitEvent(stream_, pu_.uploaded[l % 2]), "wait event");
    }
    if (T >= kGroupedMinTokens)
      grouped = moe_grouped(table, hn_.get(), ridx_.get(), rw_.get(), T, K, E, MoeScratch{order_.get(), offsets_.get(), act_.get(), ey_.get()},
                            routed_.get(), stream_, qx_, hn_in_q);
    if (!grouped) moe_gate_up(table, hn_.get(), ridx_.get(), T, K, act_.get(), stream_, &qx_, hn_in_q);
  });
  step("shared expert", [&] { shared_down(L, T); });
  if (!grouped) step("experts", [&] { moe_down(table, act_.get(), ridx_.get(), rw_.get(), T, K, routed_.get(), stream_, &qx_); });
  if (handoff) step("handoff", [&] { handoff_->join(routed_.get(), T, stream_); });
  if (upload) {
    check(cudaEventRecord(pu_.used[l % 2], stream_), "event");
    const int next = next_upload_layer(l);
    if (next >= 0 && next % 2 == l % 2) upload_layer_experts(next);
  }
}

void CudaBackend::run(CudaState& st, int T, int logit_rows) {
  const int H = s_.hidden_size;
  const float eps = s_.rms_norm_eps;
  if (prefill_uploads(T)) {  // the first uploaded layer's experts, while the trunk starts
    refresh_prefill_tables();
    if (const int first = next_upload_layer(-1); first >= 0) upload_layer_experts(first);
  }
  step("embed", [&] { embed_rows(embed_, d_ids(), T, x_.get(), stream_); });
  // Each residual add is fused with the norm that reads its result, and
  // the norm with the quantization of its output for the int8 matmuls.
  bool nibble = false, hn_q = mixer_quant(0, &nibble);
  step("norms+adds", [&] { rms_norm(x_.get(), layers_[0].input_norm, T, H, eps, true, hn_.get(), stream_, hn_q ? &qx_ : nullptr, nibble); });
  for (int l = 0; l < s_.num_layers; ++l) {
    const DevLayer& L = layers_[l];
    if (L.kind == LayerKind::kFullAttention) attention_layer(L, st.layers[l], T, hn_q, st.cap);
    else deltanet_layer(L, st.layers[l], T, hn_q);
    hn_q = moe_quant(l, &nibble);
    step("norms+adds", [&] {
      add_rms_norm(x_.get(), mix_.get(), nullptr, nullptr, L.post_norm, T, H, eps, hn_.get(), stream_, hn_q ? &qx_ : nullptr, nibble);
    });
    moe_layer(L, l, T, hn_q);
    const bool last = l + 1 == s_.num_layers;
    hn_q = !last && mixer_quant(l + 1, &nibble);
    const bool folded = T < kGroupedMinTokens && L.experts.shared_at_E;  // routed_ holds the shared expert too
    step("norms+adds", [&] {
      // x += routed + sigmoid(shared gate) * shared, then the next layer's input norm.
      add_rms_norm(x_.get(), routed_.get(), folded ? nullptr : sh_.get(), folded ? nullptr : sgate_.get(),
                   last ? nullptr : layers_[l + 1].input_norm, T, H, eps, last ? nullptr : hn_.get(), stream_, hn_q ? &qx_ : nullptr, nibble);
    });
  }
  if (logit_rows == 0) return;
  const float* last = x_.get() + std::size_t(T - logit_rows) * H;
  hn_q = quantize_for({&lm_head_}, &nibble);
  step("lm_head", [&] {
    rms_norm(last, final_norm_, logit_rows, H, eps, true, hn_.get(), stream_, hn_q ? &qx_ : nullptr, nibble);
    // By column ranges: each range's logits go to the host (copy stream)
    // while the next range is computed.
    const int V = s_.vocab_size;
    for (int i = 0; i < logit_parts_; ++i) {
      const auto [r0, r1] = logit_range(i);
      DevMatrix part = lm_head_;
      part.data = lm_head_.data + static_cast<long long>(r0) * lm_head_.row_stride;
      part.scale_offset = lm_head_.scale_offset + static_cast<long long>(r0) * (lm_head_.scale_row_bytes - lm_head_.row_stride);
      part.rows = r1 - r0;
      matmul(part, hn_.get(), logit_rows, logits_.get() + r0, V, stream_, &qx_, hn_q);
      // Inside a decode graph an external record node, which the copy
      // stream's wait (enqueue_logit_copies, after the launch) can see.
      cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
      check(cudaStreamIsCapturing(stream_, &cs), "capture status");
      check(cudaEventRecordWithFlags(part_ready_[i], stream_, cs == cudaStreamCaptureStatusActive ? cudaEventRecordExternal : cudaEventRecordDefault),
            "event");
    }
  });
}

void CudaBackend::enqueue_logit_copies(int logit_rows) {
  // Each range goes to the host on the copy stream as soon as it is
  // computed, while the next range is. Enqueued outside the decode graph:
  // a graph of one stream's kernels launches in a few microseconds, one
  // that forks to a second stream and back costs tens.
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
  BudgetScope scope(budget_.get(), "the attention scratch");
  if (s_.num_attention_layers() > 0 && split_kv_) {
    int kps = 0;
    const std::size_t need = std::size_t(T) * s_.num_heads * (s_.head_dim + 2) * attention_splits(T, st.cap, &kps);
    if (part_.size() < need) part_.resize(need), ++buffer_gen_;
  } else if (s_.num_attention_layers() > 0 && (scores_cap_ < st.cap || scores_.size() < std::size_t(buf_T_) * s_.num_heads * st.cap)) {
    scores_.resize(std::size_t(buf_T_) * s_.num_heads * st.cap);
    ++buffer_gen_;
    scores_cap_ = st.cap;
  }
}

void CudaBackend::start_chunk(BackendState& state, const int* ids, int T, int pos0, int logit_rows) {
  auto& st = static_cast<CudaState&>(state);
  if (pending_.active) finish_chunk(state, nullptr);  // a chunk started and never finished: drain it
  const auto t_start = std::chrono::steady_clock::now();
  prepare(st, T, pos0);
  const std::size_t nlog = std::size_t(logit_rows) * s_.vocab_size;
  if (nlog > h_logits_n_) {
    if (h_logits_) cudaFreeHost(h_logits_);
    h_logits_ = nullptr, h_logits_n_ = 0;
    check(cudaMallocHost(&h_logits_, nlog * sizeof(float)), "cudaMallocHost");
    h_logits_n_ = nlog;
    ++buffer_gen_;  // the decode graph copies into it
  }
  if (logits_.size() < nlog) {
    BudgetScope scope(budget_.get(), "the logits");
    logits_.resize(nlog), ++buffer_gen_;
  }
  h_io_[0] = pos0;
  std::memcpy(h_io_ + 1, ids, T * sizeof(int));
  const auto t_copy = std::chrono::steady_clock::now();
  check(cudaMemcpyAsync(io_.get(), h_io_, (T + 1) * sizeof(int), cudaMemcpyHostToDevice, stream_), "copy ids");
  if (graph_timing_ && T == 1) {
    using ms_d = std::chrono::duration<double, std::milli>;
    pre_copy_ms_ += ms_d(t_copy - t_start).count();
    copy_call_ms_ += ms_d(std::chrono::steady_clock::now() - t_copy).count();
  }
  prof_tokens_ += T;
  swap_tick();  // swaps' table updates go before this chunk's kernels
  if (handoff_) handoff_->begin();  // its host thread serves the chunk's posts from now on
  try {
    launch_chunk(st, T, logit_rows, t_start);
  } catch (...) {
    if (handoff_) {  // serve what was launched until it drains, then stop
      cudaStreamSynchronize(stream_);
      try {
        handoff_->end();
      } catch (...) {
      }
    }
    throw;
  }
}

void CudaBackend::launch_chunk(CudaState& st, int T, int logit_rows, std::chrono::steady_clock::time_point t_start) {
  full_layer_pairs_ += static_cast<long long>(handoff_ ? full_layers_ : s_.num_layers) * T * s_.num_experts_per_tok;  // the handoff counts the others
  tokens_ += T;
  pdl_wanted() = T == 1 && opt_.pdl;  // decode: overlap each kernel's launch with the previous one's tail
  gemv_stream_min_rows() = stream_min_rows_, gemv_stream_rows() = stream_rows_;
  launch_tuning() = opt_.tuning;
  if (T == 1 && opt_.graphs) {
    // A decode step as one graph; captured again when a buffer moved.
    if (!st.graph || st.graph_cap != st.cap || st.graph_rows != logit_rows || st.graph_gen != buffer_gen_) {
      if (st.graph) cudaGraphExecDestroy(st.graph), st.graph = nullptr;
      cudaGraph_t g;
      check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "begin capture");
      try {
        run(st, 1, logit_rows);
      } catch (...) {  // leave the stream usable: end the broken capture
        cudaGraph_t broken = nullptr;
        cudaStreamEndCapture(stream_, &broken);
        if (broken) cudaGraphDestroy(broken);
        cudaGetLastError();
        throw;
      }
      check(cudaStreamEndCapture(stream_, &g), "end capture");
      std::size_t free0 = 0, free1 = 0, total_b = 0;
      cudaMemGetInfo(&free0, &total_b);
      check(cudaGraphInstantiate(&st.graph, g, 0), "graph instantiate");
      cudaGraphDestroy(g);
      // What instantiation took on the device, charged while the graph lives.
      cudaMemGetInfo(&free1, &total_b);
      if (st.budget && st.graph_bytes) st.budget->credit(st.graph_bytes), st.graph_bytes = 0;
      if (st.budget && free1 < free0) st.budget->charge("the decode graph", free0 - free1), st.graph_bytes = free0 - free1;
      st.graph_cap = st.cap, st.graph_rows = logit_rows, st.graph_gen = buffer_gen_;
    }
    if (graph_timing_ && !graph_ev_[0]) cudaEventCreate(&graph_ev_[0]), cudaEventCreate(&graph_ev_[1]);
    if (graph_timing_) cudaEventRecord(graph_ev_[0], stream_);
    const auto t_call = std::chrono::steady_clock::now();
    check(cudaGraphLaunch(st.graph, stream_), "graph launch");
    if (graph_timing_)
      graph_call_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_call).count();
    if (graph_timing_) cudaEventRecord(graph_ev_[1], stream_);
  } else {
    run(st, T, logit_rows);
  }
  const auto t_launched = std::chrono::steady_clock::now();
  enqueue_logit_copies(logit_rows);
  pending_ = {true, T, logit_rows, t_start, t_launched};
}

void CudaBackend::finish_chunk(BackendState&, float* logits) {
  if (!pending_.active) throw Error("CUDA backend: finish_chunk without start_chunk (internal)");
  const Pending p = pending_;
  pending_.active = false;
  const int V = s_.vocab_size;
  swap_stage();  // while the device runs the chunk
  // Each column range as soon as it is on the host.
  auto t_last = std::chrono::steady_clock::now();
  for (int i = 0; p.logit_rows && i < logit_parts_; ++i) {
    check(cudaEventSynchronize(part_copied_[i]), "logits");
    t_last = std::chrono::steady_clock::now();
    if (!logits) continue;
    const auto [r0, r1] = logit_range(i);
    for (int t = 0; t < p.logit_rows; ++t)
      std::memcpy(logits + std::size_t(t) * V + r0, h_logits_ + std::size_t(t) * V + r0, (r1 - r0) * sizeof(float));
  }
  check(cudaStreamSynchronize(stream_), "forward");
  if (handoff_) handoff_->end();  // rethrows a host-side failure of the chunk
  if (profile_) collect_profile();
  if (graph_timing_ && p.T == 1 && opt_.graphs) {
    float ms = 0;
    cudaEventElapsedTime(&ms, graph_ev_[0], graph_ev_[1]);
    using ms_d = std::chrono::duration<double, std::milli>;
    const auto now = std::chrono::steady_clock::now();
    graph_ms_ += ms, ++graph_steps_;
    step_ms_ += ms_d(now - p.t0).count();
    launch_ms_ += ms_d(p.launched - p.t0).count();
    tail_ms_ += ms_d(now - t_last).count();
    if (last_finish_.time_since_epoch().count()) gap_ms_ += ms_d(p.t0 - last_finish_).count();
    last_finish_ = now;
  }
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
  if (swap_policy_) {  // what the swaps' windows took off the device
    drain_heat_window();
    for (std::size_t i = 0; i < counts.size(); ++i) counts[i] += heat_host_[i];
    std::fill(heat_host_.begin(), heat_host_.end(), 0);
  }
  return true;
}

}  // namespace detail

std::unique_ptr<Backend> make_cuda_backend(const Model& model, const CudaOptions& opt) { return std::make_unique<detail::CudaBackend>(model, opt); }

}  // namespace coli::cuda
