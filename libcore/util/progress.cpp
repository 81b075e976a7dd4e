#include "util/progress.h"

#include <unistd.h>

#include <cstdio>

namespace coli {

bool stderr_is_tty() { return ::isatty(2) == 1; }

Progress::Progress(std::string label, uint64_t total, bool enabled)
    : label_(std::move(label)), total_(total ? total : 1), enabled_(enabled), start_(std::chrono::steady_clock::now()), last_(start_) {}

Progress::~Progress() { finish(); }

void Progress::add(uint64_t n) {
  done_ += n;
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock() || now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  draw(false);
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (enabled_) {
    std::lock_guard<std::mutex> lock(mu_);
    draw(true);
  }
}

void Progress::draw(bool final) {
  const double f = std::min(1.0, double(done_) / double(total_));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  constexpr int kWidth = 30;
  const int fill = static_cast<int>(f * kWidth);
  std::string bar(fill, '#');
  bar.resize(kWidth, '.');
  std::fprintf(stderr, "\r%s [%s] %5.1f%% %6.1fs%s", label_.c_str(), bar.c_str(), 100 * f, secs, final ? "\n" : "");
  std::fflush(stderr);
}

}  // namespace coli
