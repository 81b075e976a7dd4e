// The CPU side of hybrid decode: one layer's routed experts for one token
// (k distinct experts, as many as the model routes), computed by the CPU
// backend from host memory, layers taken in turn so the weights come from
// DRAM, not the caches. bytes_per_second counts the experts' blob bytes,
// the roofline quantity (host bytes per token over the host read rate).
//
// Needs a container: COLI_BENCH_MODEL=PATH (e.g. coli-convert synth -o).
// Arg 0, three sources of the same bytes: the container's file mapping
// (page cache) and private anonymous copies that asked for transparent huge
// pages (MADV_HUGEPAGE) or refused them (MADV_NOHUGEPAGE, as a coli-pin
// mirror's shared memory is mapped), so the cost of page walks shows. Arg 1: threads. Arg 2: the one-token run (1) or the two
// parallel runs (0) of CpuBackend::routed_experts.
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include <immintrin.h>

#include "cpu_backend.h"
#include "kernels_vnni.h"
#include "thread_pool.h"
#include "formats/container.h"
#include "model/model_spec.h"
#include "model/weights.h"

namespace {

using namespace coli;

// A container's tensors copied into one anonymous huge-page arena.
class AnonCopySource : public TensorSource {
 public:
  AnonCopySource(std::shared_ptr<Container> c, bool huge) : c_(std::move(c)) {
    size_ = 0;
    for (const std::string& n : c_->names()) size_ += (c_->find(n)->nbytes + 4095) / 4096 * 4096;
    size_ = (size_ + (2u << 20) - 1) / (2u << 20) * (2u << 20);
    void* p = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap");
    madvise(p, size_, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    arena_ = static_cast<uint8_t*>(p);
  }
  ~AnonCopySource() override { munmap(arena_, size_); }
  const SourceTensor* find(const std::string& name) override {
    auto it = copies_.find(name);
    if (it != copies_.end()) return &it->second;
    const SourceTensor* t = c_->find(name);
    if (!t) return nullptr;
    SourceTensor copy = *t;
    std::memcpy(arena_ + used_, t->data, t->nbytes);
    copy.data = arena_ + used_;
    used_ += (t->nbytes + 4095) / 4096 * 4096;
    return &copies_.emplace(name, copy).first->second;
  }
  std::vector<std::string> names() const override { return c_->names(); }
  std::string where() const override { return c_->where(); }

 private:
  std::shared_ptr<Container> c_;
  uint8_t* arena_ = nullptr;
  std::size_t size_ = 0, used_ = 0;
  std::map<std::string, SourceTensor> copies_;
};

// source 0: the container's mapping; 1: an anonymous copy in huge pages;
// 2: one in 4 KiB pages (as a shared-memory mirror is mapped).
std::unique_ptr<Model> load_model(int source) {
  const char* path = std::getenv("COLI_BENCH_MODEL");
  if (!path) return nullptr;
  auto c = std::make_shared<Container>(path);
  if (source == 0) return Model::bind_container(*c, c, path);
  return Model::bind_container(*c, std::make_shared<AnonCopySource>(c, source == 1), path);
}

// k distinct experts of E, drawn uniformly (a layer's routing for one token).
std::vector<int> pick_experts(std::mt19937& rng, int k, int E) {
  std::vector<int> picked;
  while (static_cast<int>(picked.size()) < k) {
    const int e = static_cast<int>(rng() % E);
    if (std::find(picked.begin(), picked.end(), e) == picked.end()) picked.push_back(e);
  }
  return picked;
}

void BM_HostExperts(benchmark::State& st) {
  const int anon = static_cast<int>(st.range(0));
  const int threads = static_cast<int>(st.range(1));
  const bool one_run = st.range(2) != 0;  // CpuOptions::one_token_run
  static std::unique_ptr<Model> models[3];
  if (!models[anon]) models[anon] = load_model(anon);
  if (!models[anon]) {
    st.SkipWithError("set COLI_BENCH_MODEL to a container");
    return;
  }
  const Model& m = *models[anon];
  const ModelSpec& s = m.spec();
  cpu::CpuOptions o{threads, true};
  o.one_token_run = one_run;
  cpu::CpuBackend cpu(m, o);
  std::mt19937 rng(7);
  std::vector<float> hn(s.hidden_size), out(s.hidden_size);
  std::normal_distribution<float> nd;
  for (float& v : hn) v = nd(rng);
  const int k = s.num_experts_per_tok;
  std::vector<ExpertPair> pairs(k);
  std::size_t bytes = 0;
  int layer = 0;
  for (auto _ : st) {
    const std::vector<int> picked = pick_experts(rng, k, s.num_experts);
    for (int i = 0; i < k; ++i) {
      pairs[i] = ExpertPair{0, picked[i], 1.0f / k};
      const ExpertWeights& w = m.layer(layer).moe.experts[picked[i]];
      bytes += w.gate.bytes() + w.up.bytes() + w.down.bytes();
    }
    cpu.routed_experts(layer, pairs.data(), k, hn.data(), out.data());
    benchmark::DoNotOptimize(out.data());
    layer = (layer + 1) % s.num_layers;
  }
  st.SetBytesProcessed(static_cast<int64_t>(bytes));
  const char* source[] = {"container-mapping", "anon-hugepage-copy", "anon-4k-copy"};
  st.SetLabel(std::string(source[anon]) + (one_run ? ", one run" : ", two runs"));
}
BENCHMARK(BM_HostExperts)->ArgsProduct({{0, 1, 2}, {8, 14, 15, 16}, {0, 1}})->Unit(benchmark::kMicrosecond)->UseRealTime();

// The same experts' bytes only read (64-byte loads summed), split like the
// expert kernels' jobs: the bound the access pattern allows.
__attribute__((target("avx512f"))) float sum512(const uint8_t* p, std::size_t n) {
  __m512 a = _mm512_setzero_ps(), b = a;
  for (std::size_t i = 0; i + 128 <= n; i += 128) {
    a = _mm512_add_ps(a, _mm512_loadu_ps(reinterpret_cast<const float*>(p + i)));
    b = _mm512_add_ps(b, _mm512_loadu_ps(reinterpret_cast<const float*>(p + i + 64)));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(a, b));
}

void BM_HostExpertsStream(benchmark::State& st) {
  const int threads = static_cast<int>(st.range(1));
  const int64_t chunk = st.range(0);
  static std::unique_ptr<Model> model;
  if (!model) model = load_model(0);
  if (!model) {
    st.SkipWithError("set COLI_BENCH_MODEL to a container");
    return;
  }
  const ModelSpec& s = model->spec();
  cpu::ThreadPool pool(threads);
  std::mt19937 rng(7);
  std::size_t bytes = 0;
  int layer = 0;
  std::vector<float> sums(4096);
  for (auto _ : st) {
    std::vector<std::pair<const uint8_t*, std::size_t>> jobs;
    for (int e : pick_experts(rng, s.num_experts_per_tok, s.num_experts)) {
      const ExpertWeights& w = model->layer(layer).moe.experts[e];
      for (const Matrix* m : {&w.gate, &w.up, &w.down}) {
        for (std::size_t o = 0; o < m->bytes(); o += chunk) jobs.push_back({m->data + o, std::min<std::size_t>(chunk, m->bytes() - o)});
        bytes += m->bytes();
      }
    }
    pool.run(static_cast<int>(jobs.size()), [&](int j) { sums[j % 4096] += sum512(jobs[j].first, jobs[j].second); });
    benchmark::DoNotOptimize(sums.data());
    layer = (layer + 1) % s.num_layers;
  }
  st.SetBytesProcessed(static_cast<int64_t>(bytes));
}
BENCHMARK(BM_HostExpertsStream)->ArgsProduct({{16384, 65536}, {15, 16}})->Unit(benchmark::kMicrosecond)->UseRealTime();

// The expert kernels' two jobs alone, on 8 random experts of a layer:
// 0: gate+up in 64-row blocks (64 jobs); 1: down in 32-output-row blocks
// over all 8 experts (64 jobs); 2: down per expert in 256-row blocks.
void BM_VnniPhase(benchmark::State& st) {
  const int phase = static_cast<int>(st.range(0));
  const int threads = static_cast<int>(st.range(1));
  static std::unique_ptr<Model> model;
  if (!model) model = load_model(0);
  if (!model) {
    st.SkipWithError("set COLI_BENCH_MODEL to a container");
    return;
  }
  const ModelSpec& s = model->spec();
  const int H = s.hidden_size, I = s.moe_intermediate_size, k = s.num_experts_per_tok;
  cpu::ThreadPool pool(threads);
  std::mt19937 rng(7);
  std::vector<float> x(H), act(I);
  std::normal_distribution<float> nd;
  for (float& v : x) v = nd(rng);
  for (float& v : act) v = nd(rng);
  cpu::QuantizedActs qx, qa;
  cpu::quantize_acts(x.data(), 1, H, &qx);
  cpu::quantize_acts(act.data(), 1, I, &qa);
  std::vector<float> y(static_cast<std::size_t>(k) * 2 * std::max(H, I));
  std::size_t bytes = 0;
  int layer = 0;
  for (auto _ : st) {
    std::vector<const ExpertWeights*> ex;
    for (int e : pick_experts(rng, k, s.num_experts)) {
      const ExpertWeights& w = model->layer(layer).moe.experts[e];
      ex.push_back(&w);
      bytes += phase == 0 ? w.gate.bytes() + w.up.bytes() : w.down.bytes();
    }
    if (phase == 0) {
      const int ib = I / 64;
      pool.run(k * ib, [&](int j) {
        const ExpertWeights& w = *ex[j / ib];
        const int64_t r0 = (j % ib) * 64;
        cpu::matmul_rows_vnni(w.gate, qx, r0, r0 + 64, y.data() + (j / ib) * 2 * I, 1);
        cpu::matmul_rows_vnni(w.up, qx, r0, r0 + 64, y.data() + (j / ib) * 2 * I + I, 1);
      });
    } else if (phase == 1) {
      pool.run(H / 32, [&](int j) {
        for (int e = 0; e < k; ++e) cpu::matmul_rows_vnni(ex[e]->down, qa, j * 32, j * 32 + 32, y.data() + e * H, 1);
      });
    } else {
      const int db = H / 256;
      pool.run(k * db, [&](int j) { cpu::matmul_rows_vnni(ex[j / db]->down, qa, (j % db) * 256, (j % db) * 256 + 256, y.data() + (j / db) * H, 1); });
    }
    benchmark::DoNotOptimize(y.data());
    layer = (layer + 1) % s.num_layers;
  }
  st.SetBytesProcessed(static_cast<int64_t>(bytes));
}
BENCHMARK(BM_VnniPhase)->ArgsProduct({{0, 1, 2}, {15, 16}})->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

namespace {

// Gate and up of 8 random experts of a layer (layers in turn), their 8192
// rows split into one contiguous range per thread (no job queue): the VNNI
// kernel's streaming rate at P threads, against ReadBandwidth/P. Arg 1 is
// the software prefetch: 0 none, 1/2/3 codes 2/4/8 KiB ahead, 4/5 the same
// as 1/2 plus the scale rows.
void BM_VnniStream(benchmark::State& st) {
  const int threads = static_cast<int>(st.range(0)), pf = static_cast<int>(st.range(1));
  static std::unique_ptr<Model> model;
  if (!model) model = load_model(0);
  if (!model) {
    st.SkipWithError("set COLI_BENCH_MODEL to a container");
    return;
  }
  const int dist[] = {0, 2048, 4096, 8192, 2048, 4096};
  cpu::set_vnni_prefetch(dist[pf], pf >= 4);
  const ModelSpec& s = model->spec();
  const int H = s.hidden_size, I = s.moe_intermediate_size, k = s.num_experts_per_tok;
  cpu::ThreadPool pool(threads);
  std::mt19937 rng(7);
  std::vector<float> x(H);
  std::normal_distribution<float> nd;
  for (float& v : x) v = nd(rng);
  cpu::QuantizedActs qx;
  cpu::quantize_acts(x.data(), 1, H, &qx);
  std::vector<float> y(static_cast<std::size_t>(k) * 2 * I);
  std::size_t bytes = 0;
  int layer = 0;
  const int rows = k * 2 * I;
  for (auto _ : st) {
    std::vector<const Matrix*> mats;
    for (int e : pick_experts(rng, k, s.num_experts)) {
      const ExpertWeights& w = model->layer(layer).moe.experts[e];
      mats.push_back(&w.gate), mats.push_back(&w.up);
      bytes += w.gate.bytes() + w.up.bytes();
    }
    pool.run(threads, [&](int t) {
      const int r0 = static_cast<int>(int64_t(rows) * t / threads), r1 = static_cast<int>(int64_t(rows) * (t + 1) / threads);
      for (int r = r0; r < r1;) {
        const int m = r / I, a = r % I, b = std::min(I, a + (r1 - r));
        cpu::matmul_rows_vnni(*mats[m], qx, a, b, y.data() + m * I, 1);
        r += b - a;
      }
    });
    benchmark::DoNotOptimize(y.data());
    layer = (layer + 1) % s.num_layers;
  }
  cpu::set_vnni_prefetch(2048, false);
  st.SetBytesProcessed(static_cast<int64_t>(bytes));
}
BENCHMARK(BM_VnniStream)->ArgsProduct({{1, 4, 8, 15}, {0, 1, 2, 3, 4, 5}})->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace
