// The COLI_* environment variables (tools/env_options.h): each one lands in
// its option field, malformed values are errors naming the variable, and
// the libraries themselves read no environment, so an option set in code
// is never overridden.
#include "env_options.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <string>

#include "test_util.h"

using namespace coli;

namespace {

struct FakeEnv {
  std::map<std::string, std::string> vars;
  EnvLookup lookup() const {
    return [this](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
  EnvSettings read(const cuda::CudaOptions& base = {}) const { return read_environment(lookup(), base); }
};

FakeEnv env1(const std::string& name, const std::string& value) {
  FakeEnv e;
  e.vars[name] = value;
  return e;
}

// Every field of CudaOptions, for "nothing else changed".
std::string describe(const cuda::CudaOptions& o) {
  const cuda::CudaTuning& t = o.tuning;
  return std::to_string(o.device) + " " + std::to_string(o.max_chunk) + " " + std::to_string(o.graphs) + " " + std::to_string(o.pdl) + " " +
         std::to_string(o.split_kv) + " " + std::to_string(o.chunked_gdn) + " " + std::to_string(o.gemv_stream_min_rows) + " " +
         std::to_string(o.gemv_stream_rows) + " " + std::to_string(static_cast<int>(o.profile)) + " " + std::to_string(static_cast<int>(o.register_hosts)) + " " + std::to_string(o.serve_handoff_inline) + " " + std::to_string(o.split_experts) + " " + std::to_string(o.fuse_decode) + " " + std::to_string(o.batch_rows) + " " + std::to_string(o.prefill_ring_slots) + " " + std::to_string(o.prefill_cpu_by_routing) + " " + std::to_string(o.prefill_hot_pairs) + " | " + std::to_string(t.norm_cluster) + " " +
         std::to_string(t.gemv_warps) + " " + std::to_string(t.float_warps) + " " + std::to_string(t.gemv_lanes) + " " +
         std::to_string(t.up_rows) + " " + std::to_string(t.down_rows) + " " + std::to_string(t.moe_lanes) + " " + std::to_string(t.logit_parts) + " " + std::to_string(t.mma_min_tokens) + " " +
         std::to_string(t.mma_small) + " " + std::to_string(t.grouped_min_tokens) + " " + std::to_string(t.grouped_min_rows) + " " + std::to_string(t.mma_split) +
         " " + std::to_string(t.pcie_rows_max) + " " + std::to_string(t.pcie_rows_share) + " " + std::to_string(t.segments_host_max);
}

}  // namespace

TEST(EnvOptions, UnsetOrEmptyLeavesTheDefaults) {
  const std::string defaults = describe(cuda::CudaOptions{});
  EXPECT_EQ(describe(FakeEnv{}.read().cuda), defaults);
  EXPECT_FALSE(FakeEnv{}.read().cpu_level);
  FakeEnv empty{{{"COLI_CPU_LEVEL", ""}, {"COLI_CUDA_PDL", ""}, {"COLI_CUDA_PROFILE", ""}, {"COLI_TUNE_GEMV_WARPS", ""}}};
  EXPECT_EQ(describe(empty.read().cuda), defaults);
  EXPECT_FALSE(empty.read().cpu_level);
}

TEST(EnvOptions, EachVariableSetsItsFieldOnly) {
  using Set = void (*)(cuda::CudaOptions&);
  const struct {
    const char* name;
    const char* value;
    Set expect;
  } cases[] = {
      {"COLI_CUDA_PDL", "0", [](cuda::CudaOptions& o) { o.pdl = false; }},
      {"COLI_CUDA_SPLIT_KV", "0", [](cuda::CudaOptions& o) { o.split_kv = false; }},
      {"COLI_CUDA_GDN_CHUNK", "0", [](cuda::CudaOptions& o) { o.chunked_gdn = false; }},
      {"COLI_CUDA_PROFILE", "1", [](cuda::CudaOptions& o) { o.profile = cuda::CudaProfile::kSteps; }},
      {"COLI_CUDA_PROFILE", "graph", [](cuda::CudaOptions& o) { o.profile = cuda::CudaProfile::kGraph; }},
      {"COLI_CUDA_PROFILE", "prefill", [](cuda::CudaOptions& o) { o.profile = cuda::CudaProfile::kPrefill; }},
      {"COLI_CUDA_REGISTER", "0", [](cuda::CudaOptions& o) { o.register_hosts = cuda::CudaOptions::Register::kNever; }},
      {"COLI_CUDA_REGISTER", "1", [](cuda::CudaOptions& o) { o.register_hosts = cuda::CudaOptions::Register::kAlways; }},
      {"COLI_CUDA_HANDOFF", "inline", [](cuda::CudaOptions& o) { o.serve_handoff_inline = true; }},
      {"COLI_CUDA_SPLIT_EXPERTS", "1", [](cuda::CudaOptions& o) { o.split_experts = true; }},
      {"COLI_CUDA_FUSE", "0", [](cuda::CudaOptions& o) { o.fuse_decode = false; }},
      {"COLI_CUDA_ROWS", "0", [](cuda::CudaOptions& o) { o.batch_rows = false; }},
      {"COLI_CUDA_PREFILL_ORDER", "routed", [](cuda::CudaOptions& o) { o.prefill_cpu_by_routing = true; }},
      {"COLI_CUDA_PREFILL_HOT", "off", [](cuda::CudaOptions& o) { o.prefill_hot_pairs = std::numeric_limits<int>::max(); }},
      {"COLI_CUDA_PREFILL_HOT", "0", [](cuda::CudaOptions& o) { o.prefill_hot_pairs = 0; }},
      {"COLI_CUDA_PREFILL_HOT", "48", [](cuda::CudaOptions& o) { o.prefill_hot_pairs = 48; }},
      {"COLI_TUNE_STREAM_MIN_ROWS", "100000", [](cuda::CudaOptions& o) { o.gemv_stream_min_rows = 100000; }},
      {"COLI_TUNE_STREAM_ROWS", "2", [](cuda::CudaOptions& o) { o.gemv_stream_rows = 2; }},
      {"COLI_TUNE_NORM_CLUSTER", "1", [](cuda::CudaOptions& o) { o.tuning.norm_cluster = 1; }},
      {"COLI_TUNE_GEMV_WARPS", "8", [](cuda::CudaOptions& o) { o.tuning.gemv_warps = 8; }},
      {"COLI_TUNE_FLOAT_WARPS", "2", [](cuda::CudaOptions& o) { o.tuning.float_warps = 2; }},
      {"COLI_TUNE_GEMV_LANES", "16", [](cuda::CudaOptions& o) { o.tuning.gemv_lanes = 16; }},
      {"COLI_TUNE_UP_ROWS", "1", [](cuda::CudaOptions& o) { o.tuning.up_rows = 1; }},
      {"COLI_TUNE_UP_ROWS", "4", [](cuda::CudaOptions& o) { o.tuning.up_rows = 4; }},
      {"COLI_TUNE_MOE_LANES", "16", [](cuda::CudaOptions& o) { o.tuning.moe_lanes = 16; }},
      {"COLI_TUNE_DOWN_ROWS", "8", [](cuda::CudaOptions& o) { o.tuning.down_rows = 8; }},
      {"COLI_TUNE_LOGIT_PARTS", "2", [](cuda::CudaOptions& o) { o.tuning.logit_parts = 2; }},
      {"COLI_TUNE_PREFILL_RING", "48", [](cuda::CudaOptions& o) { o.prefill_ring_slots = 48; }},
      {"COLI_TUNE_MMA_MIN", "4", [](cuda::CudaOptions& o) { o.tuning.mma_min_tokens = 4; }},
      {"COLI_TUNE_MMA_SMALL", "0", [](cuda::CudaOptions& o) { o.tuning.mma_small = 0; }},
      {"COLI_TUNE_GROUPED_MIN", "48", [](cuda::CudaOptions& o) { o.tuning.grouped_min_tokens = 48; }},
      {"COLI_TUNE_GROUPED_MIN_ROWS", "4", [](cuda::CudaOptions& o) { o.tuning.grouped_min_rows = 4; }},
      {"COLI_TUNE_MMA_SPLIT", "0", [](cuda::CudaOptions& o) { o.tuning.mma_split = 0; }},
      {"COLI_TUNE_PCIE_ROWS", "1", [](cuda::CudaOptions& o) { o.tuning.pcie_rows_max = 1; }},
      {"COLI_TUNE_PCIE_ROWS_SHARE", "0", [](cuda::CudaOptions& o) { o.tuning.pcie_rows_share = 0; }},
      {"COLI_TUNE_PCIE_ROWS_SHARE", "65", [](cuda::CudaOptions& o) { o.tuning.pcie_rows_share = 65; }},
      {"COLI_TUNE_PDL_ROWS", "16", [](cuda::CudaOptions& o) { o.tuning.pdl_rows = 16; }},
      {"COLI_TUNE_PDL_ROWS", "0", [](cuda::CudaOptions& o) { o.tuning.pdl_rows = 0; }},
      {"COLI_TUNE_SEGMENTS_HOST", "0", [](cuda::CudaOptions& o) { o.tuning.segments_host_max = 0; }},
      {"COLI_TUNE_DEVICE_GREEDY", "0", [](cuda::CudaOptions& o) { o.tuning.device_greedy = 0; }},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.name) + "=" + c.value);
    cuda::CudaOptions want;
    c.expect(want);
    const EnvSettings got = env1(c.name, c.value).read();
    EXPECT_EQ(describe(got.cuda), describe(want));
    EXPECT_FALSE(got.cpu_level);
  }
  // The "back to the default" values.
  const EnvSettings on = FakeEnv{{{"COLI_CUDA_PDL", "1"}, {"COLI_CUDA_SPLIT_KV", "1"}, {"COLI_CUDA_GDN_CHUNK", "1"}, {"COLI_CUDA_PROFILE", "0"}, {"COLI_CUDA_REGISTER", "auto"}, {"COLI_CUDA_HANDOFF", "thread"}, {"COLI_CUDA_SPLIT_EXPERTS", "0"}, {"COLI_CUDA_FUSE", "1"}, {"COLI_CUDA_ROWS", "1"}, {"COLI_CUDA_PREFILL_ORDER", "id"}, {"COLI_CUDA_PREFILL_HOT", "auto"}}}.read();
  EXPECT_EQ(describe(on.cuda), describe(cuda::CudaOptions{}));
}

