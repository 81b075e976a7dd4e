// ExpertTier: which routed experts are in VRAM, who moves them, and what
// the others cost. The CUDA backend composes one; nothing else touches the
// routed experts' device tables.
//
// It owns, per layer, the pointer tables the expert kernels read (entry e:
// expert e's gate / up / down on the device; entry E the shared expert when
// it folds into a decode step's pairs), and for a run under a VRAM budget
// (CudaOptions::vram_budget / expert_slots):
//   - the slots: one allocation, slot 0 the zero expert every miss reads
//     (all bytes 0: each format dequantizes it to 0), then one slot per
//     resident expert, filled at the start from the heat or a plan;
//   - the residency table (plan_, slot_of_) and each layer's resident flags
//     on the device, read by the handoff's post kernel;
//   - the handoff of misses to the host (expert_handoff.cuh) and its two
//     levers for one-token steps: the PCIe reads (a second, one-token table
//     whose non-resident entries point at registered host bytes, split per
//     layer and step by the post kernel) and the decode uploads
//     (decode_upload.cu);
//   - hybrid prefill's staging (prefill_upload.cu): a chunk's non-residents
//     uploaded ahead into two alternating areas, a unit at a time: a whole
//     layer's, or (a ring, when the experts run as grouped GEMMs over
//     expert ranges) a range of its experts whose non-residents fill one
//     area, so that a small area streams a layer through in groups; and
//     with a ring the CPU as third place: a layer's last non-residents by
//     id handed off to the host instead (CudaOptions::prefill_cpu_experts),
//     their table entries null (the grouped kernels give their pairs 0);
//   - the background swaps (tier_swaps.cu): a hot non-resident replaces a
//     cold resident, slot for slot, never blocking a step.
// Without a budget every expert lives in the backend's weight arena and the
// tier holds only the tables (tiered() is false; every other call is a
// no-op or says "resident").
//
// Threads: one caller, the backend's thread; the handoff's host thread and
// the prefill stager's threads are the tier's own. Calls that enqueue work
// do so on the compute stream given at construction, in the backend's
// order (a decode step's calls are captured into its graph once).
// Lifetimes: the model, the options, the budget and the stream outlive the
// tier; the registry lease (pinned host ranges) too. Device arrays are
// charged to the budget. A constructor that throws leaves nothing
// allocated; a call that throws mid-chunk leaves the tier usable for the
// next chunk once end_chunk() has run (the backend drains the stream first).
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <limits>
#include <memory>
#include <vector>

#include "cuda_backend.h"
#include "cuda_util.cuh"
#include "expert_handoff.cuh"
#include "host_registry.cuh"
#include "kernels.cuh"
#include "placement/device_sizes.h"
#include "placement/swap_policy.h"
#include "placement/tier_plan.h"
#include "placement/vram_ledger.h"

namespace coli::cuda::detail {

class PrefillStager;
class StagedUploader;

constexpr int kSwapsInFlight = kTierSwapsInFlight;     // background swaps at once (tier_swaps.cu; placement/device_sizes.h)
constexpr int kGroupedMinTokens = kMoeGroupedMinTokens;  // chunks of this many tokens group their experts' pairs (moe_grouped)

// A layer's routed experts on the device: their format and pointer tables.
struct DevExperts {
  ExpertTable table;
  bool shared_at_E = false;  // entry E of the pointer tables is the shared expert (decode folds it in)
  DeviceArray<const uint8_t*> gate_ptrs, up_ptrs, down_ptrs;
  // One-token steps' table when experts outside the tier are read over
  // PCIe in place (CudaOptions::pcie_read_share): their entries point into
  // registered host memory, entry E + 1 at the zero expert (the split post
  // sends the host's misses there); otherwise the same as table.
  ExpertTable one_table;
  DeviceArray<const uint8_t*> one_gate_ptrs, one_up_ptrs, one_down_ptrs;
};

class ExpertTier {
 public:
  // What the backend's upload of the trunk knows about a layer's experts.
  struct LayerInput {
    ExpertTable formats;  // gate / up / down format and shape (pointers unset)
    bool shared_at_E = false;
    std::array<const uint8_t*, 3> shared{};  // the shared expert's gate, up, down on the device (entry E)
    // Without a tier: every expert's gate, up, down in the weight arena.
    std::vector<const uint8_t*> gate, up, down;
  };
  struct Setup {
    const Model* model = nullptr;
    const CudaOptions* opt = nullptr;
    DeviceBudget* budget = nullptr;
    cudaStream_t stream = nullptr;     // the compute stream
    const HostRanges* pinned = nullptr;  // host ranges registered with the device (HostRegistry)
    StagedUploader* uploader = nullptr;  // the start's upload pipeline: fills the slots
    // The weights' pin is still being made (CudaOptions::pending_pin):
    // prompt chunks' uploads wait for adopt_pins().
    bool pins_pending = false;
  };
  // Builds the tables, and under a budget the slots, the handoff and the
  // options' levers: what the budget has left after the backend's charges
  // so far holds the VRAM ledger's runtime reserve, then the slots
  // (placement/vram_ledger.h: fill_tier, the planner's arithmetic too).
  // Throws coli::Error naming what does not fit.
  ExpertTier(const Setup& setup, std::vector<LayerInput> layers);
  ~ExpertTier();
  ExpertTier(const ExpertTier&) = delete;
  ExpertTier& operator=(const ExpertTier&) = delete;

