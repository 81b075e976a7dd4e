#include "util/parse.h"

#include <cerrno>
#include <cstdlib>

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

}  // namespace coli
