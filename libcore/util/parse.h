// Small parsers for command-line values.
#pragma once
#include <string>
#include <vector>

namespace coli {

// "7,8,9" -> {7, 8, 9}. Whitespace around items is allowed; empty items,
// non-numbers and negatives throw coli::UsageError naming `flag`.
std::vector<int> parse_id_list(const std::string& s, const std::string& flag);

// Like parse_id_list, for counts and sizes (llama-bench's "-p 128,512").
inline std::vector<int> parse_int_list(const std::string& s, const std::string& flag) { return parse_id_list(s, flag); }

// A worker-thread count from flag `flag`: 0 means all cores; negative counts
// and counts over 4x the hardware threads (far past any speed-up, and enough
// to exhaust the process table) throw coli::UsageError. Returns n.
int check_thread_count(int n, const std::string& flag);

}  // namespace coli