  // The device routing counts [layers * experts] the router adds to (the
  // swaps' windows and the backend's read_heat read and clear them, the
  // latter saying so by heat_cleared); before the first chunk.
  void attach_heat(unsigned long long* heat) { heat_ = heat; }
  void heat_cleared() { pu_.heat_seen.clear(); }
  bool tiered() const { return tiered_; }
  const DevExperts& experts(int layer) const { return experts_[layer]; }
  // Whether the host computes some of layer l's experts (a handoff).
  bool hands_off(int layer) const { return handoff_ && !layer_full_[layer]; }
  bool is_resident(int layer, int expert) const { return !tiered_ || plan_.is_resident(layer, expert); }
  ExpertHost& host() const { return *opt_.expert_host; }

  // A chunk's life, from the backend's start_chunk / finish_chunk.
  void begin_chunk(int T);  // swaps' table updates, the handoff serves, counts
  void stage_swaps();       // while the device runs the chunk
  void end_chunk();         // rethrows a host-side failure of the chunk
  void abandon_chunk();     // a launch failed: serve what was launched, then stop (the backend drained the stream)

  // Inside the forward pass of T tokens, in order: start_pass once, then
  // per MoE layer plan_layer, post (when step.handoff), for an uploading
  // layer's groups g = 0 .. step.groups - 1 in order: wait_group before
  // the group's expert kernels, group_done after them; join (when
  // step.handoff). An uploading layer of more than one group runs its
  // experts as grouped GEMMs over group_range(g) (moe_grouped_experts).
  void start_pass(int T);
  struct Step {
    ExpertTable table;                 // what the layer's expert kernels read
    const uint8_t* resident = nullptr;  // the post's flags
    bool handoff = false, upload = false;  // both: an uploading layer with experts on the host (the third place)
    float share = 0;                   // a one-token step's PCIe split
    const int* lim = nullptr;          // with it, the expert split's row limits (ExpertHandoff::row_limits) for the expert kernels
    int unit0 = -1, groups = 0;        // upload: the layer's first staging unit and its count
  };
  // pair_kernels: the layer's expert kernels go pair by pair (not grouped),
  // which a split post of T > 1 tokens needs (its host pairs' ids become
  // the zero entry, E + 1).
  Step plan_layer(int layer, int T, bool pair_kernels = false);
  void post(const Step& st, int layer, int* idx, const float* w, int ks, int T, const float* hn);
  // A one-token step's router, routing and post in one launch
  // (ExpertHandoff::route_post; router_route_supported must hold): in place
  // of the router's matmul, route_topk and post.
  void route_post(const Step& st, int layer, const DevMatrix& router, const RouteArgs& r, unsigned* ticket);
  std::pair<int, int> group_range(const Step& st, int g) const;  // experts [first, second) of group g ([0, E) when not uploading)
  void wait_group(const Step& st, int g);
  void group_done(const Step& st, int g);
  void join(float* routed, int T);
  // A one-token step's join inside the residual add and norm after it
  // (ExpertHandoff::join_norm; a.a: the routed row): in place of join and
  // add_rms_norm.
  void join_norm(const NormArgs& a);

