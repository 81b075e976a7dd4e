// Heat: how often the router picked each (layer, expert), the statistic the
// tier fills its VRAM slots from (hottest first).
//
// Contract:
//  - counts[layer * experts + e] is the number of tokens whose top-k at that
//    layer held expert e; tokens is the number of tokens counted (each once,
//    not once per layer). So count <= tokens, and a layer's counts sum to
//    tokens * k for an undecayed table.
//  - Decay happens only on merge: the older table is scaled by
//    2^(-newer.tokens / half_life) (rounded to nearest) before the newer is
//    added, so the workload of the last ~half_life tokens weighs most and a
//    model's heat follows a change of use. Counts and tokens saturate at
//    2^64 - 1.
//  - The file (man 5 coli-heat) is text: "coli-heat 1", then model
//    fingerprint, layers, experts, tokens, then one "layer L c0 c1 ..." line
//    per layer. Reading validates everything and throws coli::Error as
//    "FILE:LINE: what"; a file of another model (fingerprint or shape) is an
//    error too, so a wrong --heat never overwrites another model's heat.
//  - Writing is atomic (util/publish.h): readers see the old file or the new
//    one, and no temporary outlives the run. Two runs that save at once keep
//    one run's counts (the last to save).
// Not thread-safe: one thread adds (the engine's).
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace coli {

// The default merge half-life, in tokens (man 5 coli-heat).
constexpr uint64_t kHeatHalfLifeTokens = uint64_t(1) << 22;

// The bounds of a per (layer, expert) table in coli's files (heat, plan:
// 1..4096 layers x 1..65536 experts, at most 2^20 entries), and the error
// "WHAT of L layers x E experts is outside ..." for a shape beyond them.
bool expert_table_shape_ok(uint64_t layers, uint64_t experts);
std::string expert_table_shape_error(const std::string& what, uint64_t layers, uint64_t experts);

// The format version this build reads and writes.
constexpr int kHeatVersion = 1;

class Heat {
 public:
  Heat() = default;
  // A zero table; throws coli::Error for a shape outside the format's bounds.
  Heat(int layers, int experts);

  int layers() const { return layers_; }
  int experts() const { return experts_; }
  uint64_t tokens() const { return tokens_; }
  uint64_t count(int layer, int expert) const { return counts_[std::size_t(layer) * experts_ + expert]; }
  // Row-major [layers, experts].
  std::span<const uint64_t> counts() const { return counts_; }
  bool empty() const { return tokens_ == 0; }

  // Counts n expert ids routed at layer (a chunk's [T, k] top-k ids).
  // An id outside [0, experts) throws (nothing counted).
  void add(int layer, const int* idx, std::size_t n);
  // Adds a whole [layers, experts] table (a device backend's counters).
  void add_counts(std::span<const uint64_t> counts);
  void add_tokens(uint64_t n);
  // this = this * 2^(-newer.tokens / half_life_tokens) + newer (counts and
  // tokens); half_life_tokens 0: no decay. Shapes must match.
  void merge(const Heat& newer, uint64_t half_life_tokens = kHeatHalfLifeTokens);

  // Layer's experts, hottest first (ties: lower index first).
  std::vector<int> order(int layer) const;
  struct Entry {
    int layer, expert;
    uint64_t count;
  };
  // Every (layer, expert), hottest first (ties: lower layer, then expert).
  // A layer's counts are comparable across layers: each layer routes every
  // token to the same k experts.
  std::vector<Entry> global_order() const;

 private:
  int layers_ = 0, experts_ = 0;
  uint64_t tokens_ = 0;
  std::vector<uint64_t> counts_;
};

// A parsed heat file.
struct HeatFile {
  uint64_t fingerprint = 0;
  Heat heat;
};

// The file text of heat for the model with this fingerprint.
std::string format_heat(const Heat& heat, uint64_t fingerprint);
// Parses a heat file's text; errors are "NAME:LINE: what" (coli::Error).
HeatFile parse_heat(std::string_view text, const std::string& name);
// The same of the file at path, parsed as it is read (util/text_lines.h).
HeatFile read_heat_file(const std::string& path);
// Reads path and checks it is the heat of this model: fingerprint, layers
// and experts as given, else coli::Error naming the file.
Heat load_heat(const std::string& path, uint64_t fingerprint, int layers, int experts);
// Writes heat to path atomically, replacing a regular file there.
void save_heat(const std::string& path, const Heat& heat, uint64_t fingerprint);

// Where a model's heat lives without --heat: $XDG_CACHE_HOME/coli (an
// absolute XDG_CACHE_HOME), else $HOME/.cache/coli, file
// heat-<16 hex digit fingerprint>.txt; "" when neither is set. The tools
// pass the environment in (libcore reads none).
std::string default_heat_path(uint64_t fingerprint, const char* xdg_cache_home, const char* home);
// The tools' --heat value: "none" -> "" (off), "" (not given) -> the
// default path, anything else is the file.
std::string heat_path_for(const std::string& flag, uint64_t fingerprint, const char* xdg_cache_home, const char* home);

}  // namespace coli
