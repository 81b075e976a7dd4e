// coli-bench: every output format parses back to the documented schema,
// errors become records, and records stream while the run goes on.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench/record_writer.h"
#include "bench/runner.h"
#include "cpu_backend.h"
#include "test_util.h"

using namespace coli;

namespace {

std::string run_to_string(RecordFormat f, const std::vector<std::string>& models, int* failures) {
  char* buf = nullptr;
  std::size_t len = 0;
  std::FILE* mem = open_memstream(&buf, &len);
  RecordWriter w(f, mem);
  BenchOptions o;
  o.models = models;
  o.n_prompt = {8};
  o.n_gen = {3};
  o.prompt_gen = {{8, 2}};
  o.n_depth = {0, 5};
  o.repetitions = 2;
  *failures = run_bench(o, [](const BackendRequest& q) { return BenchBackend{std::make_unique<cpu::CpuBackend>(*q.model), 512, {}}; }, w, nullptr);
  std::fclose(mem);
  std::string s(buf, len);
  std::free(buf);
  return s;
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> v;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}

std::vector<std::string> split(const std::string& s, const std::string& sep) {
  std::vector<std::string> v;
  std::size_t i = 0;
  while (true) {
    const std::size_t j = s.find(sep, i);
    v.push_back(s.substr(i, j == std::string::npos ? std::string::npos : j - i));
    if (j == std::string::npos) return v;
    i = j + sep.size();
  }
}

// RFC 4180 fields of one CSV line (no embedded newlines in our records).
std::vector<std::string> csv_fields(const std::string& l) {
  std::vector<std::string> v(1);
  bool q = false;
  for (std::size_t i = 0; i < l.size(); ++i) {
    const char c = l[i];
    if (q && c == '"' && i + 1 < l.size() && l[i + 1] == '"') v.back() += '"', ++i;
    else if (c == '"') q = !q;
    else if (c == ',' && !q) v.emplace_back();
    else v.back() += c;
  }
  return v;
}

const std::string kTiny = coli::test::data_dir() + "/tiny-qwen35moe-text";
const std::string kBad = "/nonexistent,model";  // a comma: CSV must quote it

int field(const std::string& name) {
  const auto& f = bench_fields();
  return static_cast<int>(std::find(f.begin(), f.end(), name) - f.begin());
}

}  // namespace

TEST(Bench, TsvParsesAndErrorsAreRecords) {
  int failures = 0;
  const auto ls = lines(run_to_string(RecordFormat::kTsv, {kTiny, kBad}, &failures));
  ASSERT_EQ(ls.size(), 1u + 2 * 6);  // header + (3 tests x 2 depths) per model
  EXPECT_EQ(split(ls[0], "\t"), bench_fields());
  EXPECT_EQ(failures, 6);
  for (std::size_t i = 1; i < ls.size(); ++i) {
    const auto c = split(ls[i], "\t");
    ASSERT_EQ(c.size(), bench_fields().size()) << ls[i];
    const bool bad = i > 6;
    EXPECT_EQ(c[field("error")].empty(), !bad);
    if (!bad) {
      EXPECT_GT(std::stod(c[field("avg_ts")]), 0.0);
      EXPECT_EQ(split(c[field("samples_ns")], " ").size(), 2u);
      EXPECT_GT(std::stod(c[field("bytes_read_per_token")]), 0.0);
    }
  }
  // Test names and sizes as llama-bench spells them.
  EXPECT_EQ(split(ls[1], "\t")[field("test")], "pp8");
  EXPECT_EQ(split(ls[2], "\t")[field("test")], "tg3");
  EXPECT_EQ(split(ls[3], "\t")[field("test")], "pp8+tg2");
  EXPECT_EQ(split(ls[4], "\t")[field("test")], "pp8 @ d5");
  EXPECT_EQ(split(ls[4], "\t")[field("n_depth")], "5");
}

