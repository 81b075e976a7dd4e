// coli-convert's outputs under hostile conditions, through the binary: a
// full disk or a file-size limit, signals, --force over things that are not
// outputs, stale temporaries of killed runs, non-finite weights. Each test
// checks the exit status, the message and what is left on disk.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using coli::test::run_command;
using coli::test::TempDir;
using coli::test::spawn;

std::string cc() { return coli::test::bin_dir() + "/coli-convert"; }
std::string text_model() { return coli::test::data_dir() + "/tiny-qwen35moe-text"; }
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

using coli::test::listing;

// A copy of the tiny checkpoint with one bf16 value of `tensor` (row-major
// index `at`) set to `bits`.
void poisoned_copy(const std::string& dst, const std::string& tensor, int64_t at, uint16_t bits) {
  fs::create_directories(dst);
  for (const char* f : {"config.json", "generation_config.json"}) fs::copy_file(text_model() + "/" + f, dst + "/" + f);
  std::string st = coli::test::read_file(text_model() + "/model.safetensors");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(st[i])) << (8 * i);
  const auto h = nlohmann::json::parse(st.substr(8, n));
  const uint64_t off = 8 + n + h.at(tensor).at("data_offsets")[0].get<uint64_t>() + uint64_t(at) * 2;
  st[off] = static_cast<char>(bits & 0xff);
  st[off + 1] = static_cast<char>(bits >> 8);
  coli::test::write_file(dst + "/model.safetensors", st);
}

// Whether this machine lets an unprivileged user mount a tmpfs in a user
// namespace (unshare -rm), the one way to get a small filesystem without root.
bool small_tmpfs_available() {
  TempDir d;
  std::string out;
  return run_command("unshare -rm sh -c 'mount -t tmpfs -o size=200k coli " + d.path() + " && echo mounted' 2>/dev/null", &out) == 0 &&
         out == "mounted\n";
}

// A process id that no process has: a child that has exited and been reaped.
pid_t dead_pid() {
  const pid_t p = ::fork();
  if (p == 0) ::_exit(0);
  int st;
  ::waitpid(p, &st, 0);
  return p;
}

}  // namespace

// Item 1: the mapped output is reserved up front, so a full filesystem is a
// message and exit 1, not SIGBUS, and nothing is left on it.
TEST(ConvertHardening, DiskFullIsAnErrorAndLeavesNothing) {
  if (!small_tmpfs_available()) GTEST_SKIP() << "no unprivileged tmpfs (unshare -rm) here";
  TempDir d;
  std::string out;
  run_command("unshare -rm sh -c 'mount -t tmpfs -o size=200k coli " + d.path() + " && " + cc() + " " + text_model() + " -o " + d / "m.coli" +
                  "; echo rc=$?; ls -A " + d.path() + "' 2>&1",
              &out);
  EXPECT_TRUE(has(out, d / "m.coli: No space left on device (need ")) << out;
  EXPECT_TRUE(has(out, " bytes, 204800 free)")) << out;  // all of the 200 KiB tmpfs
  EXPECT_EQ(out.substr(out.find("rc=")), "rc=1\n") << out;  // and ls printed nothing
  // synth says why a write failed too, before writing gigabytes.
  run_command("unshare -rm sh -c 'mount -t tmpfs -o size=200k coli " + d.path() + " && " + cc() + " synth -o " + d / "ck" +
                  " --layers 1; echo rc=$?; ls -A " + d.path() + "' 2>&1",
              &out);
  EXPECT_TRUE(has(out, "model-00001-of-00001.safetensors: No space left on device (need ")) << out;
  EXPECT_EQ(out.substr(out.find("rc=")), "rc=1\n") << out;
}

// Item 1, with a file-size limit: EFBIG is reported (SIGXFSZ is ignored).
TEST(ConvertHardening, FileSizeLimitIsAnErrorNotASignal) {
  TempDir d;
  std::string out;
  EXPECT_EQ(run_command("sh -c 'ulimit -f 64; exec " + cc() + " " + text_model() + " -o " + d / "m.coli" + "' 2>&1", &out), 1) << out;
  EXPECT_TRUE(has(out, d / "m.coli: File too large (need ")) << out;
  EXPECT_TRUE(has(out, "the file size limit is ")) << out;
  EXPECT_EQ(listing(d.path()), "");
  EXPECT_EQ(run_command("sh -c 'ulimit -f 64; exec " + cc() + " synth -o " + d / "ck" + " --layers 1' 2>&1", &out), 1) << out;
  EXPECT_TRUE(has(out, "model-00001-of-00001.safetensors: File too large (need ")) << out;
  EXPECT_EQ(listing(d.path()), "");
}

