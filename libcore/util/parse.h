// Small parsers for command-line values.
#pragma once
#include <string>
#include <vector>

namespace coli {

// "7,8,9" -> {7, 8, 9}. Whitespace around items is allowed; empty items,
// non-numbers and negatives throw coli::UsageError naming `flag`.
std::vector<int> parse_id_list(const std::string& s, const std::string& flag);

}  // namespace coli
