#include "util/publish.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "util/error.h"

namespace coli {

namespace fs = std::filesystem;

namespace {

std::string err(const std::string& path, int e) { return path + ": " + std::strerror(e); }

// "out/" names the same thing as "out"; the temporaries sit next to it.
std::string strip_slashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

std::string parent_of(const std::string& path) {
  const fs::path p = fs::path(path).parent_path();
  return p.empty() ? "." : p.string();
}

std::string temp_name(const std::string& path) { return path + ".tmp." + std::to_string(::getpid()); }

// renameat2 with flags; glibc < 2.28 lacks the wrapper, so call the syscall.
int rename2(const std::string& from, const std::string& to, unsigned flags) {
#ifdef SYS_renameat2
  return static_cast<int>(::syscall(SYS_renameat2, AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), flags));
#else
  errno = ENOSYS;
  return -1;
#endif
}
constexpr unsigned kNoReplace = 1u << 0;  // RENAME_NOREPLACE
constexpr unsigned kExchange = 1u << 1;   // RENAME_EXCHANGE

// Flushes a directory entry change to disk (best effort: some filesystems
// refuse fsync on a directory, and the data itself is already synced).
void sync_dir(const std::string& dir) {
  const int d = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d < 0) return;
  ::fsync(d);
  ::close(d);
}

// What is at path, by lstat (a symbolic link is itself, not its target).
// Returns false if nothing is there.
bool stat_output(const std::string& path, struct stat* st) {
  if (::lstat(path.c_str(), st) == 0) return true;
  if (errno == ENOENT) return false;
  throw Error(err(path, errno));
}

// The checks on an existing output file, up front and again at publish.
void check_file_target(const std::string& path, bool overwrite) {
  struct stat st;
  if (!stat_output(path, &st)) return;
  if (!S_ISREG(st.st_mode)) throw Error(path + " is " + file_type_name(st.st_mode) + ", not a regular file; refusing to replace it");
  if (!overwrite) throw Error(path + " exists; use --force to overwrite it");
}

bool holds_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_regular_file(fs::path(dir) / "config.json", ec)) return false;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors" && e.is_regular_file(ec)) return true;
  return false;
}

enum class DirTarget { kMissing, kEmpty, kCheckpoint };

DirTarget check_dir_target(const std::string& path, bool overwrite) {
  struct stat st;
  if (!stat_output(path, &st)) return DirTarget::kMissing;
  if (!S_ISDIR(st.st_mode)) throw Error(path + " is " + file_type_name(st.st_mode) + ", not a checkpoint directory; refusing to replace it");
  std::error_code ec;
  if (fs::is_empty(path, ec) && !ec) return DirTarget::kEmpty;
  if (!overwrite) throw Error(path + " exists and is not empty; use --force to overwrite it");
  if (!holds_checkpoint(path))
    throw Error(path + " is a directory that holds no checkpoint (config.json and *.safetensors); --force replaces only a checkpoint");
  return DirTarget::kCheckpoint;
}

}  // namespace

std::string file_type_name(mode_t m) {
  if (S_ISREG(m)) return "a regular file";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISLNK(m)) return "a symbolic link";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  return "an unknown kind of file";
}

int remove_stale_temps(const std::string& path_arg, bool dirs) {
  const std::string path = strip_slashes(path_arg);
  const std::string prefix = fs::path(path).filename().string() + ".tmp.";
  const std::string dir = parent_of(path);
  int removed = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(digits));
    // kill(pid, 0) fails with ESRCH only when no such process exists; EPERM
    // means it runs under another user.
    if (pid <= 0 || pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
    std::error_code tec;
    const auto st = e.symlink_status(tec);
    if (tec || (dirs ? st.type() != fs::file_type::directory : st.type() != fs::file_type::regular)) continue;
    std::error_code rec;
    if (dirs)
      fs::remove_all(e.path(), rec);
    else
      fs::remove(e.path(), rec);
    if (rec) continue;
    std::fprintf(stderr, "%s: removed %s, left by process %d, which is gone\n", program_invocation_short_name, e.path().c_str(), static_cast<int>(pid));
    ++removed;
  }
  return removed;
}

