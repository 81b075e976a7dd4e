#include "placement/heat.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "formats/container.h"
#include "util/error.h"
#include "util/io.h"
#include "util/text_lines.h"

namespace coli {

namespace {

uint64_t sat_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

uint64_t scaled(uint64_t v, double f) {
  const double x = std::round(static_cast<double>(v) * f);
  return x >= 18446744073709551615.0 ? UINT64_MAX : static_cast<uint64_t>(x);
}

// Format bounds: generous for real models (Qwen3.5-MoE: 60 layers x 512
// experts at most so far), small enough that a hostile header cannot make
// a reader allocate much.
constexpr int kMaxLayers = 4096, kMaxExperts = 65536;
constexpr std::size_t kMaxEntries = std::size_t(1) << 20;

}  // namespace

bool expert_table_shape_ok(uint64_t layers, uint64_t experts) {
  return layers >= 1 && layers <= kMaxLayers && experts >= 1 && experts <= kMaxExperts && layers * experts <= kMaxEntries;
}

std::string expert_table_shape_error(const std::string& what, uint64_t layers, uint64_t experts) {
  return what + " of " + std::to_string(layers) + " layers x " + std::to_string(experts) + " experts is outside 1..4096 x 1..65536 (at most " +
         std::to_string(kMaxEntries) + " entries)";
}

Heat::Heat(int layers, int experts) : layers_(layers), experts_(experts) {
  if (layers < 0 || experts < 0 || !expert_table_shape_ok(uint64_t(layers), uint64_t(experts))) throw Error(expert_table_shape_error("heat", layers, experts));
  counts_.assign(std::size_t(layers) * experts, 0);
}

void Heat::add(int layer, const int* idx, std::size_t n) {
  if (layer < 0 || layer >= layers_) throw Error("heat: layer " + std::to_string(layer) + " outside [0, " + std::to_string(layers_) + ")");
  for (std::size_t i = 0; i < n; ++i)
    if (idx[i] < 0 || idx[i] >= experts_) throw Error("heat: expert " + std::to_string(idx[i]) + " outside [0, " + std::to_string(experts_) + ")");
  uint64_t* row = counts_.data() + std::size_t(layer) * experts_;
  for (std::size_t i = 0; i < n; ++i) row[idx[i]] = sat_add(row[idx[i]], 1);
}

void Heat::add_counts(std::span<const uint64_t> c) {
  if (c.size() != counts_.size())
    throw Error("heat: a table of " + std::to_string(c.size()) + " counts added to one of " + std::to_string(counts_.size()) + " (internal)");
  for (std::size_t i = 0; i < c.size(); ++i) counts_[i] = sat_add(counts_[i], c[i]);
}

void Heat::add_tokens(uint64_t n) { tokens_ = sat_add(tokens_, n); }

void Heat::merge(const Heat& newer, uint64_t half_life_tokens) {
  if (newer.layers_ != layers_ || newer.experts_ != experts_)
    throw Error("heat: merging " + std::to_string(newer.layers_) + "x" + std::to_string(newer.experts_) + " into " + std::to_string(layers_) + "x" +
                std::to_string(experts_));
  if (half_life_tokens && newer.tokens_) {
    const double f = std::exp2(-static_cast<double>(newer.tokens_) / static_cast<double>(half_life_tokens));
    for (uint64_t& c : counts_) c = scaled(c, f);
    tokens_ = scaled(tokens_, f);  // rounding is monotone: count <= tokens still holds
  }
  add_counts(newer.counts_);
  add_tokens(newer.tokens_);
}

std::vector<int> Heat::order(int layer) const {
  if (layer < 0 || layer >= layers_) throw Error("heat: layer " + std::to_string(layer) + " outside [0, " + std::to_string(layers_) + ")");
  std::vector<int> o(experts_);
  std::iota(o.begin(), o.end(), 0);
  const uint64_t* row = counts_.data() + std::size_t(layer) * experts_;
  std::stable_sort(o.begin(), o.end(), [&](int a, int b) { return row[a] > row[b]; });
  return o;
}

std::vector<Heat::Entry> Heat::global_order() const {
  std::vector<Entry> o;
  o.reserve(counts_.size());
  for (int l = 0; l < layers_; ++l)
    for (int e = 0; e < experts_; ++e) o.push_back({l, e, count(l, e)});
  std::stable_sort(o.begin(), o.end(), [](const Entry& a, const Entry& b) { return a.count > b.count; });
  return o;
}

std::string format_heat(const Heat& h, uint64_t fingerprint) {
  std::string s = "coli-heat " + std::to_string(kHeatVersion) + "\n";
  s += "# routing counts per (layer, expert): man 5 coli-heat\n";
  s += "model " + hex64(fingerprint) + "\n";
  s += "layers " + std::to_string(h.layers()) + "\n";
  s += "experts " + std::to_string(h.experts()) + "\n";
  s += "tokens " + std::to_string(h.tokens()) + "\n";
  for (int l = 0; l < h.layers(); ++l) {
    s += "layer " + std::to_string(l);
    for (int e = 0; e < h.experts(); ++e) s += " " + std::to_string(h.count(l, e));
    s += "\n";
  }
  return s;
}

namespace {

HeatFile parse_heat_lines(TextLines& in, const std::string& name) {
  std::vector<std::string_view> w;
  // The magic must be the very first line: anything else is not a heat file.
  const bool got = in.next(w);
  if (!got || in.line_no() != 1 || !in.raw_line().starts_with("coli-heat") || w[0] != "coli-heat" || w.size() != 2) {
    if (in.empty()) throw Error(name + ": empty file, not a coli heat file");
    throw Error(name + ":1: not a coli heat file (expected 'coli-heat " + std::to_string(kHeatVersion) + "')");
  }
  const uint64_t version = in.number(w[1], "version");
  if (version != kHeatVersion)
    in.fail("heat file version " + std::to_string(version) + " is not supported (this build reads version " + std::to_string(kHeatVersion) + ")");
  HeatFile f;
  if (!in.next(w)) in.fail_eof("no 'model' line");
  if (w[0] != "model" || w.size() != 2) in.fail("expected 'model FINGERPRINT'");
  f.fingerprint = in.fingerprint(w[1]);
  const uint64_t layers = in.field("layers");
  if (!expert_table_shape_ok(layers, 1)) in.fail("heat of " + std::to_string(layers) + " layers is outside 1..4096");
  const uint64_t experts = in.field("experts");
  if (!expert_table_shape_ok(layers, experts)) in.fail(expert_table_shape_error("heat", layers, experts));
  const uint64_t tokens = in.field("tokens");
  f.heat = Heat(int(layers), int(experts));
  f.heat.add_tokens(tokens);
  std::vector<uint64_t> counts(layers * experts);
  for (uint64_t l = 0; l < layers; ++l) {
    if (!in.next(w)) in.fail_eof("no line for layer " + std::to_string(l) + " of " + std::to_string(layers));
    if (w[0] != "layer") in.fail("expected 'layer " + std::to_string(l) + " COUNTS...'");
    if (w.size() < 2 || in.number(w[1], "layer") != l) in.fail("expected layer " + std::to_string(l) + " here (layers in order)");
    if (w.size() != experts + 2)
      in.fail("layer " + std::to_string(l) + " has " + std::to_string(w.size() - 2) + " counts, not " + std::to_string(experts));
    for (uint64_t e = 0; e < experts; ++e) {
      const uint64_t c = in.number(w[e + 2], "count");
      if (c > tokens) in.fail("count " + std::to_string(c) + " of expert " + std::to_string(e) + " exceeds the " + std::to_string(tokens) + " tokens");
      counts[l * experts + e] = c;
    }
  }
  if (in.next(w)) in.fail("unexpected '" + std::string(w[0].substr(0, 24)) + "' after the last layer");
  f.heat.add_counts(counts);
  return f;
}

}  // namespace

HeatFile parse_heat(std::string_view text, const std::string& name) {
  TextLines in(text, name);
  return parse_heat_lines(in, name);
}

HeatFile read_heat_file(const std::string& path) {
  TextLines in(TextLines::FromFile{}, path);
  return parse_heat_lines(in, path);
}

Heat load_heat(const std::string& path, uint64_t fingerprint, int layers, int experts) {
  HeatFile f = read_heat_file(path);
  if (f.fingerprint != fingerprint)
    throw Error(path + ": heat of model " + hex64(f.fingerprint) + ", not of this model " + hex64(fingerprint) + " (give another --heat file)");
  if (f.heat.layers() != layers || f.heat.experts() != experts)
    throw Error(path + ": heat of " + std::to_string(f.heat.layers()) + " layers x " + std::to_string(f.heat.experts()) + " experts, the model has " +
                std::to_string(layers) + " x " + std::to_string(experts));
  return std::move(f.heat);
}

void save_heat(const std::string& path, const Heat& heat, uint64_t fingerprint) { write_text_file(path, format_heat(heat, fingerprint)); }

std::string default_heat_path(uint64_t fingerprint, const char* xdg_cache_home, const char* home) {
  std::string dir;
  if (xdg_cache_home && xdg_cache_home[0] == '/') dir = xdg_cache_home;
  else if (home && *home) dir = std::string(home) + "/.cache";
  else return "";
  return dir + "/coli/heat-" + hex64(fingerprint) + ".txt";
}

std::string heat_path_for(const std::string& flag, uint64_t fingerprint, const char* xdg_cache_home, const char* home) {
  if (flag == "none") return "";
  return flag.empty() ? default_heat_path(fingerprint, xdg_cache_home, home) : flag;
}

}  // namespace coli
