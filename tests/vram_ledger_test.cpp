// The VRAM ledger (placement/vram_ledger.h): the CUDA backend's device
// arithmetic on the host. The tiny fixture's shapes with every size
// computed here by hand (chunk buffers, reserve, slots, the too-small
// budget), fill_tier's prefill shrink loop against a reference loop of the
// even spread, the ledger of a container's manifest against the ledger of
// its bound Model, and the planner's VRAM capacity (planner_inputs) against
// the ledger's slot count for several budgets, for the tiny fixture and a
// synthetic container with the real model's layouts (int4-g32 experts,
// top-8, head size 256, 128-wide DeltaNet heads, 3 linear layers per full
// one) at shrunk sizes (4 layers of 128 experts, hidden 256), and the
// planner's prefill-upload plan against the backend's shrink loop.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>

#include "convert/convert.h"
#include "convert/synth.h"
#include "cpu_expert_host.h"
#include "cuda_backend.h"
#include "cuda_device.h"
#include "engine_util.h"
#include "formats/container.h"
#include "model/model_spec.h"
#include "model/weights.h"
#include "placement/device_sizes.h"
#include "placement/plan.h"
#include "placement/plan_inputs.h"
#include "placement/planner.h"
#include "placement/vram_ledger.h"
#include "test_util.h"

namespace {

using coli::ChunkBuffers;
using coli::ExpertParts;
using coli::ModelSpec;
using coli::TensorDesc;
using coli::TierFill;
using coli::TierFillInputs;
using coli::VramLedger;
using coli::VramSettings;

constexpr uint64_t kMiB = uint64_t(1) << 20;

ModelSpec tiny_spec() { return coli::load_model_spec(coli::test::data_dir() + "/tiny-qwen35moe-text"); }

// Every table entry 1000 bytes (1024 padded); experts' parts as an int8
// tiny container has them: gate and up [32, 64], down [64, 32].
uint64_t thousand(const TensorDesc&) { return 1000; }
const ExpertParts kTinyParts{2176, 2176, 2304};
constexpr uint64_t kTinySlot = 3 * 2304;

}  // namespace

TEST(DeviceSizes, KernelWorkspaces) {
  for (int hd : {32, 64, 128, 256}) EXPECT_TRUE(coli::attention_split_supported(hd)) << hd;
  for (int hd : {16, 48, 96, 512}) EXPECT_FALSE(coli::attention_split_supported(hd)) << hd;
  int kps = 0;
  EXPECT_EQ(coli::attention_splits(1, 4096, &kps), 64);
  EXPECT_EQ(kps, 64);
  EXPECT_EQ(coli::attention_splits(1, 100, &kps), 2);
  EXPECT_EQ(kps, 50);
  EXPECT_EQ(coli::attention_splits(1, 1, &kps), 1);
  EXPECT_EQ(kps, 1);
  EXPECT_EQ(coli::attention_splits(1, 100000, &kps), 64);
  EXPECT_EQ(kps, 1563);
  EXPECT_EQ(coli::attention_splits(64, 4096, &kps), 1);
  EXPECT_EQ(kps, 4096);
  EXPECT_EQ(coli::float_tiled_slices(2048), 8);
  EXPECT_EQ(coli::float_tiled_slices(2049), 9);
  EXPECT_EQ(coli::float_tiled_work_floats(64, 256, 2048), 8u * 64 * 256);
  EXPECT_EQ(coli::float_tiled_work_floats(32, 16, 64), 32u * 16);
  EXPECT_EQ(coli::gdn_chunk_workspace_floats(64, 4, 16, 16), 64u * 4 * 98);
  EXPECT_EQ(coli::gdn_chunk_workspace_floats(512, 32, 128, 128), 512u * 32 * 322);
  EXPECT_EQ(coli::device_padded(0), 0u);
  EXPECT_EQ(coli::device_padded(1), 256u);
  EXPECT_EQ(coli::device_padded(256), 256u);
  EXPECT_EQ(coli::device_padded(2176), 2304u);
}

