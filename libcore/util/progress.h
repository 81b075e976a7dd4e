// A progress bar on stderr, drawn only when stderr is a terminal. Thread-safe
// add(); redraws at most ten times a second.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace coli {

class Progress {
 public:
  Progress(std::string label, uint64_t total, bool enabled);
  ~Progress();
  void add(uint64_t n);
  void finish();

 private:
  void draw(bool final);
  std::string label_;
  uint64_t total_;
  bool enabled_;
  std::atomic<uint64_t> done_{0};
  std::mutex mu_;
  std::chrono::steady_clock::time_point start_, last_;
  bool finished_ = false;
};

// True when stderr is a terminal (where progress bars belong).
bool stderr_is_tty();

}  // namespace coli