// Item 2: SIGINT and SIGTERM remove synth's DIR.tmp.PID, and the process
// still dies of the signal.
TEST(ConvertHardening, SynthRemovesItsTemporaryOnSignal) {
  for (int sig : {SIGINT, SIGTERM}) {
    TempDir d;
    const pid_t pid = spawn({cc(), "synth", "-o", d / "ck", "--layers", "1", "-t", "1"});
    ASSERT_GT(pid, 0);
    const std::string shard = d / "ck.tmp." + std::to_string(pid) + "/model-00001-of-00001.safetensors";
    // Wait until the first shard exists (it is then being filled: seconds of
    // work at real shapes), or the process has ended.
    int st = 0;
    bool ended = false;
    for (int i = 0; i < 2000 && !fs::exists(shard); ++i) {
      if (::waitpid(pid, &st, WNOHANG) == pid) {
        ended = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (ended) GTEST_SKIP() << "synth ended before the signal (status " << st << "; not enough disk for a 1-layer checkpoint?)";
    ASSERT_TRUE(fs::exists(shard));
    ::kill(pid, sig);
    ASSERT_EQ(::waitpid(pid, &st, 0), pid);
    EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == sig) << "signal " << sig << ", status " << st;
    EXPECT_EQ(listing(d.path()), "") << "signal " << sig;
  }
}

// Item 2, kill -9: what a killed run left (the old PATH.tmp.PID names) is
// removed by the next run, with a message; a live process's temporary stays.
TEST(ConvertHardening, NextRunRemovesStaleTemporariesOfDeadRuns) {
  TempDir d;
  const pid_t dead = dead_pid();
  const std::string stale = d / "m.coli.tmp." + std::to_string(dead);
  const std::string live = d / "m.coli.tmp." + std::to_string(::getpid());
  coli::test::write_file(stale, std::string(4096, 'x'));
  coli::test::write_file(live, "mine");
  std::string out;
  ASSERT_EQ(run_command(cc() + " " + text_model() + " -o " + d / "m.coli --no-verify 2>&1 >/dev/null", &out), 0) << out;
  EXPECT_TRUE(has(out, "removed " + stale + ", left by process " + std::to_string(dead) + ", which is gone")) << out;
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_EQ(coli::test::read_file(live), "mine");
  EXPECT_EQ(listing(d.path()), "m.coli m.coli.tmp." + std::to_string(::getpid()));
}

// Item 3: two conversions to one path without --force: exactly one
// publishes, the other says the output exists; the file is whole.
TEST(ConvertHardening, TwoConversionsToOnePathOneWins) {
  TempDir d;
  const std::string cmd = cc() + " " + text_model() + " -o " + d / "m.coli -t 1 --no-verify";
  std::string out;
  ASSERT_EQ(run_command("(" + cmd + " >/dev/null 2>" + d / "a.err; echo $? >" + d / "a.rc) & (" + cmd + " >/dev/null 2>" + d / "b.err; echo $? >" +
                            d / "b.rc) & wait",
                        &out),
            0);
  const std::string ra = coli::test::read_file(d / "a.rc"), rb = coli::test::read_file(d / "b.rc");
  EXPECT_TRUE((ra == "0\n" && rb == "1\n") || (ra == "1\n" && rb == "0\n")) << ra << rb;
  const std::string loser = coli::test::read_file(ra == "1\n" ? d / "a.err" : d / "b.err");
  EXPECT_TRUE(has(loser, d / "m.coli exists")) << loser;
  EXPECT_EQ(run_command(cc() + " verify " + d / "m.coli 2>&1", &out), 0) << out;
  EXPECT_EQ(listing(d.path()), "a.err a.rc b.err b.rc m.coli");
}

// Item 4: --force replaces a regular file only: a FIFO, a symbolic link and
// a directory that is not a checkpoint are refused, named, and left alone.
TEST(ConvertHardening, ForceReplacesOnlyARegularFile) {
  TempDir d;
  std::string out;
  ASSERT_EQ(::mkfifo((d / "fifo").c_str(), 0644), 0);
  EXPECT_EQ(run_command(cc() + " " + text_model() + " -o " + d / "fifo --force 2>&1", &out), 1) << out;
  EXPECT_TRUE(has(out, d / "fifo is a FIFO, not a regular file; refusing to replace it")) << out;
  EXPECT_TRUE(fs::is_fifo(fs::symlink_status(d / "fifo")));

  coli::test::write_file(d / "target", "keep");
  fs::create_symlink(d / "target", d / "link");
  EXPECT_EQ(run_command(cc() + " " + text_model() + " -o " + d / "link --force 2>&1", &out), 1) << out;
  EXPECT_TRUE(has(out, d / "link is a symbolic link, not a regular file")) << out;
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(d / "link")));
  EXPECT_EQ(coli::test::read_file(d / "target"), "keep");
  EXPECT_EQ(listing(d.path()), "fifo link target");

  // A regular file is replaced with --force, and only then.
  EXPECT_EQ(run_command(cc() + " " + text_model() + " -o " + d / "target --no-verify 2>&1", &out), 1) << out;
  EXPECT_EQ(coli::test::read_file(d / "target"), "keep");
  EXPECT_EQ(run_command(cc() + " " + text_model() + " -o " + d / "target --force 2>&1", &out), 0) << out;
  EXPECT_EQ(run_command(cc() + " verify " + d / "target 2>&1", &out), 0) << out;
  EXPECT_EQ(listing(d.path()), "fifo link target");
}