void reserve_space(int fd, const std::string& name, uint64_t bytes) {
  if (bytes == 0) return;
  struct statvfs vfs {};
  const bool have_free = ::fstatvfs(fd, &vfs) == 0;
  const uint64_t free_bytes = have_free ? uint64_t(vfs.f_bavail) * vfs.f_frsize : 0;
  const int e = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (e == 0) return;
  const std::string need = std::to_string(bytes) + " bytes";
  if (e == ENOSPC || e == EDQUOT)
    throw Error(err(name, e) + " (need " + need + (have_free ? ", " + std::to_string(free_bytes) + " free)" : ")"));
  if (e == EFBIG) {
    struct rlimit rl {};
    if (::getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
      throw Error(err(name, e) + " (need " + need + ", the file size limit is " + std::to_string(uint64_t(rl.rlim_cur)) + " bytes)");
  }
  throw Error(err(name, e) + " (reserving " + need + ")");
}

// ---- OutputFile ----

OutputFile::OutputFile(std::string path, bool overwrite, bool named) : path_(strip_slashes(std::move(path))), overwrite_(overwrite) {
  check_file_target(path_, overwrite_);
  remove_stale_temps(path_, false);
  install_output_signals();
  const std::string dir = parent_of(path_);
  if (!named) {
    fd_ = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0644);
    // Filesystems without O_TMPFILE say EOPNOTSUPP (old kernels EISDIR):
    // fall back to a named temporary. Any other error is the directory's.
    if (fd_ < 0 && errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL) throw Error(err(dir, errno) + " (creating the output there)");
    if (fd_ >= 0) return;
  }
  tmp_ = temp_name(path_);
  cleanup_ = TempCleanup(tmp_, TempCleanup::Kind::kFile);
  fd_ = ::open(tmp_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(err(tmp_, errno) + " (cannot create)");
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!published_ && !tmp_.empty()) ::unlink(tmp_.c_str());
}

// Moves the named temporary to `to`: no-replace unless `to` is the output
// and overwrite allows replacing the regular file there.
void OutputFile::link_named(const std::string& to) {
  struct stat st;
  if (overwrite_ && stat_output(to, &st)) {
    check_file_target(to, true);
    if (::rename(tmp_.c_str(), to.c_str()) != 0) throw Error(err(to, errno) + " (renaming " + tmp_ + " to it)");
    return;
  }
  if (::link(tmp_.c_str(), to.c_str()) == 0) {
    ::unlink(tmp_.c_str());
    return;
  }
  int e = errno;
  if (e != EEXIST) {
    // No hard links here (vfat, some FUSE): renameat2 also refuses to replace.
    if (rename2(tmp_, to, kNoReplace) == 0) return;
    e = errno;
  }
  if (e == EEXIST) throw Error(to + " exists (it appeared while this run was writing it); use --force to overwrite it");
  throw Error(err(to, e) + " (publishing " + tmp_ + ")");
}

