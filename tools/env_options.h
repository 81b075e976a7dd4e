// The COLI_* environment variables, read in this one place. The libraries
// read none: every setting is an explicit option (CudaOptions, the CPU
// kernels' level), so code that sets one is never overridden behind its
// back. Each tool calls apply_environment() once, before it applies its
// flags, so that a flag wins over a variable.
//
//   COLI_CPU_LEVEL=scalar|avx2|avx512   cpu::set_active_level (capped at the CPU's)
//   COLI_CUDA_PDL=0|1                   CudaOptions::pdl
//   COLI_CUDA_SPLIT_KV=0|1              CudaOptions::split_kv
//   COLI_CUDA_GDN_CHUNK=0|1             CudaOptions::chunked_gdn
//   COLI_CUDA_SPLIT_EXPERTS=0|1         CudaOptions::split_experts
//   COLI_CUDA_FUSE=0|1                  CudaOptions::fuse_decode
//   COLI_CUDA_ROWS=0|1                  CudaOptions::batch_rows
//   COLI_CUDA_PREFILL_ORDER=id|routed   CudaOptions::prefill_cpu_by_routing
//   COLI_CUDA_PREFILL_HOT=auto|off|N    CudaOptions::prefill_hot_pairs (-1, INT_MAX, N >= 0)
//   COLI_CUDA_PROFILE=0|1|graph         CudaOptions::profile (kOff, kSteps, kGraph)
//   COLI_CUDA_REGISTER=0|auto|1         CudaOptions::register_hosts (kNever, kWhenNeeded, kAlways)
//   COLI_CUDA_HANDOFF=thread|inline     CudaOptions::serve_handoff_inline (inline: for compute-sanitizer racecheck)
//   COLI_TUNE_STREAM_MIN_ROWS=N >= 0    CudaOptions::gemv_stream_min_rows
//   COLI_TUNE_STREAM_ROWS=0|1|2         CudaOptions::gemv_stream_rows
//   COLI_TUNE_NORM_CLUSTER=1|2|4|8      CudaTuning::norm_cluster
//   COLI_TUNE_GEMV_WARPS=1..32          CudaTuning::gemv_warps
//   COLI_TUNE_FLOAT_WARPS=1..32         CudaTuning::float_warps
//   COLI_TUNE_GEMV_LANES=8|16|32        CudaTuning::gemv_lanes
//   COLI_TUNE_UP_ROWS=1|2|4             CudaTuning::up_rows
//   COLI_TUNE_MOE_LANES=8|16|32         CudaTuning::moe_lanes
//   COLI_TUNE_DOWN_ROWS=2|4|8           CudaTuning::down_rows
//   COLI_TUNE_LOGIT_PARTS=1..8          CudaTuning::logit_parts
//   COLI_TUNE_MMA_MIN=2..65             CudaTuning::mma_min_tokens
//   COLI_TUNE_MMA_SMALL=0..64           CudaTuning::mma_small (0: off)
//   COLI_TUNE_GROUPED_MIN=4..4096       CudaTuning::grouped_min_tokens
//   COLI_TUNE_GROUPED_MIN_ROWS=4..4096  CudaTuning::grouped_min_rows
//   COLI_TUNE_MMA_SPLIT=0..64           CudaTuning::mma_split (0: off)
//   COLI_TUNE_PCIE_ROWS=1..16           CudaTuning::pcie_rows_max (1: one-token steps only)
//   COLI_TUNE_PCIE_ROWS_SHARE=0..100    CudaTuning::pcie_rows_share (percent; 0: the one-token share)
//   COLI_TUNE_PDL_ROWS=0..4096          CudaTuning::pdl_rows (0: rows steps without PDL)
//   COLI_TUNE_SEGMENTS_HOST=0..4096     CudaTuning::segments_host_max (0: segments steps upload as prompt chunks)
//   COLI_TUNE_DEVICE_GREEDY=0|1         CudaTuning::device_greedy (0: greedy steps' logits to the host)
//   COLI_TUNE_PREFILL_RING=1..4096      CudaOptions::prefill_ring_slots (the staging ring's least slots per area)
//
// An unset or empty variable leaves its field alone. Any other value outside
// the list throws coli::Error naming the variable and what it takes. The man
// pages (coli-run(1), coli-bench(1), coli-convert(1)) document them.
// Header-only; the options layer the tools share is tools/common (run_options.h).
#pragma once
#include <charconv>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>