TEST(EnvOptions, CpuLevel) {
  EXPECT_EQ(env1("COLI_CPU_LEVEL", "scalar").read().cpu_level, cpu::CpuLevel::kScalar);
  EXPECT_EQ(env1("COLI_CPU_LEVEL", "avx2").read().cpu_level, cpu::CpuLevel::kAvx2);
  EXPECT_EQ(env1("COLI_CPU_LEVEL", "avx512").read().cpu_level, cpu::CpuLevel::kAvx512);
  EXPECT_EQ(describe(env1("COLI_CPU_LEVEL", "scalar").read().cuda), describe(cuda::CudaOptions{}));
}

TEST(EnvOptions, MalformedValuesAreErrorsNamingTheVariable) {
  const std::pair<const char*, const char*> bad[] = {
      {"COLI_CPU_LEVEL", "sse"},          {"COLI_CPU_LEVEL", "AVX2"},       {"COLI_CUDA_PDL", "off"},
      {"COLI_CUDA_SPLIT_KV", "2"},        {"COLI_CUDA_GDN_CHUNK", "yes"},   {"COLI_CUDA_PROFILE", "graphs"}, {"COLI_CUDA_REGISTER", "yes"}, {"COLI_CUDA_HANDOFF", "sync"}, {"COLI_CUDA_SPLIT_EXPERTS", "on"}, {"COLI_CUDA_FUSE", "no"}, {"COLI_CUDA_ROWS", "off"}, {"COLI_CUDA_PREFILL_ORDER", "heat"}, {"COLI_CUDA_PREFILL_HOT", "-1"}, {"COLI_CUDA_PREFILL_HOT", "9999999999"}, {"COLI_CUDA_PREFILL_HOT", "on"},
      {"COLI_TUNE_STREAM_MIN_ROWS", "-1"}, {"COLI_TUNE_STREAM_MIN_ROWS", "2k"}, {"COLI_TUNE_STREAM_ROWS", "3"},
      {"COLI_TUNE_NORM_CLUSTER", "3"},    {"COLI_TUNE_GEMV_WARPS", "0"},    {"COLI_TUNE_GEMV_WARPS", " 4"},
      {"COLI_TUNE_FLOAT_WARPS", "33"},    {"COLI_TUNE_GEMV_LANES", "4"},    {"COLI_TUNE_UP_ROWS", "3"},
      {"COLI_TUNE_DOWN_ROWS", "1"},       {"COLI_TUNE_LOGIT_PARTS", "9"},   {"COLI_TUNE_LOGIT_PARTS", "99999999999"}, {"COLI_TUNE_PREFILL_RING", "0"}, {"COLI_TUNE_PREFILL_RING", "5000"},
      {"COLI_TUNE_PCIE_ROWS", "0"},       {"COLI_TUNE_PCIE_ROWS", "17"},    {"COLI_TUNE_PCIE_ROWS_SHARE", "101"}, {"COLI_TUNE_PCIE_ROWS_SHARE", "0.5"},
      {"COLI_TUNE_PDL_ROWS", "-1"},       {"COLI_TUNE_PDL_ROWS", "4097"},       {"COLI_TUNE_DEVICE_GREEDY", "2"}, {"COLI_TUNE_MOE_LANES", "4"}, {"COLI_TUNE_SEGMENTS_HOST", "4097"},
  };
  for (const auto& [name, value] : bad) {
    SCOPED_TRACE(std::string(name) + "=" + value);
    try {
      env1(name, value).read();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(name), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::string("'") + value + "'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("takes"), std::string::npos) << msg;
    }
  }
}

