// Helpers shared by the test suites: where the data is, scratch folders,
// and a safetensors writer for building good and bad checkpoints.
#pragma once
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <functional>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "util/error.h"

extern char** environ;

namespace coli::test {

inline std::string data_dir() {
  const char* d = std::getenv("COLI_TEST_DATA");
  return d ? d : "tests/data";
}
inline std::string bin_dir() {
  const char* d = std::getenv("COLI_BIN_DIR");
  return d ? d : "build/bin";
}

// A fresh, empty scratch folder removed at destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "coli-test-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& f) const { return path_ + "/" + f; }

 private:
  std::string path_;
};

struct RawTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

inline std::string safetensors_bytes(const std::vector<RawTensor>& ts) {
  nlohmann::json h = nlohmann::json::object();
  uint64_t off = 0;
  std::string data;
  for (const auto& t : ts) {
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
    data += t.bytes;
  }
  std::string hs = h.dump();
  while (hs.size() % 8) hs += ' ';
  std::string out(8, '\0');
  uint64_t n = hs.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + hs + data;
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

template <class T>
std::string pod_bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// Runs a shell command; returns its exit status and captures stdout.
inline int run_command(const std::string& cmd, std::string* out) {
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  std::size_t n;
  if (out) out->clear();
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0)
    if (out) out->append(buf, n);
  const int st = ::pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// Starts argv (argv[0] a path) with SIGINT and SIGTERM at their default
// actions (a shell would start a background job with SIGINT ignored),
// stdout to out_file (created or truncated) and stderr to /dev/null.
// Returns the pid, or -1.
inline pid_t spawn(const std::vector<std::string>& args, const std::string& out_file = "/dev/null") {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t def, none;
  sigemptyset(&def);
  sigaddset(&def, SIGINT);
  sigaddset(&def, SIGTERM);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr, &def);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &fa, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  return rc == 0 ? pid : -1;
}

// The names in a directory, sorted, joined by spaces ("" when empty).
inline std::string listing(const std::string& dir) {
  std::vector<std::string> v;
  for (const auto& e : std::filesystem::directory_iterator(dir)) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  std::string s;
  for (const auto& n : v) s += (s.empty() ? "" : " ") + n;
  return s;
}

// What fn throws as a coli::Error ("(no error)" when it returns).
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const coli::Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace coli::test
