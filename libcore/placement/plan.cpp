#include "placement/plan.h"

#include <algorithm>
#include <cstdio>

#include "formats/container.h"
#include "placement/heat.h"
#include "util/error.h"
#include "util/io.h"
#include "util/text_lines.h"

namespace coli {

namespace {

constexpr uint64_t kMaxPrefillChunk = uint64_t(1) << 20;

const char* tier_name(Tier t) { return t == Tier::kVram ? "vram" : t == Tier::kRam ? "ram" : "disk"; }

// Sets the experts of one layer's list (row: that layer's tiers) to t.
// Every id is checked against experts, ascending order and disjointness
// within the list, and against the tier already set by the other list.
void parse_list(const TextLines& in, std::string_view w, Tier t, int layer, uint64_t experts, Tier* row) {
  if (w == "-") return;
  const std::string what = std::string(tier_name(t)) + " expert";
  uint64_t next_min = 0;  // the smallest id the next item may start at
  bool first = true;
  std::size_t pos = 0;
  while (true) {
    const std::size_t comma = std::min(w.find(',', pos), w.size());
    const std::string_view item = w.substr(pos, comma - pos);
    if (item.empty())
      in.fail("layer " + std::to_string(layer) + " " + tier_name(t) + " list '" + std::string(w.substr(0, 48)) +
              "' has an empty item (ids and ranges a-b, comma-separated, or '-' for none)");
    const std::size_t dash = item.find('-');
    const uint64_t a = in.number(item.substr(0, dash), what.c_str());
    uint64_t b = a;
    if (dash != std::string_view::npos) {
      b = in.number(item.substr(dash + 1), what.c_str());
      if (b <= a) in.fail("layer " + std::to_string(layer) + " " + tier_name(t) + " range " + std::to_string(a) + "-" + std::to_string(b) + " is not ascending");
    }
    if (b >= experts)
      in.fail("layer " + std::to_string(layer) + " " + what + " " + std::to_string(b) + " is outside [0, " + std::to_string(experts) + ")");
    if (!first && a < next_min)
      in.fail("layer " + std::to_string(layer) + " " + tier_name(t) + " list is not ascending and disjoint at '" + std::string(item.substr(0, 24)) + "'");
    for (uint64_t e = a; e <= b; ++e) {
      if (row[e] != Tier::kDisk)
        in.fail("layer " + std::to_string(layer) + " expert " + std::to_string(e) + " is in both the " + tier_name(row[e]) + " and the " + tier_name(t) +
                " lists");
      row[e] = t;
    }
    next_min = b + 1;
    first = false;
    if (comma == w.size()) break;
    pos = comma + 1;
  }
}

// The list of one layer's experts in tier t: "-", or ascending ids with
// every run of two or more written as a range.
std::string format_list(const Tier* row, int experts, Tier t) {
  std::string s;
  for (int e = 0; e < experts;) {
    if (row[e] != t) {
      ++e;
      continue;
    }
    int last = e;
    while (last + 1 < experts && row[last + 1] == t) ++last;
    if (!s.empty()) s += ',';
    s += std::to_string(e);
    if (last > e) s += '-' + std::to_string(last);
    e = last + 1;
  }
  return s.empty() ? "-" : s;
}

// A plan that format_plan() can write so that parse_plan() reads it back.
void check_plan(const Plan& p, const char* who) {
  if (p.layers < 0 || p.experts < 0 || !expert_table_shape_ok(uint64_t(p.layers), uint64_t(p.experts)))
    throw Error(std::string(who) + ": " + expert_table_shape_error("plan", uint64_t(std::max(p.layers, 0)), uint64_t(std::max(p.experts, 0))));
  if (p.tier.size() != std::size_t(p.layers) * p.experts)
    throw Error(std::string(who) + ": a plan of " + std::to_string(p.layers) + " x " + std::to_string(p.experts) + " with " +
                std::to_string(p.tier.size()) + " tiers (internal)");
}

}  // namespace

int64_t Plan::count(Tier t) const { return static_cast<int64_t>(std::count(tier.begin(), tier.end(), t)); }

int64_t Plan::count(Tier t, int layer) const {
  if (layer < 0 || layer >= layers || tier.size() < std::size_t(layers) * experts)
    throw Error("plan: layer " + std::to_string(layer) + " outside [0, " + std::to_string(layers) + ")");
  const auto b = tier.begin() + static_cast<std::ptrdiff_t>(layer) * experts;
  return static_cast<int64_t>(std::count(b, b + experts, t));
}

std::string format_plan(const Plan& p) {
  check_plan(p, "plan");
  if (p.prefill_chunk < 0 || uint64_t(p.prefill_chunk) > kMaxPrefillChunk)
    throw Error("plan: prefill chunk " + std::to_string(p.prefill_chunk) + " is outside 0.." + std::to_string(kMaxPrefillChunk));
  std::string s;
  // Comments first; one "# " line per line of each (a newline in a comment
  // must not start a line the reader would parse).
  for (const std::string& c : p.comments) {
    std::size_t pos = 0;
    while (true) {
      const std::size_t end = std::min(c.find('\n', pos), c.size());
      std::string line = c.substr(pos, end - pos);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      s += line.empty() ? "#\n" : "# " + line + "\n";
      if (end == c.size()) break;
      pos = end + 1;
    }
  }
  s += "coli-plan " + std::to_string(kPlanVersion) + "\n";
  s += "model " + hex64(p.fingerprint) + " layers " + std::to_string(p.layers) + " experts " + std::to_string(p.experts) + "\n";
  s += "vram-budget " + std::to_string(p.vram_budget) + " ram-budget " + std::to_string(p.ram_budget) + "\n";
  s += "prefill-chunk " + std::to_string(p.prefill_chunk) + "\n";
  for (int l = 0; l < p.layers; ++l) {
    const Tier* row = p.tier.data() + std::size_t(l) * p.experts;
    for (int e = 0; e < p.experts; ++e)
      if (row[e] != Tier::kDisk && row[e] != Tier::kRam && row[e] != Tier::kVram)
        throw Error("plan: tier " + std::to_string(int(row[e])) + " of layer " + std::to_string(l) + " expert " + std::to_string(e) + " (internal)");
    s += "layer " + std::to_string(l) + " vram " + format_list(row, p.experts, Tier::kVram) + " ram " + format_list(row, p.experts, Tier::kRam) + "\n";
  }
  return s;
}

namespace {

Plan parse_plan_lines(TextLines& in, const std::string& name) {
  std::vector<std::string_view> w;
  // The magic is the first line that is neither blank nor a comment
  // (format_plan writes the predictions above it).
  if (!in.next(w))
    throw Error(name + (in.empty() ? ":1: empty file, not a coli plan file" : ":1: only blank lines or comments, not a coli plan file (expected 'coli-plan " +
                                                                                  std::to_string(kPlanVersion) + "')"));
  if (w[0] != "coli-plan" || w.size() != 2) in.fail("not a coli plan file (expected 'coli-plan " + std::to_string(kPlanVersion) + "')");
  const uint64_t version = in.number(w[1], "version");
  if (version != kPlanVersion)
    in.fail("plan file version " + std::to_string(version) + " is not supported (this build reads version " + std::to_string(kPlanVersion) + ")");
  Plan p;

  if (!in.next(w)) in.fail_eof_at_next_line("no 'model' line");
  if (w.size() != 6 || w[0] != "model" || w[2] != "layers" || w[4] != "experts") in.fail("expected 'model FINGERPRINT layers L experts E'");
  p.fingerprint = in.fingerprint(w[1]);
  const uint64_t layers = in.number(w[3], "layers");
  const uint64_t experts = in.number(w[5], "experts");
  if (!expert_table_shape_ok(layers, experts)) in.fail(expert_table_shape_error("plan", layers, experts));
  p.layers = int(layers), p.experts = int(experts);

  if (!in.next(w)) in.fail_eof_at_next_line("no 'vram-budget' line");
  if (w.size() != 4 || w[0] != "vram-budget" || w[2] != "ram-budget") in.fail("expected 'vram-budget BYTES ram-budget BYTES'");
  p.vram_budget = in.number(w[1], "vram-budget");
  p.ram_budget = in.number(w[3], "ram-budget");

  if (!in.next(w)) in.fail_eof_at_next_line("no 'prefill-chunk' line");
  if (w.size() != 2 || w[0] != "prefill-chunk") in.fail("expected 'prefill-chunk TOKENS'");
  const uint64_t chunk = in.number(w[1], "prefill-chunk");
  if (chunk > kMaxPrefillChunk) in.fail("prefill-chunk " + std::to_string(chunk) + " is outside 0.." + std::to_string(kMaxPrefillChunk));
  p.prefill_chunk = int(chunk);

  p.tier.assign(std::size_t(layers) * experts, Tier::kDisk);
  for (uint64_t l = 0; l < layers; ++l) {
    if (!in.next(w)) in.fail_eof_at_next_line("no line for layer " + std::to_string(l) + " of " + std::to_string(layers));
    if (w[0] != "layer") in.fail("expected 'layer " + std::to_string(l) + " vram LIST ram LIST'");
    if (w.size() < 2) in.fail("expected layer " + std::to_string(l) + " here (layers in order)");
    const uint64_t got = in.number(w[1], "layer");
    if (got < l) in.fail("layer " + std::to_string(got) + " again (one line per layer, in order)");
    if (got > l) in.fail("layer " + std::to_string(got) + " where layer " + std::to_string(l) + " was expected (one line per layer, in order)");
    if (w.size() != 6 || w[2] != "vram" || w[4] != "ram") in.fail("expected 'layer " + std::to_string(l) + " vram LIST ram LIST'");
    Tier* row = p.tier.data() + l * experts;
    parse_list(in, w[3], Tier::kVram, int(l), experts, row);
    parse_list(in, w[5], Tier::kRam, int(l), experts, row);
  }
  if (in.next(w)) in.fail("unexpected '" + std::string(w[0].substr(0, 24)) + "' after the last layer");
  return p;
}

}  // namespace

Plan parse_plan(std::string_view text, const std::string& name) {
  TextLines in(text, name);
  return parse_plan_lines(in, name);
}

Plan read_plan_file(const std::string& path) {
  TextLines in(TextLines::FromFile{}, path);
  return parse_plan_lines(in, path);
}

Plan load_plan(const std::string& path, uint64_t fingerprint, int layers, int experts) {
  Plan p = read_plan_file(path);
  if (p.fingerprint != fingerprint)
    throw Error(path + ": plan of model " + hex64(p.fingerprint) + ", not of this model " + hex64(fingerprint) + " (run coli-place again)");
  if (p.layers != layers || p.experts != experts)
    throw Error(path + ": plan of " + std::to_string(p.layers) + " layers x " + std::to_string(p.experts) + " experts, the model has " +
                std::to_string(layers) + " x " + std::to_string(experts));
  return p;
}

void save_plan(const std::string& path, const Plan& p) { write_text_file(path, format_plan(p)); }

std::vector<uint64_t> plan_as_heat(const Plan& p, const std::vector<uint64_t>& heat) {
  check_plan(p, "plan");
  std::vector<uint64_t> h(p.tier.size(), 0);
  if (heat.size() != p.tier.size()) {
    for (std::size_t i = 0; i < p.tier.size(); ++i) h[i] = p.tier[i] == Tier::kVram ? 1 : 0;
    return h;
  }
  // Half the range above the hottest count (counts past 2^63 saturate there).
  uint64_t top = 0;
  for (uint64_t c : heat) top = std::max(top, std::min(c, uint64_t(1) << 62));
  for (std::size_t i = 0; i < p.tier.size(); ++i) {
    const uint64_t c = std::min(heat[i], uint64_t(1) << 62);
    h[i] = p.tier[i] == Tier::kVram ? top + 1 + c : c;
  }
  return h;
}

}  // namespace coli
