// The model/device/tier flags that coli-run and coli-bench share (and
// coli-place and coli-pin where they apply), declared and checked in this
// one place; run_options.h turns them into the CUDA backend's options.
//
// Contract:
//  - add_flags() declares each flag with one name, type and default for
//    every tool; only the help line is worded per tool (its --help output
//    is part of its interface), in the order the caller lists them.
//  - read_run_flags() checks every value once, before any file is read,
//    and throws coli::UsageError with the message the tools have always
//    given (exit status 2). Their values take effect later, when the model
//    is known (run_options.h, run_setup.h). The tier's companions are
//    checked whether or not a budget is given (auto is the default).
//  - device_of() is the one reading of --device (and --reference).
// Everything returned is a value the caller owns.
#pragma once
#include <boost/program_options.hpp>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "common/heat_flag.h"

namespace coli::cli {

// Whose wording a flag's help line takes.
enum class Tool { kRun, kBench, kPlace, kCalibrate, kPin };

enum class Flag {
  kVramBudget,      // --vram-budget SIZE|auto (coli-bench: a list of them)
  kVramMargin,      // --vram-margin SIZE
  kMirror,          // --mirror auto|off|NAME
  kPlan,            // --plan FILE (coli-run: FILE|auto)
  kDecodeUpload,    // --decode-upload N
  kPcieRead,        // --pcie-read SHARE|auto|off
  kPcieReadOffset,  // --pcie-read-offset N
  kPrefillUpload,   // --prefill-upload
  kPrefillCpu,      // --prefill-cpu auto|off|N
  kNoSwap,          // --no-swap
  kDevice,          // --device cuda|cpu|auto
  kThreads,         // -t/--threads N (coli-bench's is a list of its own)
  kReference,       // --reference
  kHeat,            // --heat FILE|none (heat_flag.h)
};

// The expert tier's flags in coli-run's and coli-bench's order.
inline constexpr std::initializer_list<Flag> kTierFlags = {Flag::kVramBudget, Flag::kVramMargin,     Flag::kMirror,        Flag::kPlan,
                                                           Flag::kDecodeUpload, Flag::kPcieRead, Flag::kPcieReadOffset, Flag::kPrefillUpload,
                                                           Flag::kPrefillCpu,   Flag::kNoSwap};

// A --vram-budget of "auto" (the default): the device's free memory at the
// start, less --vram-margin, when the whole model does not fit in it.
inline constexpr uint64_t kBudgetAuto = ~uint64_t(0);
// --vram-margin's default: what an auto budget leaves free on the card for
// what the budget does not charge (the kernels' code and local memory,
// the driver's allocations) and for other programs' small needs.
inline constexpr uint64_t kDefaultVramMargin = uint64_t(256) << 20;

void add_flags(boost::program_options::options_description& opts, Tool tool, std::initializer_list<Flag> flags);

// --device as the backends take it: cuda, cpu or auto (the CUDA backend
// when one can be made: a usable device, weights its kernels take, a model
// that fits; else the CPU's). --reference, where the tool has it, means
// cpu (the scalar backend; --device is then not read). Any other value:
// UsageError "--device must be cuda, cpu or auto, not 'X'".
std::string device_of(const boost::program_options::variables_map& vm);

// --vram-budget's companions: what the tier does besides its size.
struct TierFlags {
  bool swap = true;             // !--no-swap
  int decode_upload = 0;        // >= 0
  double pcie_read = -1;        // parse_pcie_read's value: -1 auto, else the share
  double pcie_read_offset = 2;  // 0 .. 64
  bool prefill_upload = false;
  int prefill_cpu = -1;         // --prefill-cpu: -1 auto, else experts per layer (0: off)
};
TierFlags read_tier_flags(const boost::program_options::variables_map& vm);

struct RunFlags {
  // Bytes, > 0, or kBudgetAuto (coli-run: one; coli-bench: a list).
  // Without the flag: {kBudgetAuto}.
  std::vector<uint64_t> vram_budgets = {kBudgetAuto};
  uint64_t vram_margin = kDefaultVramMargin;
  std::string mirror = "auto";
  std::optional<std::string> plan;     // FILE, or auto (the default under a budget: planned at the start)
  TierFlags tier;
  std::string device = "auto";         // device_of()
  HeatFlag heat;

  bool plan_auto() const { return !plan || *plan == "auto"; }
};

// tool: kRun or kBench (their flags as add_flags(kTierFlags) and kDevice,
// kReference, kHeat declared them).
RunFlags read_run_flags(const boost::program_options::variables_map& vm, Tool tool);

}  // namespace coli::cli