TEST(Bench, CsvJsonlMarkdownParse) {
  int failures = 0;
  auto csv = lines(run_to_string(RecordFormat::kCsv, {kTiny, kBad}, &failures));
  EXPECT_EQ(csv_fields(csv[0]), bench_fields());
  for (std::size_t i = 1; i < csv.size(); ++i) ASSERT_EQ(csv_fields(csv[i]).size(), bench_fields().size()) << csv[i];
  EXPECT_EQ(csv_fields(csv.back())[field("model_filename")], kBad);
  for (const auto& l : lines(run_to_string(RecordFormat::kJsonl, {kTiny, kBad}, &failures))) {
    const auto j = nlohmann::ordered_json::parse(l);
    std::vector<std::string> keys;
    for (auto it = j.begin(); it != j.end(); ++it) keys.push_back(it.key());
    ASSERT_EQ(keys, bench_fields());
    if (j["error"].is_null()) EXPECT_TRUE(j["samples_ts"].is_array());
    else EXPECT_TRUE(j["avg_ts"].is_null());
  }
  const auto md = lines(run_to_string(RecordFormat::kMarkdown, {kTiny}, &failures));
  EXPECT_EQ(failures, 0);
  ASSERT_GE(md.size(), 3u);
  EXPECT_EQ(md[1].substr(0, 7), "| --- |");
  for (const auto& l : md) EXPECT_EQ(std::count(l.begin(), l.end(), '|'), static_cast<long>(bench_fields().size()) + 1) << l;
}

TEST(Bench, RecordsStreamWhileTheRunGoesOn) {
  // coli-bench | awk: the first record must reach awk long before the run
  // ends (a second test keeps coli-bench busy for about a second more).
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const std::string cmd = coli::test::bin_dir() + "/coli-bench -m " + kTiny + " -p 8,2000 -n 0 -r 3 --reference | $AWK -F'\\t' '{print $" +
                          std::to_string(field("test") + 1) + "; fflush()}'";
  // Debian's default awk is mawk, which reads pipes in blocks unless told -W interactive.
  const std::string awk = coli::test::run_command("awk -W version 2>/dev/null | grep -q mawk", nullptr) == 0 ? "awk -W interactive" : "awk";
  setenv("AWK", awk.c_str(), 1);
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    execl("/bin/sh", "sh", "-c", cmd.c_str(), nullptr);
    _exit(127);
  }
  close(fds[1]);
  std::FILE* in = fdopen(fds[0], "r");
  char line[4096];
  ASSERT_TRUE(std::fgets(line, sizeof line, in));  // header
  ASSERT_TRUE(std::fgets(line, sizeof line, in));
  const auto first = clock::now();
  EXPECT_STREQ(line, "pp8\n");
  ASSERT_TRUE(std::fgets(line, sizeof line, in));
  EXPECT_STREQ(line, "pp2000\n");
  std::fclose(in);
  int st = 0;
  waitpid(pid, &st, 0);
  const auto end = clock::now();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  const double to_first = std::chrono::duration<double>(first - start).count(), total = std::chrono::duration<double>(end - start).count();
  std::printf("[ info     ] first record after %.3f s of %.3f s\n", to_first, total);
  EXPECT_LT(to_first, 0.5 * total) << "records were held back until the end";
}

TEST(Bench, ExitStatusSaysSomethingFailed) {
  std::string out;
  EXPECT_EQ(coli::test::run_command(coli::test::bin_dir() + "/coli-bench -m " + kTiny + " -p 4 -n 2 -r 1 2>/dev/null", &out), 0);
  EXPECT_EQ(coli::test::run_command(coli::test::bin_dir() + "/coli-bench -m " + kTiny + ",/nonexistent -p 4 -n 2 -r 1 2>/dev/null", &out), 1);
  EXPECT_EQ(lines(out).size(), 5u);  // header + 2 good + 2 error records
  EXPECT_EQ(coli::test::run_command(coli::test::bin_dir() + "/coli-bench -m " + kTiny + " -o xml 2>/dev/null", &out), 2);
  EXPECT_EQ(coli::test::run_command(coli::test::bin_dir() + "/coli-bench -p 4 2>/dev/null", &out), 2);
}

