// One token's routed experts (a decode step, a hybrid layer's misses) as a
// single parallel run over two kinds of work units, with no barrier between
// them (CpuBackend::routed_experts_one_token):
//   gate/up units: 32 rows of one expert's gate and up projections;
//     the thread that finishes an expert's last unit makes its SiLU(gate) *
//     up activations and their int8 codes, and marks the expert ready;
//   down units: a block of output rows, for every expert as soon as it is
//     ready (its own rows: no reduction afterwards), the weighted sums added
//     in expert order at the end of the block.
// Threads take units from one counter, every gate/up unit before any down
// unit, so a down unit only waits for experts whose units are already
// running. Down blocks shrink towards the end (64, then 32, then 16 rows):
// the last units to finish are short, so no thread waits long for the
// slowest one (the weights come from DRAM at a few GB/s per core).
//
// Same arithmetic as routed_experts_fast (the same kernels on the same rows,
// the sums in the same order): bit-identical results. A split expert
// (ExpertPair::first_row) skips its gate/up units below the first row
// (their activations 0) and the down superblocks wholly below it.
#include <algorithm>
#include <atomic>
#include <numeric>
#include <thread>

#include <immintrin.h>

#include "cpu_backend.h"
#include "kernels_vnni.h"
#include "ref_kernels.h"
#include "thread_pool.h"

namespace coli::cpu {

namespace {
constexpr int kGateUpRows = 32;
// Down blocks: the first half of the rows in blocks of 64, the next quarter
// in 32, the rest in 16 (H = 2048: 16 + 16 + 32 = 64 units).
int down_blocks(int H, std::vector<int>* starts) {
  starts->clear();
  int r = 0;
  for (; r < H / 2; r += 64) starts->push_back(r);
  for (; r < H * 3 / 4; r += 32) starts->push_back(r);
  for (; r < H; r += 16) starts->push_back(r);
  starts->push_back(H);
  return static_cast<int>(starts->size()) - 1;
}
}  // namespace

bool CpuBackend::one_token_applies(const MoeWeights& moe, const ExpertPair* pairs, int n) const {
  if (!fast_ || n < 1 || n > s_.num_experts) return false;
  for (int i = 0; i < n; ++i) {
    if (pairs[i].token != 0) return false;
    const ExpertWeights& e = moe.experts[pairs[i].expert];
    if (!vnni_applies(e.gate, 1) || !vnni_applies(e.up, 1) || !vnni_applies(e.down, 1) || amx_applies(e.gate, 1)) return false;
  }
  for (int i = 0; i < n; ++i) {  // distinct experts (top-k routing gives them), splits in whole units
    if (pairs[i].first_row % kGateUpRows != 0) return false;
    for (int j = 0; j < i; ++j)
      if (pairs[i].expert == pairs[j].expert) return false;
  }
  return s_.moe_intermediate_size % kGateUpRows == 0 && s_.hidden_size % 64 == 0;
}

void CpuBackend::routed_experts_one_token(const MoeWeights& moe, const ExpertPair* pairs, int n, const float* hn, float* out) {
  const int H = s_.hidden_size, I = s_.moe_intermediate_size;
  if (!one_token_) one_token_ = std::make_unique<OneToken>();
  OneToken& w = *one_token_;
  if (w.capacity < n) {
    w.capacity = n;
    w.left = std::make_unique<std::atomic<int>[]>(n);
    w.ready = std::make_unique<std::atomic<int>[]>(n);
    w.act.resize(n);
  }
  w.gate.resize(static_cast<std::size_t>(n) * I), w.up.resize(w.gate.size());
  // Experts in ascending id: the order the sums are taken in.
  w.order.resize(n);
  std::iota(w.order.begin(), w.order.end(), 0);
  std::sort(w.order.begin(), w.order.end(), [&](int a, int b) { return pairs[a].expert < pairs[b].expert; });
  quantize_acts(hn, 1, H, &w.x);
  const int up_units = I / kGateUpRows;
  const int nd = w.down_start.empty() ? down_blocks(H, &w.down_start) : static_cast<int>(w.down_start.size()) - 1;  // H is the model's
  for (int i = 0; i < n; ++i) w.left[i].store(up_units, std::memory_order_relaxed), w.ready[i].store(0, std::memory_order_relaxed);
  w.next.store(0, std::memory_order_relaxed);
  const int units = n * up_units + nd;
  auto gate_up = [&](int u) {
    const int i = u / up_units;  // the i-th expert in id order
    const ExpertWeights& e = moe.experts[pairs[w.order[i]].expert];
    const int64_t r0 = int64_t(u % up_units) * kGateUpRows, r1 = r0 + kGateUpRows;
    float* g = w.gate.data() + static_cast<std::size_t>(i) * I;
    float* p = w.up.data() + static_cast<std::size_t>(i) * I;
    if (r1 <= pairs[w.order[i]].first_row) {  // the device's rows of a split expert: SiLU(0) * 0
      std::fill(g + r0, g + r1, 0.0f), std::fill(p + r0, p + r1, 0.0f);
    } else {
      matmul_rows_vnni(e.gate, w.x, r0, r1, g, 1);
      matmul_rows_vnni(e.up, w.x, r0, r1, p, 1);
    }
    if (w.left[i].fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    // The expert's last unit: its activations, then ready.
    thread_local std::vector<float> a;
    a.resize(I);
    for (int r = 0; r < I; ++r) a[r] = silu(g[r]) * p[r];
    quantize_acts(a.data(), 1, I, &w.act[i]);
    w.ready[i].store(1, std::memory_order_release);
  };
  auto down = [&](int b) {
    const int64_t r0 = w.down_start[b], r1 = w.down_start[b + 1];
    thread_local std::vector<float> y;  // [n][H]: each expert's rows of this block
    thread_local std::vector<uint8_t> done;
    y.resize(static_cast<std::size_t>(n) * H);
    done.assign(n, 0);
    // Each expert as soon as it is ready (the others' gate/up units are
    // running; with more threads than cores, the thread running one may be
    // waiting for this core: yield after a short spin).
    for (int left = n, spins = 0; left > 0;) {
      bool any = false;
      for (int i = 0; i < n; ++i) {
        if (done[i] || !w.ready[i].load(std::memory_order_acquire)) continue;
        const ExpertPair& pr = pairs[w.order[i]];
        matmul_rows_vnni(moe.experts[pr.expert].down, w.act[i], r0, r1, y.data() + static_cast<std::size_t>(i) * H, 1, pr.first_row);
        done[i] = 1, --left, any = true;
      }
      if (any) spins = 0;
      else if (++spins < 256) _mm_pause();
      else std::this_thread::yield();
    }
    for (int64_t r = r0; r < r1; ++r) {
      float o = 0;
      for (int i = 0; i < n; ++i) o += pairs[w.order[i]].weight * y[static_cast<std::size_t>(i) * H + r];
      out[r] = o;
    }
  };
  auto work = [&](int) {
    for (int u; (u = w.next.fetch_add(1, std::memory_order_relaxed)) < units;) {
      if (u < n * up_units) gate_up(u);
      else down(u - n * up_units);
    }
  };
  if (pool_) pool_->run(pool_->size(), work);
  else work(0);
}

}  // namespace coli::cpu
