#include "placement/heat_recorder.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>

#include <filesystem>
#include <system_error>

#include "util/error.h"

namespace coli {

namespace fs = std::filesystem;

namespace {

// An exclusive flock on PATH.lock while it lives: the writers of one heat
// file (runs at once) read, add and rename one after the other, so no
// run's counts are lost. Without a lock file (a read-only directory) the
// save goes on unlocked and fails or not on its own.
class HeatFileLock {
 public:
  explicit HeatFileLock(const std::string& path) : fd_(::open((path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
    if (fd_ >= 0)
      while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
      }
  }
  ~HeatFileLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
  }
  HeatFileLock(const HeatFileLock&) = delete;
  HeatFileLock& operator=(const HeatFileLock&) = delete;

 private:
  int fd_;
};

// The heat file's nearest existing ancestor must be a directory this
// process may write: checked at the start, not after the run.
void check_heat_path(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::path(path).parent_path();
  while (!p.empty() && !fs::exists(p, ec)) p = p.parent_path();
  if (p.empty()) p = ".";
  if (!fs::is_directory(p, ec)) throw Error(path + ": cannot hold the heat file: " + p.string() + " is not a directory");
  if (::access(p.c_str(), W_OK) != 0 && !fs::exists(path, ec)) throw Error(path + ": cannot write the heat file: " + p.string() + " is not writable");
}

}  // namespace

HeatRecorder::HeatRecorder(std::string path, uint64_t fingerprint, const ModelSpec& spec)
    : path_(std::move(path)), fingerprint_(fingerprint), previous_(spec.num_layers, spec.num_experts), run_(previous_) {
  std::error_code ec;
  if (on() && fs::exists(path_, ec)) previous_ = load_heat(path_, fingerprint_, spec.num_layers, spec.num_experts);
  else if (on()) check_heat_path(path_);
}


void HeatRecorder::save() {
  if (!on()) return;
  std::error_code ec;
  const fs::path dir = fs::path(path_).parent_path();
  if (!dir.empty() && !fs::exists(dir, ec) && !fs::create_directories(dir, ec) && ec)
    throw Error(dir.string() + ": cannot create the heat file's directory: " + ec.message());
  const HeatFileLock lock(path_);
  Heat merged(run_.layers(), run_.experts());
  if (fs::exists(path_, ec)) merged = load_heat(path_, fingerprint_, run_.layers(), run_.experts());
  merged.merge(run_);
  save_heat(path_, merged, fingerprint_);
  run_ = Heat(run_.layers(), run_.experts());
}

}  // namespace coli