  // A background pin: whether a chunk of T tokens would upload experts
  // once pinned (so it is worth waiting for), and, between two chunks,
  // taking over what the pin added to the host ranges (the backend's
  // pinned list, which the tier reads): the PCIe-read set and one-token
  // tables, the stager's direct copies, the decode uploads. Nothing added
  // (the driver refused): the prompt uploads go off, as if never asked
  // (from pageable memory they run no faster than the host's experts).
  bool wants_pins(int T) const { return tiered_ && pu_.on && T >= kGroupedMinTokens; }
  // A speculative verify chunk (a few tokens between mark_state and
  // rewind_state): its misses go to the host as a decode step's do, not
  // uploaded (a layer's non-residents for a handful of pairs: measured
  // 34x a one-token step at 1.75 GiB with four tokens).
  void speculative_window(bool on) { window_ = on; }
  void adopt_pins();

  // Routing heat the swaps' windows took off the device since the last
  // call: added to counts [layers * experts].
  void take_heat(std::vector<uint64_t>& counts);
  // The tier's fields of the backend's TierStats.
  void fill_stats(TierStats& t) const;

 private:
  class DecodeUpload;
  struct SwapJob {
    enum State { kFree, kStaging, kStaged, kCopying } state = kFree;
    int victim = -1, candidate = -1;  // (layer, expert) pair indices
    long long slot = -1;              // the victim's slot, then the candidate's
    uint8_t* staging = nullptr;       // pinned, one slot
    cudaEvent_t evicted = nullptr, copied = nullptr;
  };
  struct PrefillUpload {
    bool on = false;
    bool ring = false;                // a layer may come in several groups (ExpertParts::grouped)
    int stage_slots = 0;              // per staging area
    DeviceArray<uint8_t> stage;       // two areas of stage_slots
    // Per layer, pointer tables for a chunk: residents -> their tier slot,
    // the others -> their place in staging area l % 2 (entry E: the shared expert).
    std::vector<DeviceArray<const uint8_t*>> gate, up, down;
    long residency_gen = -1;          // the tier's residency the tables were made for
    cudaStream_t stream = nullptr;
    cudaEvent_t uploaded[2] = {}, used[2] = {};
    uint64_t bytes = 0;               // uploaded since the tier was made
    long long experts = 0;
    long long copies = 0;             // cudaMemcpyAsync calls those took (contiguous parts merged)
    // The pass's units (from the residency, refresh_prefill_tables): a
    // layer's experts [e0, e1) whose non-residents fit one area; unit u
    // fills area u % 2. first_unit[l] -1: layer l does not upload (every
    // expert resident, or without a ring more non-residents than an area).
    struct Unit {
      int layer, e0, e1;
    };
    std::vector<Unit> units;
    std::vector<int> first_unit, unit_count;
    std::unique_ptr<PrefillStager> stager;  // issues the copies (staged from pageable memory, direct from registered)
    uint64_t ticket[2] = {};                // the stager's job that fills each area last
    // Each unit's wait for its copies, timed on the compute stream (a pair
    // of events around the wait; summed once the chunk has drained).
    std::vector<std::pair<cudaEvent_t, cudaEvent_t>> wait_ev;
    std::size_t waits = 0;                  // pairs recorded in this chunk
    double wait_ms = 0;
    // The CPU as third place (ring only): per layer how many of its last
    // non-residents the host computes (the tables' count, cpu_of), the
    // handoff's flags for an uploading layer (1: resident or uploaded, 0:
    // the host's), [layers * experts] on_cpu on the host.
    std::vector<int> cpu_of;
    std::vector<DeviceArray<uint8_t>> flags;
    std::vector<uint8_t> on_cpu;
    double pair_s = 0;                      // the host's measured time per pair beyond reading the expert (0: not yet)
    // The measured correction of the counts (prefill_cpu_bias): experts a
    // layer, from the GPU's waits for the host in the chunks that had any
    // on the host (cpu_layers of them in the last chunk, pairs_per_expert each).
    double cpu_bias = 0;
    int cpu_layers = 0;
    double pairs_per_expert = 0, seen_wait_ms = 0;
    // Which non-residents the host takes (CudaOptions::prefill_cpu_by_routing):
    // the least routed, expected from the routing of the chunks so far
    // (per layer each expert's share of its pairs, placement/prefill_split.h
    // update_routing_share; seeded by the options' heat; empty: none seen,
    // the layer's last by id). heat_seen: the device counts at the last look.
    std::vector<std::vector<double>> share;
    std::vector<uint64_t> heat_seen;
    // How far the shares have predicted the chunks (update_routing_trust),
    // and what the last chunk's host experts were expected to bring by
    // their shares and by the mean, to measure it against what came.
    double trust = 0, expect_share = 0, expect_mean = 0;
    // Per layer what the device's tables (gate, up, down, flags) hold: a
    // refresh copies only the layers that differ.
    struct Tables {
      std::vector<const uint8_t*> g, u, d;
      std::vector<uint8_t> flags;
      std::vector<uint8_t> host;       // the host's choice (on_cpu's row) and host_at's row
      std::vector<const uint8_t*> at;
    };
    std::vector<Tables> written;
    // Hot host experts (CudaOptions::prefill_hot_pairs, prefill_hot.cu):
    // per layer the host's choice on the device (1: the host's, before the
    // routing) and where the device reads each one's gate, up and down
    // over PCIe ([3 E], null where outside a registered range). After a
    // layer's router a kernel sets the flags and tables of each chosen
    // expert anew: the host's, or read over PCIe by the GPU when the chunk
    // routes it more than hot_pairs; hot counts those (since creation).
    std::vector<DeviceArray<uint8_t>> host;
    std::vector<DeviceArray<const uint8_t*>> host_at;
    DeviceArray<unsigned long long> hot;
    unsigned long long hot_seen = 0;
    int pass_tokens = 0;                    // the chunk's tokens when it uploaded (start_pass), 0: none
    ExpertHandoff::Stats seen{};            // the handoff's prompt counters at the last measurement
    long long placed[3] = {};               // expert placements of uploading layers' chunks: resident, uploaded, host
    // CudaProfile::kPrefill: timed events per unit of a chunk (its copies
    // started / ended on the upload stream; the GPU's wait for them began /
    // ended and its kernels done on the compute stream) and the chunk's
    // start, printed by end_chunk (prefill_timeline.cu).
    struct UnitTimes {
      cudaEvent_t up0 = nullptr, up1 = nullptr, wait0 = nullptr, wait1 = nullptr, done = nullptr;
    };
    std::vector<UnitTimes> times;
    cudaEvent_t t0 = nullptr;
    bool timed_chunk = false;
    int timed_tokens = 0, chunks_timed = 0;
  };

  // Before the handoff's post of an uploading layer with host experts:
  // those the chunk's routing (idx, ks columns a token) makes hot go to
  // the GPU over PCIe (prefill_hot.cu).
  void read_hot_host_experts(int l, const int* idx, int ks, int T);
  bool hot_on() const { return pu_.ring && !pu_.host.empty() && opt_.prefill_hot_pairs != std::numeric_limits<int>::max(); }

  // Construction (expert_tier.cu).
  void set_tables(int layer, std::vector<const uint8_t*> gp, std::vector<const uint8_t*> upp, std::vector<const uint8_t*> dp, bool one_token = false,
                  const std::array<const uint8_t*, 3>& zero = {});
  void build(StagedUploader& uploader);
  std::vector<uint8_t> pcie_read_set();
  // Layer l's one-token table and flags from the residency (slot_of_) and
  // the PCIe-read set: resident 1, read over PCIe 2, the host's 0.
  void write_one_table(int l, const std::vector<uint8_t>& pcie);
  // Its gate, up and down each inside one registered host range: the
  // device may read it in place or copy it at the pinned rate.
  bool in_pinned_memory(const ExpertWeights& x) const;
  const uint8_t* mapped(const uint8_t* host) const;
  uint8_t* slot_address(long long slot) const { return slots_.get() + static_cast<std::size_t>(slot) * slot_bytes_; }
  // Swaps (tier_swaps.cu).
  void init_swaps();
  void swap_tick();
  void drain_heat_window();
  void free_swaps();
  void set_entry(int pair, const uint8_t* slot, bool resident);
  // Prefill staging (prefill_upload.cu).
  void init_prefill_upload(int stage_slots, bool ring);
  void free_prefill_upload();
  // Per layer, how many non-residents the host takes in a chunk of T
  // tokens (prefill_cpu_count over the measured rates; the options' n).
  std::vector<int> prefill_cpu_counts(int T) const;
  std::vector<uint8_t> resident_flags(int l) const;
  void measure_prefill_cpu();  // pair_s from the handoff's prompt counters
  void observe_prefill_routing();  // share from the device's routing counts
  void refresh_prefill_tables(const std::vector<int>& cpu);
  void upload_unit(int u);
  // The timeline (CudaProfile::kPrefill; prefill_timeline.cu).
  bool timeline() const { return opt_.profile == CudaProfile::kPrefill; }
  void timeline_start(int T);
  void timeline_record(cudaEvent_t PrefillUpload::UnitTimes::*which, int u, cudaStream_t s);
  void timeline_print();
  void timeline_free();
  bool prefill_uploads(int T) const { return pu_.on && !pins_pending_ && !window_ && T >= kGroupedMinTokens; }
  // The third place's rates (prefill_cpu_counts, measure_prefill_cpu): an
  // expert over PCIe, an expert read by the host, and the host's time per
  // pair before a measurement: the multiply-adds at 1.2 TFLOP/s, what the
  // H200 machine's 16 cores reached on int4 experts at 16 pairs each
  // (issue 18: 1.75G, prompts' misses on the host).
  double expert_upload_s() const { return static_cast<double>(expert_bytes_) / (std::max(opt_.pcie_gbs, 1e-3) * 1e9); }
  double expert_host_read_s() const { return static_cast<double>(expert_bytes_) / (std::max(opt_.host_expert_gbs, 1e-3) * 1e9); }
  double host_pair_floor_s() const { return 6.0 * s_.hidden_size * s_.moe_intermediate_size / 1.2e12; }
  // The rows a decode expert splits in (CudaOptions::split_experts), 0: no split.
  int split_inter() const {
    const int I = s_.moe_intermediate_size;
    return opt_.split_experts && I % 128 == 0 && I >= 256 ? I : 0;
  }
  bool uploads_layer(int l, int T) const { return prefill_uploads(T) && !layer_full_[l] && static_cast<std::size_t>(l) < pu_.first_unit.size() && pu_.first_unit[l] >= 0; }

