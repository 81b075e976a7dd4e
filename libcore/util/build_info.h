// What build and machine this is, for benchmark records.
#pragma once
#include <string>

namespace coli {

std::string build_commit();  // short git hash the binary was built from, or "unknown"
std::string cpu_info();      // the CPU model name and core count
double peak_rss_mb();        // the process's peak resident memory so far

}  // namespace coli
