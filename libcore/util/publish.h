// Publishing a tool's output: the file (or directory) appears at its path
// only when complete, never over something it must not replace, and no
// temporary outlives the run.
//
// Contract:
//  - The output is written elsewhere first: an OutputFile is an unnamed file
//    (O_TMPFILE) in the target's directory, so a run killed by anything,
//    kill -9 included, leaves nothing visible; where the filesystem has no
//    O_TMPFILE it is PATH.tmp.PID, removed on SIGINT/SIGTERM/SIGHUP (see
//    util/temp_cleanup.h) and otherwise by the next run (below). An
//    OutputDir is always PATH.tmp.PID, its files registered the same way.
//  - publish() links the output in without replacing anything (linkat,
//    renameat2 RENAME_NOREPLACE): an output that appeared at the path while
//    this run was writing makes it fail with "PATH exists", not vanish.
//    With overwrite (--force), an OutputFile replaces only a regular file
//    and an OutputDir only an empty directory or one that holds a checkpoint
//    (config.json and safetensors); anything else (a device, a FIFO, a
//    symbolic link, a socket, another directory) is refused, naming what it
//    is, both up front and at publish().
//  - Constructors first remove the PATH.tmp.PID temporaries of earlier runs
//    whose process is gone (one line each on stderr).
//  - reserve_space() allocates a file's bytes before they are written, so
//    that a full disk is one error naming the file and the bytes needed and
//    free, not a SIGBUS in a store to a mapping.
// Errors throw coli::Error naming the path. Destroying an output that was
// not published removes what it wrote.
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "util/temp_cleanup.h"

namespace coli {

// "a regular file", "a directory", "a character device", ... for st_mode.
std::string file_type_name(mode_t mode);

// Removes PATH.tmp.PID entries (files, or directories when dirs) next to
// path whose process PID no longer runs; says so on stderr. Returns how many.
int remove_stale_temps(const std::string& path, bool dirs);

// Allocates bytes [0, bytes) of fd (the file behind it is called name in
// errors): "NAME: No space left on device (need N bytes, M free)", or the
// file-size limit for EFBIG.
void reserve_space(int fd, const std::string& name, uint64_t bytes);

class OutputFile {
 public:
  // named forces PATH.tmp.PID even where O_TMPFILE works (tests use it).
  OutputFile(std::string path, bool overwrite, bool named = false);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  // The temporary's name, or "" while it is unnamed.
  const std::string& temp_path() const { return tmp_; }

  // fsyncs and links the file in; returns its size. The descriptor is
  // closed afterwards.
  uint64_t publish();

 private:
  void link_named(const std::string& to);
  std::string path_, tmp_;
  bool overwrite_;
  int fd_ = -1;
  TempCleanup cleanup_;
  bool published_ = false;
};

class OutputDir {
 public:
  OutputDir(std::string path, bool overwrite);
  ~OutputDir();
  OutputDir(const OutputDir&) = delete;
  OutputDir& operator=(const OutputDir&) = delete;

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_; }
  // The path of a file inside the temporary directory, registered for
  // removal on a signal; create it after this call.
  std::string file(const std::string& name);
  void publish();

 private:
  std::string path_, tmp_;
  bool overwrite_;
  TempCleanup dir_cleanup_;
  std::vector<TempCleanup> file_cleanup_;
  bool published_ = false;
};

}  // namespace coli
