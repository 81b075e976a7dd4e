// Plan: where each routed expert of a model lives, the residency plan that
// coli-place writes and coli-run, coli-bench and coli-pin follow (issue 19).
//
// Three tiers per (layer, expert):
//   vram  a slot of the GPU's expert tier (coli-run/coli-bench --vram-budget)
//   ram   the shared-memory mirror, locked (coli-pin start --plan)
//   disk  neither: the container's pages, in the page cache or not
// plus the prefill chunk size the planner picked, and the budgets and
// predictions it was made with (for --explain and humans; never trusted).
//
// The file (man 5 coli-plan) is text:
//
//   coli-plan 1
//   model <16 hex digits fingerprint> layers <L> experts <E>
//   vram-budget <bytes> ram-budget <bytes>
//   prefill-chunk <tokens>
//   layer <l> vram <list> ram <list>      one line per layer, l = 0 .. L-1 in order
//   # ...                                 comments, anywhere; blank lines ignored
//
// where <list> is "-" (none), or comma-separated expert ids and ranges
// "a-b" (inclusive), ascending and disjoint ("0-5,9,12-13"). An expert in
// neither list is on disk; one in both is an error.
//
// Contract: parse_plan() validates everything (version, shape bounds, every
// id in [0, E), order, duplicates, one line per layer in order, numbers
// that fit their types) and throws coli::Error as "NAME:LINE: what";
// format_plan() writes what parse_plan() reads back identically. A plan of
// another model (fingerprint or shape) is an error at load_plan(), so a
// stale plan never places a different model's experts.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace coli {

constexpr int kPlanVersion = 1;

enum class Tier : uint8_t { kDisk = 0, kRam = 1, kVram = 2 };

struct Plan {
  uint64_t fingerprint = 0;
  int layers = 0, experts = 0;
  uint64_t vram_budget = 0, ram_budget = 0;  // bytes the plan was made for
  int prefill_chunk = 0;                     // tokens; 0: the tool's default
  std::vector<Tier> tier;                    // [layer * experts + expert]
  std::vector<std::string> comments;         // "# ..." lines of the predictions (written at the top, not parsed back)

  Tier at(int layer, int expert) const { return tier[static_cast<std::size_t>(layer) * experts + expert]; }
  int64_t count(Tier t) const;                       // pairs in tier t
  int64_t count(Tier t, int layer) const;            // of one layer
};

// The file text of a plan (comments first, as "# " lines).
std::string format_plan(const Plan& p);
// Parses a plan's text; errors are "NAME:LINE: what" (coli::Error).
Plan parse_plan(std::string_view text, const std::string& name);
// The same of the file at path, parsed as it is read (util/text_lines.h).
Plan read_plan_file(const std::string& path);
// Reads path and checks it is a plan of this model: fingerprint, layers and
// experts as given, else coli::Error naming the file.
Plan load_plan(const std::string& path, uint64_t fingerprint, int layers, int experts);
// Writes the plan to path atomically.
void save_plan(const std::string& path, const Plan& p);

// The plan's VRAM set as routing counts [layers * experts] that make
// plan_tier() (tier_plan.h) pick exactly those experts first: 1 for vram,
// 0 otherwise. With heat (same size; else ignored), the VRAM experts get
// the heat plus more than any heat, so that a tier smaller than the plan
// keeps the hottest of them and a larger one adds the hottest others.
// How coli-run applies a plan to the expert tier.
std::vector<uint64_t> plan_as_heat(const Plan& p, const std::vector<uint64_t>& heat = {});

}  // namespace coli
