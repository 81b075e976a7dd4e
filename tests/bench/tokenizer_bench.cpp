// Tokenizer encode speed on English prose (Google Benchmark).
// Corpus: the Debian license texts in /usr/share/common-licenses (about
// 260 KB of distinct English prose), or the files named by COLI_BENCH_TEXT
// (colon-separated). Single-threaded.
//   BM_EncodeFiles: each file encoded by its own call (prompt-sized inputs),
//                   the word cache emptied before each pass over the files.
//   BM_EncodeBulk:  the corpus repeated to 8 MiB, one call, cache emptied first.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tokenizer/tokenizer.h"

namespace {

const coli::Tokenizer& tok() {
  static auto t = coli::Tokenizer::load(std::getenv("COLI_TOKENIZER") ? std::getenv("COLI_TOKENIZER") : "tests/data/qwen3-tokenizer");
  return *t;
}

std::vector<std::string> corpus() {
  std::vector<std::string> paths;
  if (const char* e = std::getenv("COLI_BENCH_TEXT")) {
    std::stringstream ss(e);
    for (std::string p; std::getline(ss, p, ':');) paths.push_back(p);
  } else {
    for (const auto& f : std::filesystem::directory_iterator("/usr/share/common-licenses"))
      if (f.is_regular_file()) paths.push_back(f.path().string());
  }
  std::vector<std::string> out;
  for (const auto& p : paths) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!ss.str().empty()) out.push_back(ss.str());
  }
  return out;
}

void BM_EncodeFiles(benchmark::State& st) {
  const auto texts = corpus();
  tok();  // load outside the timed loop
  std::size_t bytes = 0, ids = 0;
  for (auto _ : st) {
    st.PauseTiming();
    tok().clear_cache();  // cold: each pass starts with an empty word cache
    st.ResumeTiming();
    for (const auto& t : texts) {
      auto v = tok().encode(t);
      ids += v.size();
      bytes += t.size();
      benchmark::DoNotOptimize(v.data());
    }
  }
  st.SetBytesProcessed(static_cast<int64_t>(bytes));
  st.counters["bytes_per_token"] = double(bytes) / double(ids);
}
BENCHMARK(BM_EncodeFiles)->Unit(benchmark::kMillisecond);

void BM_EncodeBulk(benchmark::State& st) {
  std::string all;
  const auto texts = corpus();
  while (all.size() < (8u << 20))
    for (const auto& t : texts) all += t;
  tok();
  for (auto _ : st) {
    st.PauseTiming();
    tok().clear_cache();
    st.ResumeTiming();
    auto v = tok().encode(all);
    benchmark::DoNotOptimize(v.data());
  }
  st.SetBytesProcessed(static_cast<int64_t>(all.size()) * st.iterations());
}
BENCHMARK(BM_EncodeBulk)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
