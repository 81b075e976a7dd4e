// Temporary paths removed when the process is killed by SIGINT, SIGTERM or
// SIGHUP.
//
// Contract: a TempCleanup registers one path (a file, or a directory that
// holds only files also registered) for as long as it lives. The first
// registration installs a handler for those signals (unless the signal is
// ignored: a nohup'ed or background run keeps ignoring it); the handler
// unlinks every registered file, then removes every registered directory,
// then re-raises the signal with its default action, so the exit status
// still says which signal killed the process. The handler uses only
// async-signal-safe calls on paths copied into static storage when they were
// registered: it allocates nothing and takes no lock. Registration and
// release are thread-safe. kill -9 cannot be caught: callers that must leave
// nothing behind then use unnamed files or clean stale temporaries on their
// next run (see util/publish.h).
//
// install_output_signals() (which the first registration calls) also sets
// SIGXFSZ to ignored, so that a file-size limit (ulimit -f) makes writes fail
// with EFBIG, which the writers report, instead of killing the process
// without a word. Writers of unnamed files, which register nothing, call it
// directly.
#pragma once
#include <string>

namespace coli {

// Installs the handler and ignores SIGXFSZ; idempotent and thread-safe.
void install_output_signals();

class TempCleanup {
 public:
  enum class Kind { kFile, kDir };
  TempCleanup() = default;
  // Throws coli::Error if the path is too long or all slots are in use.
  TempCleanup(const std::string& path, Kind kind);
  ~TempCleanup() { release(); }
  TempCleanup(TempCleanup&& o) noexcept : slot_(o.slot_) { o.slot_ = -1; }
  TempCleanup& operator=(TempCleanup&& o) noexcept;
  TempCleanup(const TempCleanup&) = delete;
  TempCleanup& operator=(const TempCleanup&) = delete;

  // Stops watching the path (it was published, or removed by its owner).
  void release();

 private:
  int slot_ = -1;
};

}  // namespace coli
