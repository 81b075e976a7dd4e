// DeviceBudget: the ledger behind --vram-budget. Every device allocation a
// backend makes is charged here, under a name, before it is made, and
// credited when it is freed, like entries against a LevelDB cache's
// capacity.
//
// Contract: charge() throws coli::Error naming what did not fit, the bytes
// asked, the bytes in use and the limit when in_use + bytes would pass the
// limit; nothing is charged then. A limit of 0 accounts without limiting.
// peak() is the most ever in use. Thread-safe; the owner (the backend)
// outlives every allocation charged to it.
#pragma once
#include <cstdint>
#include <mutex>
#include <string>

namespace coli {

class DeviceBudget {
 public:
  explicit DeviceBudget(uint64_t limit = 0) : limit_(limit) {}
  DeviceBudget(const DeviceBudget&) = delete;
  DeviceBudget& operator=(const DeviceBudget&) = delete;

  void charge(const std::string& what, uint64_t bytes);
  void credit(uint64_t bytes);

  uint64_t limit() const { return limit_; }
  uint64_t in_use() const;
  uint64_t peak() const;
  // Bytes left under the limit (UINT64_MAX without one).
  uint64_t available() const;

 private:
  const uint64_t limit_;
  mutable std::mutex mu_;
  uint64_t in_use_ = 0, peak_ = 0;
};

// "1.50 GiB", "12.0 MiB", "512 B": for messages.
std::string format_bytes(uint64_t bytes);

}  // namespace coli
