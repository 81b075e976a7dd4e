// The machine's measured rates (planner.h MachineRates) as a small text
// file, which `coli-place probe` writes (cached per machine under
// $XDG_CACHE_HOME/coli) and `coli-place --rates` reads:
//
//   coli-rates 1
//   host_expert_gbs 61.5        one "key value" line per rate, any order,
//   pcie_gbs 55.3               each at most once; a key left out keeps the
//   ...                         planner's default; "#" lines are comments
//
// Contract: parse_rates() validates the version, every key (the names of
// MachineRates' fields), every value (a finite number, > 0 for rates,
// >= 0 for times) and throws coli::Error as "NAME:LINE: what".
// format_rates() writes every field; parse_rates(format_rates(r)) == r up
// to the 9 significant digits written.
#pragma once
#include <string>
#include <string_view>

#include "placement/planner.h"

namespace coli {

std::string format_rates(const MachineRates& r, const std::string& comment = "");
MachineRates parse_rates(std::string_view text, const std::string& name, const MachineRates& base = {});
MachineRates load_rates(const std::string& path, const MachineRates& base = {});
// Where `coli-place probe` caches this machine's rates: $XDG_CACHE_HOME/coli
// (an absolute XDG_CACHE_HOME), else $HOME/.cache/coli, file
// rates-HOST.txt, or rates-HOST-FORMAT.txt for a model whose experts are in
// FORMAT (the CPU's expert rate depends on it); "" when neither directory
// is set. The tools pass the environment in.
std::string default_rates_path(const char* xdg_cache_home, const char* home, const std::string& host, const std::string& format = "");
// The cached rates for experts in `format`: rates-HOST-FORMAT.txt, else
// rates-HOST.txt, else the defaults (*from: the file read, or "").
MachineRates cached_rates_for(const char* xdg_cache_home, const char* home, const std::string& host, const std::string& format,
                              std::string* from = nullptr);
// The cached rates when the file exists, else the defaults; *from (when
// given) is set to the file read, or "" for the defaults.
MachineRates cached_rates(const std::string& path, std::string* from = nullptr);
// Writes format_rates(r, comment) to path atomically, replacing a regular file.
void save_rates(const std::string& path, const MachineRates& r, const std::string& comment = "");

}  // namespace coli