TEST(EnvOptions, FieldsNoVariableNamesKeepTheirValues) {
  cuda::CudaOptions base;
  base.device = 1, base.max_chunk = 64, base.graphs = false, base.split_kv = false, base.tuning.gemv_warps = 2;
  const EnvSettings e = env1("COLI_TUNE_UP_ROWS", "1").read(base);
  cuda::CudaOptions want = base;
  want.tuning.up_rows = 1;
  EXPECT_EQ(describe(e.cuda), describe(want));
}

// Explicit options win because the libraries never consult the environment:
// only the tools do, before their flags. No library source may call getenv.
TEST(EnvOptions, LibrariesReadNoEnvironment) {
  namespace fs = std::filesystem;
  if (!fs::is_directory("libcore") || !fs::is_directory("libcpu") || !fs::is_directory("libcuda")) GTEST_SKIP() << "not run from the source tree";
  int files = 0;
  for (const char* dir : {"libcore", "libcpu", "libcuda"})
    for (const auto& f : fs::recursive_directory_iterator(dir)) {
      if (!f.is_regular_file()) continue;
      const std::string text = test::read_file(f.path().string());
      ++files;
      EXPECT_EQ(text.find("getenv"), std::string::npos) << f.path() << " reads the environment; make it an option (tools/env_options.h)";
    }
  EXPECT_GT(files, 50);
}

