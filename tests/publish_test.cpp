// Publishing outputs (util/publish.h) through ContainerWriter and
// write_synthetic_checkpoint: what a killed writer leaves, an output that
// appears while a run writes, --force, stale temporaries, reported sizes.
// Kills happen in forked children stopped at a known point, so every test is
// deterministic.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "convert/synth.h"
#include "formats/container_writer.h"
#include "test_util.h"
#include "util/error.h"
#include "util/publish.h"

namespace {

namespace fs = std::filesystem;
using coli::test::TempDir;

using coli::test::listing;

using coli::test::error_of;

// A forked child that sets up a container writer with its data section
// mapped (as a conversion does before filling it), reports its pid through
// a pipe, then waits to be killed. Returns the child's pid once it is there.
pid_t writer_child(const std::string& out, bool named_temp) {
  int p[2];
  if (::pipe(p) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    try {
      coli::ContainerWriter w(out, false, named_temp);
      w.add_file("blob", std::string(100000, 'x'));
      w.allocate();
      if (::write(p[1], "r", 1) != 1) ::_exit(3);
      for (;;) ::pause();
    } catch (...) {
      ::_exit(4);
    }
  }
  ::close(p[1]);
  char c = 0;
  const bool ready = ::read(p[0], &c, 1) == 1;
  ::close(p[0]);
  return ready ? pid : -1;
}

int kill_and_wait(pid_t pid, int sig) {
  ::kill(pid, sig);
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFSIGNALED(st) ? WTERMSIG(st) : -1;
}

coli::SynthOptions tiny_synth() {
  coli::SynthOptions o;
  o.layers = 1;
  o.vocab = 64, o.hidden = 32, o.experts = 4, o.top_k = 2, o.moe_inter = 16, o.shared_inter = 16;
  o.heads = 2, o.kv_heads = 1, o.head_dim = 16, o.lin_k_heads = 2, o.lin_v_heads = 2, o.lin_k_dim = 8, o.lin_v_dim = 8;
  o.threads = 1;
  return o;
}

}  // namespace

// Item 2: a conversion killed while writing leaves nothing, kill -9 included
// (the output is an unnamed file until published).
TEST(Publish, KilledWriterLeavesNothing) {
  for (int sig : {SIGKILL, SIGTERM, SIGINT}) {
    TempDir d;
    const pid_t pid = writer_child(d / "m.coli", false);
    ASSERT_GT(pid, 0);
    EXPECT_EQ(listing(d.path()), "") << "signal " << sig;  // nothing visible while it writes
    EXPECT_EQ(kill_and_wait(pid, sig), sig);
    EXPECT_EQ(listing(d.path()), "") << "signal " << sig;
  }
}

// Item 2, where there is no O_TMPFILE: the named temporary is removed on
// SIGTERM/SIGINT; after kill -9 the next writer removes it and says so.
TEST(Publish, NamedTemporaryRemovedOnSignalOrByTheNextRun) {
  for (int sig : {SIGTERM, SIGINT}) {
    TempDir d;
    const pid_t pid = writer_child(d / "m.coli", true);
    ASSERT_GT(pid, 0);
    EXPECT_EQ(listing(d.path()), "m.coli.tmp." + std::to_string(pid));
    EXPECT_EQ(kill_and_wait(pid, sig), sig);
    EXPECT_EQ(listing(d.path()), "") << "signal " << sig;
  }
  TempDir d;
  const pid_t pid = writer_child(d / "m.coli", true);
  ASSERT_GT(pid, 0);
  EXPECT_EQ(kill_and_wait(pid, SIGKILL), SIGKILL);
  EXPECT_EQ(listing(d.path()), "m.coli.tmp." + std::to_string(pid));
  testing::internal::CaptureStderr();
  coli::ContainerWriter w(d / "m.coli", false, true);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("removed " + d / "m.coli.tmp." + std::to_string(pid) + ", left by process " + std::to_string(pid) + ", which is gone"),
            std::string::npos)
      << err;
  EXPECT_EQ(listing(d.path()), "m.coli.tmp." + std::to_string(::getpid()));
}