// The tiny fixture: hidden 64, 4 heads of 32 (2 KV), DeltaNet 2 key and 4
// value heads of 16, conv 4, 16 experts top-4 of 32, shared 48, vocab 512,
// 6 DeltaNet and 2 attention layers.
TEST(VramLedger, ChunkBuffersByHand) {
  const ModelSpec s = tiny_spec();
  ASSERT_EQ(s.num_layers, 8);
  ASSERT_EQ(s.num_attention_layers(), 2);
  const ChunkBuffers c = coli::chunk_buffers(s, 64, true);
  EXPECT_EQ(c.T, 64);
  for (std::size_t n : {c.x, c.hn, c.mix, c.sh, c.routed}) EXPECT_EQ(n, 64u * 64);
  EXPECT_EQ(c.proj, 64u * 256);      // max(4 * 32 * 2, conv_dim 2 * 32 + 64 = 128)
  EXPECT_EQ(c.z, 64u * 64);
  EXPECT_EQ(c.b, 64u * 4);
  EXPECT_EQ(c.a, 64u * 4);
  EXPECT_EQ(c.conv_out, 64u * 128);
  EXPECT_EQ(c.heads_out, 64u * 128);  // max(4 * 32, 64)
  EXPECT_EQ(c.k, 64u * 64);           // 2 KV heads of 32
  EXPECT_EQ(c.v, 64u * 64);
  EXPECT_EQ(c.rlogits, 64u * 16);
  EXPECT_EQ(c.ridx, 64u * 5);
  EXPECT_EQ(c.rw, 64u * 5);
  EXPECT_EQ(c.sg, 64u * 48);
  EXPECT_EQ(c.su, 64u * 48);
  EXPECT_EQ(c.sgate, 64u);
  EXPECT_EQ(c.act, 64u * 5 * 32);
  EXPECT_EQ(c.order, 64u * 4);
  EXPECT_EQ(c.offsets, 34u);  // the pairs' and the chunks' offsets
  EXPECT_EQ(c.ey, 64u * 4 * 64);
  EXPECT_EQ(c.router_work, 64u * 16);             // one slice of 64 columns
  EXPECT_EQ(c.gdn_work, 64u * 4 * (16 + 16 + 64 + 2));
  EXPECT_EQ(c.qx_codes, 64u * 5 * 32 + 32);       // act's 10240 beat 64 x widest (128)
  EXPECT_EQ(c.qx_scale, 10272u / 32 + 1);
  EXPECT_EQ(c.qx_sum, 10272u / 32 + 1);
  // The mixer's buffers and the MoE block's share one allocation, each
  // buffer 256-byte aligned: proj z b a conv_out heads_out k v gdn_work,
  // and rlogits router_work ridx rw sg su act order offsets (136 -> 256) ey.
  EXPECT_EQ(c.mixer_bytes(), 4u * (16384 + 4096 + 256 + 256 + 8192 + 8192 + 4096 + 4096 + 25088));
  EXPECT_EQ(c.moe_bytes(), 4u * (1024 + 1024 + 320 + 320 + 3072 + 3072 + 10240 + 256 + 16384) + 256);
  EXPECT_EQ(c.shared_bytes(), c.mixer_bytes());
  const uint64_t floats = 5 * 4096 + 64 + 322;  // x hn mix sh routed, sgate, qx_scale
  EXPECT_EQ(c.bytes(), 282624 + 4 * floats + 4 * 322 + 10272);

  // A decode step: no grouped outputs (1 float), no tiled router work; the
  // DeltaNet workspace all the same (the backend sizes it for any T).
  const ChunkBuffers one = coli::chunk_buffers(s, 1, true);
  EXPECT_EQ(one.ey, 1u);
  EXPECT_EQ(one.router_work, 0u);
  EXPECT_EQ(one.gdn_work, 98u * 4);
  EXPECT_EQ(one.qx_codes, 160u + 32);  // max(128, 5 * 32)
  // Below the tiled router's 32 tokens, and without the chunked DeltaNet.
  const ChunkBuffers eight = coli::chunk_buffers(s, 8, false);
  EXPECT_EQ(eight.ey, 8u * 4 * 64);
  EXPECT_EQ(eight.router_work, 0u);
  EXPECT_EQ(eight.gdn_work, 0u);
}