TEST(ConvertHardening, SynthForceReplacesOnlyACheckpoint) {
  TempDir d;
  std::string out;
  fs::create_directories(d / "notck");
  coli::test::write_file(d / "notck/precious", "data");
  EXPECT_EQ(run_command(cc() + " synth -o " + d / "notck --layers 1 --force 2>&1", &out), 1) << out;
  EXPECT_TRUE(has(out, d / "notck is a directory that holds no checkpoint")) << out;
  EXPECT_EQ(coli::test::read_file(d / "notck/precious"), "data");
  ASSERT_EQ(::mkfifo((d / "fifo").c_str(), 0644), 0);
  EXPECT_EQ(run_command(cc() + " synth -o " + d / "fifo --layers 1 --force 2>&1", &out), 1) << out;
  EXPECT_TRUE(has(out, d / "fifo is a FIFO, not a checkpoint directory")) << out;
  EXPECT_TRUE(fs::is_fifo(fs::symlink_status(d / "fifo")));
  EXPECT_EQ(listing(d.path()), "fifo notck");
}

// Item 4 with a device: refused before anything is written (the test only
// ever asks for a refusal; nothing is written to the device).
TEST(ConvertHardening, ForceRefusesACharacterDevice) {
  std::string out;
  struct stat before;
  ASSERT_EQ(::lstat("/dev/null", &before), 0);
  ASSERT_TRUE(S_ISCHR(before.st_mode));
  EXPECT_EQ(run_command(cc() + " " + text_model() + " -o /dev/null --force 2>&1", &out), 1) << out;
  EXPECT_TRUE(has(out, "/dev/null is a character device, not a regular file; refusing to replace it")) << out;
  struct stat after;
  ASSERT_EQ(::lstat("/dev/null", &after), 0);
  EXPECT_TRUE(S_ISCHR(after.st_mode));
  EXPECT_EQ(after.st_ino, before.st_ino);
}

// Item 6: a NaN or Inf weight is an error naming the tensor and the place;
// nothing is written.
TEST(ConvertHardening, NonFiniteWeightIsAnError) {
  TempDir d;
  std::string out;
  fs::create_directories(d / "out");
  poisoned_copy(d / "nan", "lm_head.weight", 3 * 64 + 5, 0x7fc0);
  EXPECT_EQ(run_command(cc() + " " + d / "nan" + " -o " + d / "out/m.coli 2>&1", &out), 1) << out;
  EXPECT_TRUE(has(out, "tensor lm_head.weight: non-finite value nan at row 3, column 5")) << out;
  EXPECT_EQ(listing(d / "out"), "");
  poisoned_copy(d / "inf", "model.layers.2.mlp.experts.0.gate_proj.weight", 64 + 1, 0xff80);
  EXPECT_EQ(run_command(cc() + " " + d / "inf" + " -o " + d / "out/m.coli 2>&1", &out), 1) << out;
  EXPECT_TRUE(has(out, "tensor model.layers.2.mlp.experts.0.gate_proj.weight: non-finite value -inf at row 1, column 1")) << out;
  EXPECT_EQ(listing(d / "out"), "");
}