// A real variable reaches the CPU level only through apply_environment(),
// and a level set in code afterwards stands.
TEST(EnvOptions, ApplyEnvironmentThenExplicitLevelWins) {
  const cpu::CpuLevel saved = cpu::active_level();
  ::setenv("COLI_CPU_LEVEL", "scalar", 1);
  const cuda::CudaOptions co = apply_environment();
  EXPECT_EQ(cpu::active_level(), cpu::CpuLevel::kScalar);
  EXPECT_EQ(describe(co), describe(cuda::CudaOptions{}));
  cpu::set_active_level(cpu::detected_level());
  EXPECT_EQ(cpu::active_level(), cpu::detected_level());
  ::unsetenv("COLI_CPU_LEVEL");
  cpu::set_active_level(saved);
}

// The tools report a malformed variable as one line naming it, status 1.
TEST(EnvOptions, ToolsRejectMalformedVariables) {
  const std::string model = test::data_dir() + "/tiny-qwen35moe-text";
  std::string out;
  EXPECT_EQ(test::run_command("COLI_TUNE_GEMV_WARPS=many " + test::bin_dir() + "/coli-run --model " + model +
                                  " --device cpu --prompt-ids 1,2 -n 1 2>&1 >/dev/null",
                              &out),
            1);
  EXPECT_NE(out.find("COLI_TUNE_GEMV_WARPS='many'"), std::string::npos) << out;
  EXPECT_EQ(test::run_command("COLI_CPU_LEVEL=sse " + test::bin_dir() + "/coli-bench -m " + model + " --device cpu -p 0 -n 1 -r 1 2>&1 >/dev/null", &out),
            1);
  EXPECT_NE(out.find("COLI_CPU_LEVEL='sse'"), std::string::npos) << out;
  EXPECT_EQ(test::run_command("COLI_CPU_LEVEL=scalar " + test::bin_dir() + "/coli-run --model " + model + " --device cpu --prompt-ids 1,2 -n 2 2>/dev/null",
                              &out),
            0);
}
