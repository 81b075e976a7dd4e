#include "util/parse.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <thread>

#include "util/error.h"

namespace coli {

namespace {

std::vector<int> parse_list(const std::string& s, const std::string& flag, const char* what) {
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
    if (*end || errno || v < 0 || v > 0x7fffffff) throw UsageError(flag + ": '" + item + "' is not " + what);
    out.push_back(static_cast<int>(v));
    if (j == std::string::npos) break;
    i = j + 1;
  }
  return out;
}

}  // namespace

std::vector<int> parse_id_list(const std::string& s, const std::string& flag) { return parse_list(s, flag, "a token id"); }
std::vector<int> parse_int_list(const std::string& s, const std::string& flag) { return parse_list(s, flag, "a count from 0 to 2147483647"); }

uint64_t parse_seed(const std::string& s, const std::string& flag) {
  // strtoull would take "-1" (and leading spaces or '+'): digits only.
  const bool digits = !s.empty() && s.size() <= 20 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = digits ? std::strtoull(s.c_str(), &end, 10) : 0;
  if (!digits || errno == ERANGE || *end) throw UsageError(flag + ": '" + s + "' is not a seed from 0 to 18446744073709551615");
  return v;
}

int check_thread_count(int n, const std::string& flag) {
  const int hw = std::max(1u, std::thread::hardware_concurrency());
  if (n < 0) throw UsageError(flag + " must be >= 0 (0: all " + std::to_string(hw) + " hardware threads), not " + std::to_string(n));
  if (n > 4 * hw)
    throw UsageError(flag + " " + std::to_string(n) + " is more than 4x the " + std::to_string(hw) + " hardware threads (0: use all of them)");
  return n;
}

uint64_t parse_size(const std::string& s, const std::string& flag) {
  auto bad = [&] { return UsageError(flag + ": '" + s + "' is not a size (say 8G, 12000M or 1.5GiB)"); };
  const char* p = s.c_str();
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(p, &end);
  if (end == p || errno || !(v >= 0) || s.find_first_of("xXpPnN") != std::string::npos) throw bad();  // no hex, inf or nan
  std::string unit(end);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (unit.size() == 3 && unit.substr(1) == "IB") unit.resize(1);
  else if (unit.size() == 2 && unit[1] == 'B') unit.resize(1);
  double mult = 1;
  if (unit == "K") mult = 1024.0;
  else if (unit == "M") mult = 1024.0 * 1024;
  else if (unit == "G") mult = 1024.0 * 1024 * 1024;
  else if (unit == "T") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (!unit.empty() && unit != "B") throw bad();
  const double bytes = v * mult;
  if (bytes >= 18446744073709551616.0) throw bad();
  return static_cast<uint64_t>(bytes);
}

double parse_pcie_read(const std::string& s, const std::string& flag) {
  if (s == "auto") return -1;
  if (s == "off") return 0;
  const char* p = s.c_str();
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(p, &end);
  if (end == p || *end || errno || !(v >= 0 && v <= 1) || s.find_first_of("xXpPnN") != std::string::npos)
    throw UsageError(flag + ": '" + s + "' is not a share from 0 to 1, auto or off");
  return v;
}

int parse_prefill_cpu(const std::string& s, const std::string& flag) {
  if (s == "auto") return -1;
  if (s == "off") return 0;
  if (s.empty() || s.size() > 5 || s.find_first_not_of("0123456789") != std::string::npos || std::stoi(s) > 65536)
    throw UsageError(flag + ": '" + s + "' is not auto, off or a count of experts from 0 to 65536");
  return std::stoi(s);
}

double pcie_read_share(double parsed, bool mirror, bool decode_upload) {
  if (parsed >= 0) return parsed;
  return mirror && !decode_upload ? kPcieReadAutoShare : 0.0;
}

double check_pcie_read_offset(double v, const std::string& flag) {
  if (!(v >= 0 && v <= 64)) throw UsageError(flag + " must be from 0 to 64 experts");
  return v;
}

}  // namespace coli