TEST(VramLedger, ReserveArenaAndSlotsByHand) {
  const ModelSpec s = tiny_spec();
  VramSettings run;
  run.budget = 64 * kMiB, run.n_ctx = 256, run.max_chunk = 64;
  const VramLedger ledger(s, thousand, kTinyParts, run);
  // 3 model-level entries, 16 in a DeltaNet layer (2 norms, 5 matrices, 4
  // vectors, router, the shared expert's 3 matrices and gate), 13 in an
  // attention layer (2 norms, 4 matrices, 2 norms, the same 5).
  EXPECT_EQ(ledger.arena(), (3 + 6 * 16 + 2 * 13) * 1024u);
  EXPECT_EQ(ledger.inv_freq(), 4u * 4);  // rotary dim 8
  EXPECT_EQ(ledger.slot().bytes(), kTinySlot);
  EXPECT_EQ(ledger.slot().up_offset(), 2304u);
  EXPECT_EQ(ledger.slot().down_offset(), 4608u);
  EXPECT_EQ(ledger.buffers().bytes(), coli::chunk_buffers(s, 64, true).bytes());
  const coli::RuntimeReserve& r = ledger.reserve();
  EXPECT_EQ(r.kv, 2u * 256 * 64 * 2 * 4);
  EXPECT_EQ(r.state, 6u * (3 * 128 + 4 * 16 * 16) * 4);
  // Split-KV (head size 32): a decode step's 4 splits of 64 keys (4 x 34 x
  // 4 floats) or a 64-token chunk's one (64 x 4 x 34).
  EXPECT_EQ(r.attention_scratch, 64u * 4 * 34 * 4);
  EXPECT_EQ(r.logits, 512u * 4 + 128 * 12 + 4);  // and the greedy ids' partials and id
  EXPECT_EQ(r.fixed, 8 * kMiB);
  EXPECT_EQ(r.pcie_read_tables, 0u);
  EXPECT_EQ(r.decode_upload, 0u);
  EXPECT_EQ(r.runtime(), 262144u + 33792 + 34816 + 2048 + 1540 + 8 * kMiB);
  EXPECT_EQ(r.total(), r.runtime());
  const uint64_t before = ledger.arena() + 16 + ledger.buffers().bytes();
  EXPECT_EQ(ledger.before_slots(), before);
  EXPECT_EQ(ledger.device_floor(), before + r.total() + kTinySlot);

  // Slots: (avail - reserve) / slot - 1, slot 0 being the zero expert.
  const uint64_t floor = ledger.device_floor();
  EXPECT_EQ(ledger.expert_slots(floor), 0);
  EXPECT_EQ(ledger.expert_slots(floor + kTinySlot - 1), 0);
  EXPECT_EQ(ledger.expert_slots(floor + kTinySlot), 1);
  EXPECT_EQ(ledger.expert_slots(floor + 10 * kTinySlot + 100), 10);
  EXPECT_EQ(ledger.expert_slots(0), 128) << "no limit: every expert";
  const TierFill f = ledger.fill(floor + 10 * kTinySlot + 100);
  EXPECT_TRUE(f.fits);
  EXPECT_EQ(f.slots, 10);
  EXPECT_EQ(f.plan.count, 10);
  EXPECT_FALSE(f.prefill);
  EXPECT_EQ(f.slot_array, 11 * kTinySlot);
  const TierFill all = ledger.fill(floor + 200 * kTinySlot);
  EXPECT_TRUE(all.plan.all());
  EXPECT_EQ(all.slot_array, 128 * kTinySlot) << "every expert resident: no zero expert";
  EXPECT_EQ(ledger.fill(uint64_t{0}).plan.count, 128);

  // The score-buffer kernel instead: T x heads x n_ctx floats.
  VramSettings scores = run;
  scores.split_kv = false;
  EXPECT_EQ(VramLedger(s, thousand, kTinyParts, scores).reserve().attention_scratch, 64u * 4 * 256 * 4);
  // The PCIe reads' one-token tables and the decode upload's slots.
  VramSettings extras = run;
  extras.pcie_read_share = 0.35, extras.decode_upload_max = 2;
  const coli::RuntimeReserve x = VramLedger(s, thousand, kTinyParts, extras).reserve();
  EXPECT_EQ(x.pcie_read_tables, 8u * (18 * 3 * 8 + 16 + 768));
  EXPECT_EQ(x.decode_upload, 2 * kTinySlot + (2 * 32 + 64 + 2) * 12 + 2 * kMiB);
  EXPECT_EQ(x.total(), x.runtime() + x.pcie_read_tables + x.decode_upload);
  // n_ctx 0 is the backend's 4096.
  VramSettings dflt = run;
  dflt.n_ctx = 0;
  EXPECT_EQ(VramLedger(s, thousand, kTinyParts, dflt).reserve().kv, 2u * 4096 * 64 * 2 * 4);
  // Three sessions at once (coli-serve --parallel 3): three caches and
  // states, a rows step's three logits rows and its attention partials
  // (3 tokens x 4 heads x (32 + 2) floats a split), the rest as for one;
  // the slots give way by their bytes.
  VramSettings three = run;
  three.sequences = 3;
  const VramLedger l3(s, thousand, kTinyParts, three);
  EXPECT_EQ(l3.reserve().kv, 3 * r.kv);
  EXPECT_EQ(l3.reserve().state, 3 * r.state);
  EXPECT_EQ(l3.reserve().logits, 3 * r.logits);
  int kps = 0;
  const uint64_t rows_scratch = 3u * 4 * 34 * coli::attention_splits(3, 256, &kps) * 4;
  EXPECT_EQ(l3.reserve().attention_scratch, std::max(r.attention_scratch, rows_scratch));
  const uint64_t more = 2 * (262144u + 33792 + 2048 + 128 * 12 + 4) + (l3.reserve().attention_scratch - r.attention_scratch);
  EXPECT_EQ(l3.reserve().total(), r.total() + more);
  EXPECT_EQ(l3.expert_slots(floor + 200 * kTinySlot), 200 - static_cast<long long>((more + kTinySlot - 1) / kTinySlot));
  three.sequences = 0;
  EXPECT_EQ(VramLedger(s, thousand, kTinyParts, three).reserve().total(), r.total()) << "0: one";
  // Untiered (no budget, no forced slots): the experts are in the arena.
  VramSettings whole = run;
  whole.budget = 0;
  EXPECT_EQ(VramLedger(s, thousand, kTinyParts, whole).arena(), (125 + 8 * 16 * 3) * 1024u);
}

