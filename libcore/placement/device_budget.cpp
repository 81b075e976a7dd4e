#include "placement/device_budget.h"

#include <cstdio>
#include <limits>

#include "util/error.h"

namespace coli {

std::string format_bytes(uint64_t b) {
  char s[32];
  if (b >= (1ull << 30)) std::snprintf(s, sizeof s, "%.2f GiB", b / double(1ull << 30));
  else if (b >= (1ull << 20)) std::snprintf(s, sizeof s, "%.1f MiB", b / double(1ull << 20));
  else if (b >= (1ull << 10)) std::snprintf(s, sizeof s, "%.1f KiB", b / double(1ull << 10));
  else std::snprintf(s, sizeof s, "%llu B", static_cast<unsigned long long>(b));
  return s;
}

void DeviceBudget::charge(const std::string& what, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (limit_ && (bytes > limit_ || in_use_ > limit_ - bytes))
    throw Error("--vram-budget " + format_bytes(limit_) + " exceeded: " + what + " needs " + format_bytes(bytes) + " with " + format_bytes(in_use_) +
                " already in use");
  in_use_ += bytes;
  if (in_use_ > peak_) peak_ = in_use_;
}

void DeviceBudget::credit(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  in_use_ -= bytes <= in_use_ ? bytes : in_use_;
}

uint64_t DeviceBudget::in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}

uint64_t DeviceBudget::peak() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}

uint64_t DeviceBudget::available() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!limit_) return std::numeric_limits<uint64_t>::max();
  return limit_ > in_use_ ? limit_ - in_use_ : 0;
}

}  // namespace coli