  const Model& model_;
  const ModelSpec& s_;
  const CudaOptions& opt_;
  DeviceBudget* budget_;
  cudaStream_t stream_;
  const HostRanges& pinned_;
  unsigned long long* heat_ = nullptr;
  bool tiered_ = false;
  bool pins_pending_ = false;                       // Setup::pins_pending until adopt_pins()
  bool window_ = false;                             // speculative_window()
  std::vector<DevExperts> experts_;
  std::vector<std::array<const uint8_t*, 3>> shared_;  // per layer: the shared expert's gate, up, down (entry E)
  TierPlan plan_;
  DeviceArray<uint8_t> slots_;                      // slot 0: the zero expert; then one slot per resident expert
  std::vector<long long> slot_of_;                  // [layers * experts]: the pair's slot, -1 if not resident
  std::size_t slot_bytes_ = 0, slot_up_ = 0, slot_down_ = 0;  // a slot's size; offsets of up and down in it
  uint64_t expert_bytes_ = 0;                       // one routed expert's gate + up + down bytes
  std::vector<DeviceArray<uint8_t>> resident_;      // per layer [E] flags
  std::vector<DeviceArray<uint8_t>> one_resident_;  // one-token steps' flags: 1 resident, 2 readable over PCIe (empty: off)
  long long pcie_read_ = 0;                         // how many experts are readable over PCIe
  bool host_ptrs_ = false;                          // the device reads registered memory at its host addresses
  std::vector<char> layer_full_;                    // every expert of the layer resident: no handoff
  int full_layers_ = 0;
  long residency_gen_ = 0;                          // bumped by every residency change (swaps)
  PrefillUpload pu_;
  long long upload_pairs_ = 0;                      // routed pairs of uploaded layers (TierStats::pairs)
  std::unique_ptr<DecodeUpload> decode_upload_;     // before handoff_ (whose thread calls it)
  std::unique_ptr<ExpertHandoff> handoff_;
  const float* post_rows_ = nullptr;                // the last post's normed rows (the decode upload reads them)
  long long full_layer_pairs_ = 0;                  // routed pairs of layers without handoff
  long long tokens_ = 0;                            // tokens launched
  // Swaps.
  std::unique_ptr<SwapPolicy> swap_policy_;
  std::vector<SwapJob> swap_jobs_;
  std::vector<uint8_t> swap_busy_;                  // [layers * experts]: in a swap in flight
  cudaStream_t swap_stream_ = nullptr;
  unsigned long long* h_heat_ = nullptr;            // pinned: the last window's counts
  cudaEvent_t heat_ev_ = nullptr;
  bool heat_pending_ = false;
  std::vector<uint64_t> heat_host_;                 // counts taken off the device by the windows, not yet take_heat's
  long long window_start_ = 0;                      // tokens_ when the last window was read
  long long swaps_done_ = 0;
  uint64_t swap_bytes_ = 0;
};

}  // namespace coli::cuda::detail