TEST(VramLedger, TooSmallBudget) {
  const ModelSpec s = tiny_spec();
  VramSettings run;
  run.budget = 1, run.n_ctx = 256, run.max_chunk = 64;  // tiered; the budgets below are fill's and expert_slots'

  const VramLedger ledger(s, thousand, kTinyParts, run);
  const uint64_t floor = ledger.device_floor();
  EXPECT_EQ(ledger.expert_slots(floor - 1), -1);
  const TierFill f = ledger.fill(floor - 1);
  EXPECT_FALSE(f.fits);
  EXPECT_EQ(f.need, ledger.reserve().total() + kTinySlot);
  EXPECT_EQ(f.plan.count, 0);
  EXPECT_FALSE(ledger.fill(1).fits) << "less than the trunk";
  EXPECT_EQ(ledger.expert_slots(1), -1);
  // Forced slots need the reserve and the zero expert all the same.
  VramSettings forced = run;
  forced.budget = 0, forced.expert_slots = 5;
  const VramLedger fl(s, thousand, kTinyParts, forced);
  EXPECT_EQ(fl.expert_slots(floor - 1), -1);
  EXPECT_EQ(fl.expert_slots(floor), 5);
  EXPECT_EQ(fl.fill(floor).plan.count, 5);
  EXPECT_EQ(fl.fill(uint64_t{0}).plan.count, 5);
}

// 4 layers x 4 experts, slots of 1000 bytes, tables 4 x (5 x 24 + 2 x 4 +
// 4 x 24) + 8 = 904 (pointers, flags, the host's choice and addresses, one
// counter): 13000 bytes give 12 slots; each step down one slot (12 / 64 =
// 0) until the residents and two areas of the most experts a layer leaves
// out fit: 5 (2, 1, 1, 1) leave 3 out: 6000 + 6000 + 904 <= 13000.
TEST(VramLedger, PrefillShrinkLoop) {
  TierFillInputs in;
  in.layers = 4, in.experts = 4, in.slot = 1000, in.reserve = 0, in.avail = 13000, in.prefill_upload = true;
  TierFill f = coli::fill_tier(in);
  ASSERT_TRUE(f.fits);
  EXPECT_TRUE(f.prefill);
  EXPECT_EQ(f.slots, 5);
  EXPECT_EQ(f.plan.count, 5);
  EXPECT_EQ(f.stage_slots, 3);
  EXPECT_EQ(f.stage_bytes, 6000u);
  EXPECT_EQ(f.prefill_tables, 904u);
  EXPECT_EQ(f.slot_array, 6000u);
  // The reserve comes first.
  in.reserve = 2000, in.avail = 15000;
  EXPECT_EQ(coli::fill_tier(in).plan.count, 5);
  in.reserve = 0, in.avail = 13000;
  // Swaps: every area keeps all 4 experts of a layer (the most left out
  // + 8, at most 4) while anything is resident: 3 residents, 4000 + 8000 +
  // 496 <= 13000.
  in.swap = true;
  f = coli::fill_tier(in);
  EXPECT_TRUE(f.prefill);
  EXPECT_EQ(f.plan.count, 3);
  EXPECT_EQ(f.stage_slots, 4);
  // Not even the staging fits (3000: 2 slots, then 1, then 0 with 8000 of
  // staging): the uploads go, every slot stays.
  in.swap = false, in.avail = 3000;
  f = coli::fill_tier(in);
  EXPECT_TRUE(f.fits);
  EXPECT_FALSE(f.prefill);
  EXPECT_EQ(f.slots, 2);
  EXPECT_EQ(f.plan.count, 2);
  EXPECT_EQ(f.stage_bytes, 0u);
  EXPECT_EQ(f.prefill_tables, 0u);
  // Forced slots do not shrink: the uploads go if they do not fit.
  in.avail = 13000, in.expert_slots = 12;
  f = coli::fill_tier(in);
  EXPECT_FALSE(f.prefill);
  EXPECT_EQ(f.plan.count, 12);
  // No limit: no shrink either (the areas are charged as they come).
  in.expert_slots = -1, in.avail = std::numeric_limits<uint64_t>::max();
  f = coli::fill_tier(in);
  EXPECT_EQ(f.plan.count, 16);
  EXPECT_FALSE(f.prefill) << "every expert resident: nothing to upload";
}

