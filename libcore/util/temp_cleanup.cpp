#include "util/temp_cleanup.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <mutex>

#include "util/error.h"

namespace coli {

namespace {

// Slot states. The handler claims a slot (kActive -> kClaimed) before it
// reads the path, so a release racing with it cannot recycle the bytes it
// reads; a claimed slot is never freed again (the process is dying).
enum : int { kFree = 0, kFilling = 1, kActive = 2, kClaimed = 3 };

struct Slot {
  std::atomic<int> state{kFree};
  TempCleanup::Kind kind = TempCleanup::Kind::kFile;
  char path[PATH_MAX];
};

// Static storage: the handler must not allocate. 256 slots cover a synthetic
// checkpoint of hundreds of shards.
constexpr int kSlots = 256;
Slot g_slots[kSlots];
constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};

// Claims every active slot, then unlinks the files and removes the
// directories among the claimed ones.
void sweep() {
  for (Slot& s : g_slots) {
    int want = kActive;
    s.state.compare_exchange_strong(want, kClaimed);
  }
  for (Slot& s : g_slots)
    if (s.state.load() == kClaimed && s.kind == TempCleanup::Kind::kFile) ::unlink(s.path);
  for (Slot& s : g_slots)
    if (s.state.load() == kClaimed && s.kind == TempCleanup::Kind::kDir) ::rmdir(s.path);
}

void on_signal(int sig) {
  const int saved = errno;
  // Files first, then their directories; a second pass catches a file a
  // writer thread registered while the first ran.
  sweep();
  sweep();
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  // Pending until the handler returns (the signal is blocked inside it),
  // then delivered with the default action: the process dies of `sig`.
  ::raise(sig);
  errno = saved;
}

}  // namespace

void install_output_signals() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (int sig : kSignals) {
      struct sigaction old {};
      if (::sigaction(sig, nullptr, &old) != 0) continue;
      // An ignored signal stays ignored; a handler someone else installed
      // stays theirs.
      if (old.sa_handler != SIG_DFL || (old.sa_flags & SA_SIGINFO)) continue;
      struct sigaction sa {};
      sa.sa_handler = on_signal;
      ::sigemptyset(&sa.sa_mask);
      for (int s : kSignals) ::sigaddset(&sa.sa_mask, s);  // one cleanup at a time per thread
      ::sigaction(sig, &sa, nullptr);
    }
    ::signal(SIGXFSZ, SIG_IGN);
  });
}

TempCleanup::TempCleanup(const std::string& path, Kind kind) {
  if (path.size() >= PATH_MAX) throw Error(path + ": path too long");
  install_output_signals();
  for (int i = 0; i < kSlots; ++i) {
    int want = kFree;
    if (!g_slots[i].state.compare_exchange_strong(want, kFilling)) continue;
    g_slots[i].kind = kind;
    std::memcpy(g_slots[i].path, path.c_str(), path.size() + 1);
    g_slots[i].state.store(kActive);
    slot_ = i;
    return;
  }
  throw Error(path + ": too many temporary files at once (" + std::to_string(kSlots) + ")");
}

TempCleanup& TempCleanup::operator=(TempCleanup&& o) noexcept {
  if (this != &o) {
    release();
    slot_ = o.slot_;
    o.slot_ = -1;
  }
  return *this;
}

void TempCleanup::release() {
  if (slot_ < 0) return;
  int want = kActive;
  g_slots[slot_].state.compare_exchange_strong(want, kFree);
  slot_ = -1;
}

}  // namespace coli