// --vary-prompt (BenchOptions::vary_prompt): every timed repetition's
// prompt is drawn from a seed of its own, the warm-up's from the seed;
// without it all four are the seed's.
TEST(Bench, VaryPromptGivesEachRepetitionIdsOfItsOwn) {
  struct Recording : cpu::CpuBackend {
    Recording(const Model& m, std::vector<std::vector<int>>* seen) : CpuBackend(m), seen_(seen) {}
    void embed(const int* ids, int T, float* x) override {
      seen_->emplace_back(ids, ids + T);
      CpuBackend::embed(ids, T, x);
    }
    std::vector<std::vector<int>>* seen_;
  };
  std::vector<std::vector<int>> prompts[2];
  for (int vary = 0; vary < 2; ++vary) {
    RecordWriter w(RecordFormat::kTsv, std::tmpfile());
    BenchOptions o;
    o.models = {kTiny};
    o.n_prompt = {8}, o.n_gen = {0}, o.repetitions = 3, o.vary_prompt = vary;
    std::vector<std::vector<int>>* seen = &prompts[vary];
    ASSERT_EQ(run_bench(o, [seen](const BackendRequest& q) { return BenchBackend{std::make_unique<Recording>(*q.model, seen), 512, {}}; }, w, nullptr), 0);
    ASSERT_EQ(prompts[vary].size(), 4u) << "the warm-up and three repetitions, one chunk each";
    for (const auto& p : prompts[vary]) EXPECT_EQ(p.size(), 8u);
  }
  for (int i = 1; i < 4; ++i) EXPECT_EQ(prompts[0][i], prompts[0][0]);
  EXPECT_EQ(prompts[1][0], prompts[0][0]) << "the warm-up keeps the seed's ids";
  for (int i = 1; i < 4; ++i)
    for (int j = 0; j < i; ++j) EXPECT_NE(prompts[1][i], prompts[1][j]) << i << " " << j;
}

// "tgN pP": P sessions stepped together, one batched forward (the backend's
// trunk_rows with S = P) a step; ts is the aggregate of the P sessions.
TEST(Bench, ParallelTestsStepTheSessionsTogether) {
  struct Recording : cpu::CpuBackend {
    Recording(const Model& m, std::vector<int>* rows) : CpuBackend(m), rows_(rows) {}
    void trunk_rows(int layer, BackendState* const* states, const int* positions, int S, int hidden, float* x) override {
      if (layer == 0) rows_->push_back(S);
      CpuBackend::trunk_rows(layer, states, positions, S, hidden, x);
    }
    std::vector<int>* rows_;
  };
  std::vector<int> rows;
  char* buf = nullptr;
  std::size_t len = 0;
  std::FILE* mem = open_memstream(&buf, &len);
  {
    RecordWriter w(RecordFormat::kJsonl, mem);
    BenchOptions o;
    o.models = {kTiny};
    o.n_prompt = {0}, o.n_gen = {4}, o.n_parallel = {1, 3}, o.repetitions = 2;
    ASSERT_EQ(run_bench(o, [&rows](const BackendRequest& q) {
      EXPECT_EQ(q.sequences, 3) << "the ledger's sessions: the largest P";
      return BenchBackend{std::make_unique<Recording>(*q.model, &rows), 512, {}};
    }, w, nullptr), 0);
  }
  std::fclose(mem);
  const std::vector<std::string> ls = lines(std::string(buf, len));
  std::free(buf);
  ASSERT_EQ(ls.size(), 2u);
  const auto plain = nlohmann::json::parse(ls[0]), par = nlohmann::json::parse(ls[1]);
  EXPECT_EQ(plain["test"], "tg4");
  EXPECT_EQ(plain["n_parallel"], 1);
  EXPECT_EQ(par["test"], "tg4 p3");
  EXPECT_EQ(par["n_parallel"], 3);
  // The warm-up and two repetitions, 4 steps each, every step 3 rows at once.
  EXPECT_EQ(rows, std::vector<int>(12, 3));
  // Aggregate: 4 steps x 3 sessions over each repetition's time.
  const auto ns = par["samples_ns"], ts = par["samples_ts"];
  ASSERT_EQ(ns.size(), 2u);
  for (int i = 0; i < 2; ++i) EXPECT_NEAR(ts[i].get<double>(), 12.0 / (ns[i].get<double>() / 1e9), 1e-3 * ts[i].get<double>());
}