// A ring of 1 slot per area (grouped expert kernels: a layer's misses come
// one at a time): 13000 bytes, 12 slots; down one slot at a time until
// slot 0, the residents, 2 x 1 staging slots and the tables fit: 9
// residents (10000 + 2000 + 480), the swaps in flight keeping no room. At
// 4000 bytes the uploads still fit with no resident (1000 + 2000 + 480),
// where the areas sized for a whole layer's misses (8000) could not.
TEST(VramLedger, PrefillRingTakesFewSlots) {
  TierFillInputs in;
  in.layers = 4, in.experts = 4, in.slot = 1000, in.reserve = 0, in.avail = 13000, in.prefill_upload = true, in.swap = true, in.prefill_ring = 1;
  TierFill f = coli::fill_tier(in);
  ASSERT_TRUE(f.fits);
  EXPECT_TRUE(f.prefill);
  EXPECT_EQ(f.plan.count, 9);
  EXPECT_EQ(f.stage_slots, 1);
  EXPECT_EQ(f.stage_bytes, 2000u);
  in.avail = 4000;
  f = coli::fill_tier(in);
  EXPECT_TRUE(f.prefill);
  EXPECT_EQ(f.plan.count, 0);
  EXPECT_EQ(f.stage_slots, 1);
  in.prefill_ring = 0;
  EXPECT_FALSE(coli::fill_tier(in).prefill) << "without a ring the areas hold a layer's 4 misses each";
  // The ring's size is at most the most misses of a layer.
  in.prefill_ring = 16, in.avail = 13000;
  f = coli::fill_tier(in);
  EXPECT_TRUE(f.prefill);
  EXPECT_LE(f.stage_slots, 4);
  coli::TierPlan tp = f.plan;
  int most = 0;
  for (int l = 0; l < 4; ++l) most = std::max(most, 4 - tp.resident_in_layer(l));
  EXPECT_EQ(f.stage_slots, most);
  // A large room takes larger groups: a sixteenth of it per area.
  EXPECT_EQ(coli::prefill_ring_size(16, 100), 16);
  EXPECT_EQ(coli::prefill_ring_size(16, 1000), 62);
  EXPECT_EQ(coli::prefill_ring_size(0, 1000), 0) << "no ring";
  // 4 x 128 experts, 299 slots before the staging: areas of 299 / 16 = 18;
  // the tier shrinks in steps of a sixty-fourth until 18 x 2 + the tables
  // (4 x (129 x 24 + 2 x 128 + 128 x 24) + 8 = 25704) fit.
  in.layers = 4, in.experts = 128, in.slot = 1000, in.avail = 300000, in.prefill_ring = 4, in.swap = false;
  f = coli::fill_tier(in);
  EXPECT_TRUE(f.prefill);
  EXPECT_EQ(f.stage_slots, 18);
  EXPECT_EQ(coli::prefill_table_bytes(4, 128), 25704u);
  EXPECT_LE((f.plan.count + 1) * 1000 + 2 * 18 * 1000 + 25704, 300000);
  EXPECT_GT((f.plan.count + 5) * 1000 + 2 * 18 * 1000 + 25704, 300000) << "one step of 4 slots more would not fit";
}

// Steps of slots / 64: 8 layers x 64 experts with even spread, against a
// reference loop whose layer with the fewest residents holds slots / 8
// (rounded down) of them.
TEST(VramLedger, PrefillShrinkStepsOfASixtyFourth) {
  const int L = 8, E = 64;
  const uint64_t slot = 1000, tables = coli::prefill_table_bytes(L, E);
  for (uint64_t avail : {400'000ull, 420'500ull, 470'000ull, 500'123ull}) {
    TierFillInputs in;
    in.layers = L, in.experts = E, in.slot = slot, in.avail = avail, in.prefill_upload = true;
    const TierFill f = coli::fill_tier(in);
    long long slots = static_cast<long long>(avail / slot) - 1, steps = 0;
    auto fits = [&](long long c) { return (c + 1) * slot + 2 * uint64_t(E - c / L) * slot + tables <= avail; };
    while (!fits(std::min<long long>(slots, L * E)) && slots > 0) slots = std::max(0LL, slots - std::max(1LL, slots / 64)), ++steps;
    ASSERT_TRUE(fits(slots)) << avail;
    EXPECT_GE(steps, 2) << avail;
    EXPECT_TRUE(f.prefill) << avail;
    EXPECT_EQ(f.slots, slots) << avail;
    EXPECT_EQ(f.plan.count, slots) << avail;
    EXPECT_EQ(f.stage_slots, E - slots / L) << avail;
  }
}

