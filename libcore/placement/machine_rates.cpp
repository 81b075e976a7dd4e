#include "placement/machine_rates.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "util/error.h"
#include "util/io.h"
#include "util/text_lines.h"

namespace coli {

namespace {

struct Field {
  const char* key;
  double MachineRates::*member;
  bool rate;  // > 0 (a rate, or a time that must not be 0) or >= 0 (a time)
};

constexpr Field kFields[] = {
    {"host_expert_gbs", &MachineRates::host_expert_gbs, true}, {"disk_gbs", &MachineRates::disk_gbs, true},
    {"pcie_gbs", &MachineRates::pcie_gbs, true},               {"gpu_layer_s", &MachineRates::gpu_layer_s, false},
    {"gpu_expert_s", &MachineRates::gpu_expert_s, false},      {"handoff_s", &MachineRates::handoff_s, false},
    {"token_fixed_s", &MachineRates::token_fixed_s, true},    {"prefill_layer_token_s", &MachineRates::prefill_layer_token_s, true},
    {"pcie_read_gbs", &MachineRates::pcie_read_gbs, true},
};

}  // namespace

std::string format_rates(const MachineRates& r, const std::string& comment) {
  std::string out = "coli-rates 1\n";
  if (!comment.empty()) out += "# " + comment + "\n";
  for (const Field& f : kFields) {
    char b[96];
    std::snprintf(b, sizeof b, "%s %.9g\n", f.key, r.*f.member);
    out += b;
  }
  return out;
}

namespace {

MachineRates parse_rates_lines(TextLines& in, const std::string& name, const MachineRates& base) {
  MachineRates r = base;
  std::set<std::string> seen;
  bool header = false;
  std::string_view raw;
  while (in.next_raw(&raw)) {
    std::string line(raw);
    auto bad = [&](const std::string& why) { return Error(name + ":" + std::to_string(in.line_no()) + ": " + why); };
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    if (!header) {
      if (line != "coli-rates 1") throw bad("expected 'coli-rates 1' (a coli-place probe rates file, version 1)");
      header = true;
      continue;
    }
    const std::size_t sp = line.find(' ');
    if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos) throw bad("expected 'key value'");
    const std::string key = line.substr(0, sp), value = line.substr(sp + 1);
    const Field* f = nullptr;
    for (const Field& x : kFields)
      if (key == x.key) f = &x;
    if (!f) throw bad("unknown key '" + key.substr(0, 64) + "'");
    if (!seen.insert(key).second) throw bad(key + " given twice");
    char* end = nullptr;
    const double v = value.empty() || std::isspace(static_cast<unsigned char>(value[0])) ? NAN : std::strtod(value.c_str(), &end);
    if (!end || end != value.c_str() + value.size() || !std::isfinite(v) || (f->rate ? !(v > 0) : !(v >= 0)) || v > 1e12)
      throw bad(key + ": '" + value.substr(0, 64) + "' is not " + (f->rate ? "a positive" : "a non-negative") + " number");
    r.*f->member = v;
  }
  if (!header) throw Error(name + ": empty (expected 'coli-rates 1')");
  return r;
}

}  // namespace

MachineRates parse_rates(std::string_view text, const std::string& name, const MachineRates& base) {
  TextLines in(text, name);
  return parse_rates_lines(in, name, base);
}

MachineRates load_rates(const std::string& path, const MachineRates& base) {
  TextLines in(TextLines::FromFile{}, path);
  return parse_rates_lines(in, path, base);
}

}  // namespace coli

namespace coli {

void save_rates(const std::string& path, const MachineRates& r, const std::string& comment) { write_text_file(path, format_rates(r, comment)); }

}  // namespace coli

namespace coli {

std::string default_rates_path(const char* xdg_cache_home, const char* home, const std::string& host, const std::string& format) {
  std::string dir;
  if (xdg_cache_home && *xdg_cache_home == '/') dir = std::string(xdg_cache_home) + "/coli";
  else if (home && *home) dir = std::string(home) + "/.cache/coli";
  if (dir.empty()) return "";
  return dir + "/rates-" + (host.empty() ? std::string("localhost") : host) + (format.empty() ? "" : "-" + format) + ".txt";
}

MachineRates cached_rates_for(const char* xdg_cache_home, const char* home, const std::string& host, const std::string& format, std::string* from) {
  std::error_code ec;
  const std::string own = default_rates_path(xdg_cache_home, home, host, format);
  if (!format.empty() && !own.empty() && std::filesystem::exists(own, ec)) return cached_rates(own, from);
  return cached_rates(default_rates_path(xdg_cache_home, home, host), from);
}

MachineRates cached_rates(const std::string& path, std::string* from) {
  std::error_code ec;
  const bool there = !path.empty() && std::filesystem::exists(path, ec);
  if (from) *from = there ? path : "";
  return there ? load_rates(path) : MachineRates{};
}

}  // namespace coli
