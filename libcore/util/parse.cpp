#include "util/parse.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <thread>

#include "util/error.h"

namespace coli {

std::vector<int> parse_id_list(const std::string& s, const std::string& flag) {
  std::vector<int> out;
  std::size_t i = 0;
  while (true) {
    std::size_t j = s.find(',', i);
    std::string item = s.substr(i, j == std::string::npos ? std::string::npos : j - i);
    const auto b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    item = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    if (item.empty()) throw UsageError(flag + ": empty item in '" + s + "'");
    char* end = nullptr;
    errno = 0;
    long v = std::strtol(item.c_str(), &end, 10);
    if (*end || errno || v < 0 || v > 0x7fffffff) throw UsageError(flag + ": '" + item + "' is not a token id");
    out.push_back(static_cast<int>(v));
    if (j == std::string::npos) break;
    i = j + 1;
  }
  return out;
}

int check_thread_count(int n, const std::string& flag) {
  const int hw = std::max(1u, std::thread::hardware_concurrency());
  if (n < 0) throw UsageError(flag + " must be >= 0 (0: all " + std::to_string(hw) + " hardware threads), not " + std::to_string(n));
  if (n > 4 * hw)
    throw UsageError(flag + " " + std::to_string(n) + " is more than 4x the " + std::to_string(hw) + " hardware threads (0: use all of them)");
  return n;
}

}  // namespace coli