uint64_t OutputFile::publish() {
  struct stat st;
  if (::fstat(fd_, &st) != 0) throw Error(err(path_, errno));
  if (::fsync(fd_) != 0) throw Error(err(path_, errno) + " (fsync)");
  check_file_target(path_, overwrite_);
  if (tmp_.empty()) {
    // Link the unnamed file in. linkat never replaces: EEXIST if something
    // appeared at the path meanwhile. /proc/self/fd works without the
    // CAP_DAC_READ_SEARCH that AT_EMPTY_PATH needs.
    const std::string proc = "/proc/self/fd/" + std::to_string(fd_);
    int rc = ::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, path_.c_str(), AT_SYMLINK_FOLLOW);
    if (rc != 0 && errno == ENOENT) rc = ::linkat(fd_, "", AT_FDCWD, path_.c_str(), AT_EMPTY_PATH);
    if (rc != 0 && errno == EEXIST && overwrite_) {
      // --force over a regular file: link under a temporary name, then
      // rename over it (rename is the only atomic replace).
      tmp_ = temp_name(path_);
      cleanup_ = TempCleanup(tmp_, TempCleanup::Kind::kFile);
      ::unlink(tmp_.c_str());
      rc = ::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, tmp_.c_str(), AT_SYMLINK_FOLLOW);
      if (rc != 0 && errno == ENOENT) rc = ::linkat(fd_, "", AT_FDCWD, tmp_.c_str(), AT_EMPTY_PATH);
      if (rc != 0) throw Error(err(tmp_, errno) + " (linking the output there)");
      link_named(path_);
    } else if (rc != 0) {
      if (errno == EEXIST) throw Error(path_ + " exists (it appeared while this run was writing it); use --force to overwrite it");
      throw Error(err(path_, errno) + " (linking the output there)");
    }
  } else {
    link_named(path_);
  }
  published_ = true;
  cleanup_.release();
  ::close(fd_);
  fd_ = -1;
  sync_dir(parent_of(path_));
  return static_cast<uint64_t>(st.st_size);
}

// ---- OutputDir ----

OutputDir::OutputDir(std::string path, bool overwrite) : path_(strip_slashes(std::move(path))), overwrite_(overwrite) {
  check_dir_target(path_, overwrite_);
  remove_stale_temps(path_, true);
  tmp_ = temp_name(path_);
  std::error_code ec;
  fs::remove_all(tmp_, ec);  // a temporary of this very PID: stale by definition
  fs::create_directories(parent_of(path_), ec);
  dir_cleanup_ = TempCleanup(tmp_, TempCleanup::Kind::kDir);
  if (::mkdir(tmp_.c_str(), 0755) != 0) throw Error(err(tmp_, errno) + " (cannot create)");
}

OutputDir::~OutputDir() {
  if (published_) return;
  std::error_code ec;
  fs::remove_all(tmp_, ec);
}

std::string OutputDir::file(const std::string& name) {
  std::string p = tmp_ + "/" + name;
  file_cleanup_.emplace_back(p, TempCleanup::Kind::kFile);
  return p;
}

void OutputDir::publish() {
  sync_dir(tmp_);
  switch (check_dir_target(path_, overwrite_)) {
    case DirTarget::kMissing:
      if (rename2(tmp_, path_, kNoReplace) == 0) break;
      if (errno == EEXIST) throw Error(path_ + " exists (it appeared while this run was writing it); use --force to overwrite it");
      if (errno != EINVAL && errno != ENOSYS) throw Error(err(path_, errno) + " (renaming " + tmp_ + " to it)");
      [[fallthrough]];  // no RENAME_NOREPLACE here: rename never replaces a non-empty directory
    case DirTarget::kEmpty:
      if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
        if (errno == ENOTEMPTY || errno == EEXIST) throw Error(path_ + " exists and is not empty (it filled while this run was writing); use --force to overwrite it");
        throw Error(err(path_, errno) + " (renaming " + tmp_ + " to it)");
      }
      break;
    case DirTarget::kCheckpoint:
      // Swap the new checkpoint in atomically, then delete the old one,
      // which now sits at the temporary name.
      if (rename2(tmp_, path_, kExchange) != 0) {
        if (errno != EINVAL && errno != ENOSYS) throw Error(err(path_, errno) + " (exchanging it with " + tmp_ + ")");
        std::error_code ec;
        fs::remove_all(path_, ec);
        if (ec) throw Error(path_ + ": " + ec.message() + " (removing the old checkpoint)");
        if (::rename(tmp_.c_str(), path_.c_str()) != 0) throw Error(err(path_, errno) + " (renaming " + tmp_ + " to it)");
      }
      break;
  }
  published_ = true;
  file_cleanup_.clear();
  dir_cleanup_.release();
  std::error_code ec;
  fs::remove_all(tmp_, ec);  // the old checkpoint after an exchange; nothing otherwise
  sync_dir(parent_of(path_));
}

}  // namespace coli
