// Planning a run's experts from the tools' flags: the planner's inputs
// that coli-place plan and explain and coli-run --plan auto all take from
// here, so the same container, heat, rates, budgets, context and chunk
// give the same plan whichever tool makes it.
//
// Contract:
//  - plan_inputs() fills placement/plan_inputs.h's planner_inputs() (the
//    model's shape and the VRAM the budget leaves for experts) and adds
//    the heat (heat_flag.h planning_heat: the file, and a ready mirror's
//    counters without --heat), the rates (--rates FILE, else this
//    machine's cache that coli-place probe writes, else the defaults), the
//    runs' PCIe-read share (auto: kPcieReadAutoShare, the mirror being the
//    RAM tier the runs read) and offset, and the chunk sizes to pick from.
//  - plan_for_run() is coli-run --plan auto: plan_inputs() for its budget,
//    context and prefill chunk, with every expert counted in RAM (the run
//    reads the others from RAM or disk alike).
//  - The environment (XDG_CACHE_HOME, HOME) and the host name are read
//    here; errors are coli::Error naming the file (heat, rates).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/heat_flag.h"
#include "common/run_flags.h"
#include "formats/container.h"
#include "mirror/mirror.h"
#include "model/model_spec.h"
#include "placement/plan.h"
#include "placement/planner.h"

namespace coli::cli {

struct PlanRequest {
  uint64_t vram_budget = 0;
  std::optional<uint64_t> ram_budget;  // RAM for experts; none: every expert's bytes
  int ctx = 4096;                      // tokens the KV cache is planned for
  int chunk = 512;                     // the prefill chunk whose activations the VRAM holds
  std::vector<int> chunks;             // sizes the plan picks its chunk from: those up to chunk (none left: chunk)
  bool prefill_upload = false;
  double pcie_read = -1;               // parse_pcie_read's value (-1: auto)
  double pcie_read_offset = 2;
  HeatFlag heat;
  std::string rates_file;                      // --rates FILE; "": this machine's cache
  const MirrorAttachment* mirror = nullptr;    // the run's mirror, for its heat (heat_flag.h)
};

// *rates_from: the rates file read, or "" for the defaults.
PlannerInputs plan_inputs(const Container& c, const ModelSpec& spec, const PlanRequest& r, std::string* rates_from = nullptr);

// model: coli-run's --model (a coli container, or a directory holding
// model.coli; anything else is a UsageError). *predicted and *rates_from
// (when given): for its -v line.
Plan plan_for_run(const std::string& model, const ModelSpec& spec, const RunFlags& flags, int n_ctx, int chunk, const MirrorAttachment* mirror,
                  Prediction* predicted = nullptr, std::string* rates_from = nullptr);

// This machine's name, which names its rates cache ("" when unknown).
std::string host_name();

// The rates the planner reads for container c: file when given, else this
// machine's cache for c's expert format, else the defaults (*from: the
// file read, or "").
MachineRates rates_of(const Container& c, const std::string& file, std::string* from = nullptr);

}  // namespace coli::cli