#include "cpu_features.h"
#include "cuda_backend.h"
#include "util/error.h"

namespace coli {

// Returns the value of a variable, or null when unset (std::getenv's contract).
using EnvLookup = std::function<const char*(const char*)>;

struct EnvSettings {
  std::optional<cpu::CpuLevel> cpu_level;  // COLI_CPU_LEVEL, when set
  cuda::CudaOptions cuda;                  // base, with the variables set applied
};

namespace env_detail {

inline const char* value_of(const EnvLookup& get, const char* name) {
  const char* v = get(name);
  return v && *v ? v : nullptr;
}

[[noreturn]] inline void bad(const char* name, const char* v, const std::string& takes) {
  throw Error(std::string("environment variable ") + name + "='" + v + "': takes " + takes);
}

inline void read_bool(const EnvLookup& get, const char* name, bool* field) {
  if (const char* v = value_of(get, name)) {
    const std::string s = v;
    if (s != "0" && s != "1") bad(name, v, "0 or 1");
    *field = s == "1";
  }
}

// An integer in [lo, hi], or (when `only` is not empty) one of `only`.
inline void read_int(const EnvLookup& get, const char* name, int* field, int lo, int hi, std::initializer_list<int> only = {},
                     const char* takes = nullptr) {
  const char* v = value_of(get, name);
  if (!v) return;
  const std::string s = v;
  int x = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
  bool ok = ec == std::errc() && end == s.data() + s.size() && x >= lo && x <= hi;
  if (ok && only.size()) {
    ok = false;
    for (int o : only) ok = ok || x == o;
  }
  if (!ok) bad(name, v, takes ? takes : "an integer from " + std::to_string(lo) + " to " + std::to_string(hi));
  *field = x;
}

}  // namespace env_detail

// Reads every variable above through get. Fields of base that no variable
// names keep their values. Throws coli::Error for a malformed value.
inline EnvSettings read_environment(const EnvLookup& get, const cuda::CudaOptions& base = {}) {
  using namespace env_detail;
  EnvSettings e;
  e.cuda = base;
  if (const char* v = value_of(get, "COLI_CPU_LEVEL")) {
    const std::string s = v;
    if (s == "scalar") e.cpu_level = cpu::CpuLevel::kScalar;
    else if (s == "avx2") e.cpu_level = cpu::CpuLevel::kAvx2;
    else if (s == "avx512") e.cpu_level = cpu::CpuLevel::kAvx512;
    else bad("COLI_CPU_LEVEL", v, "scalar, avx2 or avx512");
  }
  cuda::CudaOptions& c = e.cuda;
  read_bool(get, "COLI_CUDA_PDL", &c.pdl);
  read_bool(get, "COLI_CUDA_SPLIT_KV", &c.split_kv);
  read_bool(get, "COLI_CUDA_GDN_CHUNK", &c.chunked_gdn);
  read_bool(get, "COLI_CUDA_SPLIT_EXPERTS", &c.split_experts);
  read_bool(get, "COLI_CUDA_FUSE", &c.fuse_decode);
  read_bool(get, "COLI_CUDA_ROWS", &c.batch_rows);
  if (const char* v = value_of(get, "COLI_CUDA_PREFILL_ORDER")) {
    const std::string s = v;
    if (s == "routed") c.prefill_cpu_by_routing = true;
    else if (s == "id") c.prefill_cpu_by_routing = false;
    else bad("COLI_CUDA_PREFILL_ORDER", v, "routed or id");
  }
  if (const char* v = value_of(get, "COLI_CUDA_PREFILL_HOT")) {
    const std::string s = v;
    if (s == "auto") c.prefill_hot_pairs = -1;
    else if (s == "off") c.prefill_hot_pairs = std::numeric_limits<int>::max();
    else if (!s.empty() && s.size() <= 9 && s.find_first_not_of("0123456789") == std::string::npos) c.prefill_hot_pairs = std::stoi(s);
    else bad("COLI_CUDA_PREFILL_HOT", v, "auto, off or a count of pairs >= 0");
  }
  if (const char* v = value_of(get, "COLI_CUDA_PROFILE")) {
    const std::string s = v;
    if (s == "0") c.profile = cuda::CudaProfile::kOff;
    else if (s == "1") c.profile = cuda::CudaProfile::kSteps;
    else if (s == "graph") c.profile = cuda::CudaProfile::kGraph;
    else if (s == "prefill") c.profile = cuda::CudaProfile::kPrefill;
    else bad("COLI_CUDA_PROFILE", v, "0, 1, graph or prefill");
  }
  if (const char* v = value_of(get, "COLI_CUDA_REGISTER")) {
    const std::string s = v;
    if (s == "0") c.register_hosts = cuda::CudaOptions::Register::kNever;
    else if (s == "auto") c.register_hosts = cuda::CudaOptions::Register::kWhenNeeded;
    else if (s == "1") c.register_hosts = cuda::CudaOptions::Register::kAlways;
    else bad("COLI_CUDA_REGISTER", v, "0, auto or 1");
  }
  if (const char* v = value_of(get, "COLI_CUDA_HANDOFF")) {
    const std::string s = v;
    if (s == "thread") c.serve_handoff_inline = false;
    else if (s == "inline") c.serve_handoff_inline = true;
    else bad("COLI_CUDA_HANDOFF", v, "thread or inline");
  }
  constexpr int kMax = 1 << 30;
  read_int(get, "COLI_TUNE_STREAM_MIN_ROWS", &c.gemv_stream_min_rows, 0, kMax);
  read_int(get, "COLI_TUNE_STREAM_ROWS", &c.gemv_stream_rows, 0, 2, {}, "0, 1 or 2");
  cuda::CudaTuning& t = c.tuning;
  read_int(get, "COLI_TUNE_NORM_CLUSTER", &t.norm_cluster, 1, 8, {1, 2, 4, 8}, "1, 2, 4 or 8");
  read_int(get, "COLI_TUNE_GEMV_WARPS", &t.gemv_warps, 1, 32);
  read_int(get, "COLI_TUNE_FLOAT_WARPS", &t.float_warps, 1, 32);
  read_int(get, "COLI_TUNE_GEMV_LANES", &t.gemv_lanes, 8, 32, {8, 16, 32}, "8, 16 or 32");
  read_int(get, "COLI_TUNE_UP_ROWS", &t.up_rows, 1, 4, {1, 2, 4}, "1, 2 or 4");
  read_int(get, "COLI_TUNE_MOE_LANES", &t.moe_lanes, 8, 32, {8, 16, 32}, "8, 16 or 32");
  read_int(get, "COLI_TUNE_DOWN_ROWS", &t.down_rows, 2, 8, {2, 4, 8}, "2, 4 or 8");
  read_int(get, "COLI_TUNE_LOGIT_PARTS", &t.logit_parts, 1, 8);
  read_int(get, "COLI_TUNE_MMA_MIN", &t.mma_min_tokens, 2, 65);
  read_int(get, "COLI_TUNE_MMA_SMALL", &t.mma_small, 0, 64);
  read_int(get, "COLI_TUNE_GROUPED_MIN", &t.grouped_min_tokens, 4, 4096);
  read_int(get, "COLI_TUNE_GROUPED_MIN_ROWS", &t.grouped_min_rows, 4, 4096);
  read_int(get, "COLI_TUNE_MMA_SPLIT", &t.mma_split, 0, 64);
  read_int(get, "COLI_TUNE_PCIE_ROWS", &t.pcie_rows_max, 1, 16);
  read_int(get, "COLI_TUNE_PCIE_ROWS_SHARE", &t.pcie_rows_share, 0, 100);
  read_int(get, "COLI_TUNE_PDL_ROWS", &t.pdl_rows, 0, 4096);
  read_int(get, "COLI_TUNE_SEGMENTS_HOST", &t.segments_host_max, 0, 4096);
  read_int(get, "COLI_TUNE_DEVICE_GREEDY", &t.device_greedy, 0, 1);
  read_int(get, "COLI_TUNE_PREFILL_RING", &c.prefill_ring_slots, 1, 4096);
  return e;
}

// What a tool calls once, before its flags: caps the CPU kernels' level
// when COLI_CPU_LEVEL says so and returns the CUDA options the COLI_CUDA_*
// and COLI_TUNE_* variables ask for (defaults otherwise). The tool then
// sets its flags' values on the result, so that they win.
inline cuda::CudaOptions apply_environment() {
  EnvSettings e = read_environment([](const char* name) { return std::getenv(name); });
  if (e.cpu_level) cpu::set_active_level(*e.cpu_level);
  return e.cuda;
}

}  // namespace coli
