// The sampler on a real vocabulary (248,320 logits, Qwen3.5's): what
// coli-run spends per generated token between decode steps. Arg 0: greedy
// (--temp 0); 1: llama.cpp's defaults (temp 0.8, top-k 40, top-p 0.95,
// min-p 0.05); 2: the same with --repeat-penalty 1.1 (a penalised copy).
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "sampling/sampler.h"

namespace {

void BM_SampleVocab(benchmark::State& st) {
  constexpr int kVocab = 248320;
  std::mt19937 g(1);
  std::normal_distribution<float> n(0, 3);
  std::vector<float> logits(kVocab);
  for (auto& x : logits) x = n(g);
  std::vector<int> history(256);
  for (auto& h : history) h = static_cast<int>(g() % kVocab);
  coli::SamplingParams p;
  if (st.range(0) == 0) p.temperature = 0;
  if (st.range(0) == 2) p.repeat_penalty = 1.1f;
  coli::Sampler s(p);
  for (auto _ : st) benchmark::DoNotOptimize(s.sample(logits, history));
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * kVocab * sizeof(float));
}
BENCHMARK(BM_SampleVocab)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMicrosecond);

}  // namespace