namespace {

// A converted tiny fixture and a synthetic container with the real
// model's layouts at shrunk sizes.
struct Fixture {
  std::string name, path;
  std::unique_ptr<coli::Container> c;
  ModelSpec s;
};

std::vector<Fixture>& fixtures() {
  static coli::test::TempDir dir;
  static std::vector<Fixture> f = [] {
    std::vector<Fixture> v(2);
    v[0].name = "tiny", v[0].path = dir / "tiny.coli";
    coli::test::convert_all(coli::test::data_dir() + "/tiny-qwen35moe-text", v[0].path, coli::QuantFormat::I8);
    coli::SynthOptions so;
    so.layers = 4, so.vocab = 1000, so.hidden = 256, so.experts = 128, so.top_k = 8, so.moe_inter = 128, so.shared_inter = 128;
    so.heads = 4, so.kv_heads = 2, so.head_dim = 256, so.lin_k_heads = 2, so.lin_v_heads = 4, so.lin_k_dim = 128, so.lin_v_dim = 128;
    coli::ConvertOptions co;
    co.experts = co.down = coli::QuantFormat::I4_G32, co.verify = false, co.threads = 2;
    v[1].name = "synthetic", v[1].path = dir / "synth.coli";
    coli::write_synthetic_container(v[1].path, so, co);
    for (Fixture& x : v) {
      x.c = std::make_unique<coli::Container>(x.path);
      x.s = coli::parse_model_spec(x.c->config_json(), x.path);
    }
    return v;
  }();
  return f;
}

}  // namespace

TEST(VramLedger, EmbeddingOnTheHostUnderATier) {
  using coli::QuantFormat;
  for (QuantFormat f : {QuantFormat::F32, QuantFormat::BF16, QuantFormat::F16}) {
    EXPECT_TRUE(coli::embedding_on_host(true, f));
    EXPECT_FALSE(coli::embedding_on_host(false, f)) << "a whole model keeps it on the device";
  }
  for (QuantFormat f : {QuantFormat::I8, QuantFormat::I4_G32}) EXPECT_FALSE(coli::embedding_on_host(true, f)) << "rows with scales stay";
}

// The planner reads the manifest, the backend the bound model: one ledger.
TEST(VramLedger, ContainerAndModelAgree) {
  for (const Fixture& x : fixtures()) {
    const auto model = coli::Model::load(x.path);
    for (int tiered = 0; tiered < 2; ++tiered) {
      VramSettings run;
      run.budget = tiered ? 1 << 30 : 0, run.n_ctx = 1024, run.max_chunk = 128, run.prefill_upload = true, run.swap = true;
      const VramLedger a(*x.c, x.s, run), b(*model, run);
      EXPECT_EQ(a.arena(), b.arena()) << x.name;
      EXPECT_EQ(a.slot().bytes(), b.slot().bytes()) << x.name;
      EXPECT_EQ(a.buffers().bytes(), b.buffers().bytes()) << x.name;
      EXPECT_EQ(a.reserve().total(), b.reserve().total()) << x.name;
      EXPECT_EQ(a.device_floor(), b.device_floor()) << x.name;
      EXPECT_EQ(a.fill(run.budget).plan.count, b.fill(run.budget).plan.count) << x.name;
    }
    // Under a tier a plain embedding stays on the host: the arena is the
    // tiered one less its padded bytes.
    VramSettings tier;
    tier.budget = 1 << 30;
    const uint64_t with_embed = coli::arena_bytes(x.s, coli::tensor_bytes_of(*model), true);
    const uint64_t embed = coli::device_padded(model->embed().bytes());
    const bool host = coli::embedding_on_host(true, model->embed().format);
    EXPECT_EQ(VramLedger(*model, tier).arena(), host ? with_embed - embed : with_embed) << x.name;
    EXPECT_EQ(VramLedger(*x.c, x.s, tier).arena(), VramLedger(*model, tier).arena()) << x.name;
    EXPECT_EQ(VramLedger(*model, VramSettings{}).arena(), coli::arena_bytes(x.s, coli::tensor_bytes_of(*model), false)) << "no tier: on the device";
    // The padded slot holds the three parts of any expert.
    const coli::ExpertWeights& e = model->layer(x.s.num_layers - 1).moe.experts.back();
    const VramLedger l(*model, VramSettings{});
    EXPECT_GE(l.slot().gate, e.gate.bytes());
    EXPECT_GE(l.slot().up, e.up.bytes());
    EXPECT_GE(l.slot().down, e.down.bytes());
    EXPECT_EQ(l.slot().bytes() % 256, 0u);
  }
}

// planner_inputs: vram_bytes / slot_bytes is the backend's slot count for
// every budget, and the plan puts that many experts in VRAM (RAM holding
// the rest); device_needs is the ledger's floor.
TEST(VramLedger, PlannerCountsTheBackendsSlots) {
  for (const Fixture& x : fixtures()) {
    const int ctx = 512, chunk = 64;
    VramSettings run;
    run.n_ctx = ctx, run.max_chunk = chunk, run.swap = true;
    run.budget = 1;  // tiered
    const VramLedger ledger(*x.c, x.s, run);
    EXPECT_EQ(coli::device_needs(*x.c, x.s, ctx, chunk).total(), ledger.device_floor()) << x.name;
    const uint64_t floor = ledger.device_floor(), slot = ledger.slot().bytes(), n = uint64_t(x.s.num_layers) * x.s.num_experts;
    for (uint64_t budget : {floor / 2, floor - 1, floor, floor + slot - 1, floor + slot, floor + 7 * slot + 13, floor + (n / 3) * slot + slot / 2,
                            floor + n * slot, floor + (n + 1) * slot, 2 * floor + 2 * n * slot}) {
      const long long slots = ledger.expert_slots(budget);
      coli::PlannerInputs in = coli::planner_inputs(*x.c, x.s, budget, n * 1'000'000, ctx, chunk);
      EXPECT_EQ(in.slot_bytes, slot);
      EXPECT_EQ(static_cast<long long>(in.vram_bytes / in.slot_bytes), std::max(0LL, slots)) << x.name << " budget " << budget;
      EXPECT_EQ(coli::plan_placement(in).count(coli::Tier::kVram), std::min<long long>(n, std::max(0LL, slots))) << x.name << " budget " << budget;
      EXPECT_EQ(ledger.fill(budget).plan.count, std::min<long long>(n, std::max(0LL, slots))) << x.name << " budget " << budget;
    }
  }
}

// With prefill uploads the planner's plan and its staging fit the budget
// as the backend checks it (reserve, slot 0, residents, two areas, tables).
TEST(VramLedger, PlannerPrefillPlanFitsTheBackendsCheck) {
  for (const Fixture& x : fixtures()) {
    const int ctx = 512, chunk = 64;
    VramSettings run;
    run.n_ctx = ctx, run.max_chunk = chunk, run.swap = true, run.prefill_upload = true, run.budget = 1;
    const VramLedger ledger(*x.c, x.s, run);
    const uint64_t floor = ledger.device_floor(), slot = ledger.slot().bytes(), n = uint64_t(x.s.num_layers) * x.s.num_experts;
    for (uint64_t k : {n / 4, n / 2, 3 * n / 4, n - 1}) {
      const uint64_t budget = floor + k * slot;
      coli::PlannerInputs in = coli::planner_inputs(*x.c, x.s, budget, n * 1'000'000, ctx, chunk, true);
      EXPECT_EQ(in.prefill_table_bytes, coli::prefill_table_bytes(x.s.num_layers, x.s.num_experts));
      const coli::Plan p = coli::plan_placement(in);
      coli::TierPlan tp;
      tp.layers = x.s.num_layers, tp.experts = x.s.num_experts, tp.count = p.count(coli::Tier::kVram);
      tp.resident.resize(n);
      for (std::size_t i = 0; i < n; ++i) tp.resident[i] = p.tier[i] == coli::Tier::kVram;
      const uint64_t used = ledger.before_slots() + ledger.reserve().total() + slot * (tp.count + 1) +
                            2 * uint64_t(coli::prefill_stage_slots(tp, true, ledger.prefill_ring())) * slot + in.prefill_table_bytes;
      // Fewer than every slot: the planner kept the uploads, whose staging then fits.
      const long long slots = ledger.expert_slots(budget);
      EXPECT_LE(tp.count, slots) << x.name << " k " << k;
      if (tp.count < slots) {
        EXPECT_LE(used, budget) << x.name << " k " << k;
      }
    }
  }
}