// Item 3: an output that appears while a run writes is not replaced; the
// run fails with "exists" and leaves nothing of its own.
TEST(Publish, OutputThatAppearedMeanwhileIsNotReplaced) {
  for (bool named : {false, true}) {
    TempDir d;
    {
      coli::ContainerWriter w(d / "m.coli", false, named);
      w.add_file("blob", "abc");
      w.allocate();
      coli::test::write_file(d / "m.coli", "another run's output");
      EXPECT_NE(error_of([&] { w.finish(1, nlohmann::json::object(), nlohmann::json::object(), 1); }).find(d / "m.coli exists"), std::string::npos);
    }
    EXPECT_EQ(coli::test::read_file(d / "m.coli"), "another run's output");
    EXPECT_EQ(listing(d.path()), "m.coli") << "named " << named;
  }
}

// Item 3: finish() reports the size of the file this run wrote; --force
// replaces a regular file that appeared meanwhile.
TEST(Publish, FinishReportsTheBytesItWrote) {
  for (bool named : {false, true}) {
    TempDir d;
    coli::ContainerWriter w(d / "m.coli", true, named);
    w.add_file("blob", std::string(5000, 'b'));
    w.allocate();
    coli::test::write_file(d / "m.coli", "old");
    const uint64_t bytes = w.finish(1, nlohmann::json::object(), nlohmann::json::object(), 1);
    EXPECT_EQ(bytes, fs::file_size(d / "m.coli"));
    EXPECT_GT(bytes, 5000u);
    EXPECT_NO_THROW(coli::Container(d / "m.coli", 1).verify_checksums());
    EXPECT_EQ(listing(d.path()), "m.coli");
  }
}

// Item 4 at the library level: the writer refuses a non-regular output up
// front, before any work.
TEST(Publish, WriterRefusesWhatIsNotARegularFile) {
  TempDir d;
  fs::create_directories(d / "dir.coli");
  ASSERT_EQ(::mkfifo((d / "fifo").c_str(), 0644), 0);
  EXPECT_NE(error_of([&] { coli::ContainerWriter w(d / "dir.coli", true); }).find(d / "dir.coli is a directory, not a regular file"), std::string::npos);
  EXPECT_NE(error_of([&] { coli::ContainerWriter w(d / "fifo", true); }).find(d / "fifo is a FIFO, not a regular file"), std::string::npos);
  EXPECT_EQ(listing(d.path()), "dir.coli fifo");
}

// Synth: DIR.tmp.PID of a dead run is removed; --force replaces a
// checkpoint with an identical fresh one; a directory that appears while it
// writes is not replaced.
TEST(Publish, SynthDirectoryOutput) {
  TempDir d;
  const pid_t dead = [] {
    const pid_t p = ::fork();
    if (p == 0) ::_exit(0);
    int st;
    ::waitpid(p, &st, 0);
    return p;
  }();
  const std::string stale = d / "ck.tmp." + std::to_string(dead);
  fs::create_directories(stale);
  coli::test::write_file(stale + "/model-00001-of-00001.safetensors", "partial");
  auto o = tiny_synth();
  testing::internal::CaptureStderr();
  coli::write_synthetic_checkpoint(d / "ck", o);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("removed " + stale + ", left by process"), std::string::npos) << err;
  EXPECT_EQ(listing(d.path()), "ck");
  const std::string first = coli::test::read_file(d / "ck/model-00001-of-00001.safetensors");
  EXPECT_NE(error_of([&] { coli::write_synthetic_checkpoint(d / "ck", o); }).find(d / "ck exists and is not empty; use --force"), std::string::npos);
  o.overwrite = true;
  coli::write_synthetic_checkpoint(d / "ck", o);
  EXPECT_EQ(coli::test::read_file(d / "ck/model-00001-of-00001.safetensors"), first);
  EXPECT_EQ(listing(d.path()), "ck");
  EXPECT_EQ(listing(d / "ck"), "config.json generation_config.json model-00001-of-00001.safetensors model.safetensors.index.json");
  {
    coli::OutputDir od(d / "new", false);
    coli::test::write_file(od.file("config.json"), "{}");
    fs::create_directories(d / "new");
    coli::test::write_file(d / "new/theirs", "x");
    EXPECT_NE(error_of([&] { od.publish(); }).find(d / "new exists"), std::string::npos);
  }
  EXPECT_EQ(listing(d / "new"), "theirs");
  EXPECT_EQ(listing(d.path()), "ck new");
}