// What coli-run --plan does with the plan: its VRAM experts first as the
// heat of the backend's tier (plan_as_heat), whose fill_tier then keeps as
// many as the planner put in VRAM, shrink loop and all (steps of a
// sixty-fourth from 64 slots up in the synthetic model), with or without
// the uploads.
TEST(VramLedger, PlannerPrefillCountIsTheBackends) {
  for (const Fixture& x : fixtures()) {
    VramSettings run;
    run.n_ctx = 512, run.max_chunk = 64, run.swap = true, run.prefill_upload = true, run.budget = 1;
    const VramLedger ledger(*x.c, x.s, run);
    const uint64_t floor = ledger.device_floor(), slot = ledger.slot().bytes(), n = uint64_t(x.s.num_layers) * x.s.num_experts;
    int uploads = 0;
    for (uint64_t k = 0; k <= n; k += std::max<uint64_t>(1, n / 32)) {
      const uint64_t budget = floor + k * slot + slot / 3;
      const coli::Plan p = coli::plan_placement(coli::planner_inputs(*x.c, x.s, budget, n * 1'000'000, 512, 64, true));
      const std::vector<uint64_t> heat = coli::plan_as_heat(p);
      const TierFill f = ledger.fill(budget, &heat);
      EXPECT_EQ(p.count(coli::Tier::kVram), f.plan.count) << x.name << " k " << k;
      for (std::size_t i = 0; i < n; ++i)
        if (f.plan.resident[i] != (p.tier[i] == coli::Tier::kVram)) {
          ADD_FAILURE() << x.name << " k " << k << ": pair " << i << " resident in one, not the other";
          break;
        }
      uploads += f.prefill;
    }
    EXPECT_GT(uploads, 4) << x.name;
  }
}

// On a device (skipped without one): the backend's tier holds the
// ledger's residents for every budget, refuses the budgets below its
// floor, and charges exactly the ledger's bytes by the end of its
// constructor (the arena, the rotary frequencies and the chunk buffers
// before the slots; then the slots, per layer the resident flags and the
// three pointer tables (the tiny fixture's shared expert does not fold
// in: E entries), the ids and the routing heat, and the prefill uploads'
// areas and tables when they stay on).
TEST(VramLedgerCuda, TheBackendHoldsTheLedgersSlots) {
  std::string why;
  if (coli::cuda::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  coli::test::TempDir d;
  for (coli::QuantFormat format : {coli::QuantFormat::I4_G32, coli::QuantFormat::I8}) {
    const auto m = coli::test::convert_all(coli::test::data_dir() + "/tiny-qwen35moe-text", d / (std::string(coli::format_name(format)) + ".coli"), format);
    const ModelSpec& s = m->spec();
    const uint64_t L = s.num_layers, E = s.num_experts;
    for (bool prefill : {false, true}) {
      VramSettings run;
      run.budget = 1, run.n_ctx = 512, run.max_chunk = 64, run.prefill_upload = prefill, run.swap = false;
      const VramLedger ledger(*m, run);
      const uint64_t floor = ledger.device_floor(), slot = ledger.slot().bytes();
      for (uint64_t budget : {floor - 1, floor, floor + slot + 100, floor + 17 * slot, floor + 64 * slot + slot / 2, floor + 100 * slot,
                              floor + 127 * slot, floor + 128 * slot, floor + 200 * slot}) {
        SCOPED_TRACE(std::string(coli::format_name(format)) + " budget " + std::to_string(budget) + " prefill " + std::to_string(prefill));
        coli::cuda::CudaOptions o;
        o.vram_budget = budget, o.n_ctx = run.n_ctx, o.max_chunk = run.max_chunk, o.prefill_upload = prefill;
        o.expert_host = std::make_shared<coli::cpu::CpuExpertHost>(*m, 2);
        const TierFill f = ledger.fill(budget);
        std::unique_ptr<coli::Backend> b;
        try {
          b = coli::cuda::make_cuda_backend(*m, o);
        } catch (const coli::Error& e) {
          EXPECT_FALSE(f.fits) << e.what();
          continue;
        }
        EXPECT_TRUE(f.fits);
        const coli::TierStats ts = b->tier_stats();
        EXPECT_EQ(ts.resident, f.plan.count);
        // After the slots: the expert tables and flags, the ids (a position, max_chunk ids, a segments
        // step's positions), the heat and the router's ticket (route.cuh).
        const uint64_t expected = ledger.before_slots() + f.slot_array + L * E + L * 3 * 8 * E + (2 * run.max_chunk + 1) * 4 + L * E * 8 + 4 +
                                  (f.prefill ? f.stage_bytes + f.prefill_tables : 0);
        EXPECT_EQ(ts.vram_peak, expected);
      }
    }
  }
}
