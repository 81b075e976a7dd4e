// coli-pin through the binary: start (detached and in the foreground),
// status, stop, a keeper killed with -9, and usage. Every test pins its own
// container, made from the tiny checkpoint with a config key naming the
// process and test, so its segment (named by the container's fingerprint)
// is its alone even while other suites or copies of this one run; a guard
// stops the keeper and removes the segment whatever the test's outcome.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "convert/convert.h"
#include "cpu_expert_host.h"
#include "cuda_backend.h"
#include "cuda_device.h"
#include "engine/engine.h"
#include "formats/container.h"
#include "mirror/mirror.h"
#include "mirror/mirror_load.h"
#include "model/weights.h"
#include "placement/heat.h"
#include "engine_util.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using coli::test::run_command;
using coli::test::TempDir;
using coli::test::spawn;

std::string pin() { return coli::test::bin_dir() + "/coli-pin"; }
std::string text_model() { return coli::test::data_dir() + "/tiny-qwen35moe-text"; }
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
std::string shm(const std::string& name) { return "/dev/shm/" + name; }

// coli-pin ARGS with stdout and stderr together; returns the exit status.
int run_pin(const std::string& args, std::string* out) { return run_command(pin() + " " + args + " 2>&1", out); }

// The tiny model as a container of this test's own.
struct PinModel {
  TempDir dir;
  std::string path, name;
  uint64_t fingerprint = 0;
  explicit PinModel(const std::string& tag) {
    const std::string ck = dir / "ck";
    fs::create_directories(ck);
    for (const auto& e : fs::directory_iterator(text_model())) fs::copy_file(e.path(), ck + "/" + e.path().filename().string());
    auto config = nlohmann::json::parse(coli::test::read_file(ck + "/config.json"));
    config["coli_test_tag"] = tag + "-" + std::to_string(::getpid());
    coli::test::write_file(ck + "/config.json", config.dump(2));
    coli::ConvertOptions o;
    o.threads = 2;
    path = dir / "m.coli";
    fingerprint = coli::convert_checkpoint(ck, path, o).fingerprint;
    name = coli::mirror_name(fingerprint);
  }
  std::size_t blobs(const char* kind) const {
    coli::Container c(path);
    std::size_t n = 0;
    for (const auto& b : c.manifest().blobs) n += b.kind == kind;
    return n;
  }
};

// Whether pid is gone: no such process, or a zombie nobody has reaped yet.
bool process_gone(int pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  const std::string stat = coli::test::read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z';
}

// Stops what a test started, pass or fail: SIGTERM to a live keeper (a
// coli-pin that maps the segment), then the segment itself.
struct Cleanup {
  std::string name;
  ~Cleanup() {
    const coli::MirrorStatus s = coli::mirror_status(name);
    if (s.owner_alive && s.owner_pid > 0 && has(coli::test::read_file("/proc/" + std::to_string(s.owner_pid) + "/cmdline"), "coli-pin")) {
      ::kill(s.owner_pid, SIGTERM);
      for (int i = 0; i < 500 && !coli::mirror_status(name).state.empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    coli::remove_mirror(name);
  }
};

// status --json's entry for name (null when it is not listed).
nlohmann::json status_of(const std::string& name) {
  std::string out;
  EXPECT_EQ(run_command(pin() + " status --json 2>/dev/null", &out), 0);
  for (const auto& e : nlohmann::json::parse(out))
    if (e["name"] == name) return e;
  return nullptr;
}

// The pid at the end of start's line ("... pid N").
int pid_of(const std::string& line) {
  const auto at = line.rfind("pid ");
  return at == std::string::npos ? -1 : std::atoi(line.c_str() + at + 4);
}

// `coli-pin start --foreground` as a child of this process, once its
// segment is ready; -1 if it ended or took over a minute.
pid_t start_foreground(const PinModel& m, const std::string& out_file) {
  const pid_t pid = spawn({pin(), "start", "--model", m.path, "--foreground"}, out_file);
  if (pid <= 0) return -1;
  for (int i = 0; i < 6000; ++i) {
    const coli::MirrorStatus s = coli::mirror_status(m.name);
    if (s.state == "ready" && s.owner_pid == pid) return pid;
    int st;
    if (::waitpid(pid, &st, WNOHANG) == pid) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  return -1;
}

// Whether RLIMIT_MEMLOCK lets a keeper lock a mirror of the container
// (every mirror of the tiny model is smaller than its file and 1 MiB).
bool can_lock(const PinModel& m) {
  rlimit rl{};
  return ::getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= fs::file_size(m.path) + (1u << 20));
}

#define SKIP_UNLESS_LOCKABLE(m) \
  if (!can_lock(m)) GTEST_SKIP() << "RLIMIT_MEMLOCK (ulimit -l) is too low to lock a " << fs::file_size((m).path) << "-byte model"

}  // namespace

TEST(PinTool, StartStatusStartAgainStop) {
  PinModel m("start");
  SKIP_UNLESS_LOCKABLE(m);
  Cleanup guard{m.name};
  std::string out;
  ASSERT_EQ(run_command(pin() + " start --model " + m.path + " 2>/dev/null", &out), 0) << out;
  EXPECT_TRUE(has(out, m.name + " ready: ")) << out;
  EXPECT_TRUE(has(out, std::to_string(m.blobs("expert")) + " expert blobs, 0 trunk blobs, pid ")) << out;
  const int pid = pid_of(out);
  ASSERT_GT(pid, 0) << out;
  EXPECT_TRUE(fs::exists(shm(m.name)));

  const auto e = status_of(m.name);
  ASSERT_FALSE(e.is_null());
  EXPECT_EQ(e["state"], "ready");
  EXPECT_EQ(e["owner_pid"], pid);
  EXPECT_EQ(e["owner_alive"], true);
  EXPECT_EQ(e["mode"], "0600");
  EXPECT_EQ(e["model"], m.path);
  EXPECT_EQ(e["fingerprint"], coli::hex64(m.fingerprint));
  EXPECT_EQ(e["expert_blobs"], m.blobs("expert"));
  EXPECT_EQ(e["trunk_blobs"], 0);
  EXPECT_EQ(e["runs"], 0);
  EXPECT_EQ(e["bytes"], fs::file_size(shm(m.name)));

  ASSERT_EQ(run_command(pin() + " status", &out), 0);
  EXPECT_TRUE(has(out, "NAME ")) << out;
  EXPECT_TRUE(has(out, m.name + "  ready  ")) << out;
  EXPECT_TRUE(has(out, std::to_string(pid) + " alive")) << out;

  // Again: the keeper is left alone.
  ASSERT_EQ(run_command(pin() + " start --model " + m.path + " 2>/dev/null", &out), 0) << out;
  EXPECT_TRUE(has(out, m.name + " already running: ")) << out;
  EXPECT_EQ(pid_of(out), pid) << out;
  EXPECT_EQ(status_of(m.name)["owner_pid"], pid);

  ASSERT_EQ(run_pin("stop --model " + m.path, &out), 0) << out;
  EXPECT_TRUE(has(out, "stopped " + m.name)) << out;
  EXPECT_TRUE(status_of(m.name).is_null());
  EXPECT_FALSE(fs::exists(shm(m.name)));
  for (int i = 0; i < 500 && !process_gone(pid); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(process_gone(pid));
}

TEST(PinTool, GroupModeTrunkAndStopByName) {
  PinModel m("group");
  SKIP_UNLESS_LOCKABLE(m);
  Cleanup guard{m.name};
  std::string out;
  ASSERT_EQ(run_command(pin() + " start --model " + m.path + " --group --trunk 2>/dev/null", &out), 0) << out;
  const auto e = status_of(m.name);
  ASSERT_FALSE(e.is_null());
  EXPECT_EQ(e["mode"], "0660");
  EXPECT_EQ(e["trunk_blobs"], m.blobs("tensor"));
  EXPECT_EQ(e["expert_blobs"], m.blobs("expert"));
  ASSERT_EQ(run_pin("stop " + m.name, &out), 0) << out;
  EXPECT_FALSE(fs::exists(shm(m.name)));
}

// --budget holds the hottest experts by --heat; with --heat none the first
// in container order.
TEST(PinTool, BudgetHoldsTheHottestExperts) {
  PinModel m("budget");
  SKIP_UNLESS_LOCKABLE(m);
  Cleanup guard{m.name};
  auto c = std::make_shared<coli::Container>(m.path);
  int layers = 0, experts = 0;
  uint32_t hot = 0, first = UINT32_MAX;
  for (uint32_t i = 0; i < c->manifest().blobs.size(); ++i) {
    const auto& b = c->manifest().blobs[i];
    if (b.kind != "expert") continue;
    layers = std::max(layers, b.layer + 1), experts = std::max(experts, b.expert + 1);
    if (b.layer == 1 && b.expert == 5) hot = i;
    if (first == UINT32_MAX) first = i;
  }
  ASSERT_GT(layers, 1);
  ASSERT_GT(experts, 5);
  coli::Heat h(layers, experts);
  std::vector<uint64_t> counts(std::size_t(layers) * experts, 0);
  counts[std::size_t(1) * experts + 5] = 7;
  h.add_counts(counts);
  h.add_tokens(7);
  coli::save_heat(m.dir / "heat.txt", h, m.fingerprint);
  const uint64_t one = (c->manifest().blobs[hot].bytes + 4095) / 4096 * 4096;  // one expert, 4 KiB aligned

  std::string out;
  for (const std::string& heat : {m.dir / "heat.txt", std::string("none")}) {
    ASSERT_EQ(run_pin("start --model " + m.path + " --budget " + std::to_string(one) + " --heat " + heat, &out), 0) << out;
    const auto e = status_of(m.name);
    ASSERT_FALSE(e.is_null());
    EXPECT_EQ(e["expert_blobs"], 1) << heat;
    {
      coli::MirrorAttachment a(m.name, *c);
      EXPECT_NE(a.blob(heat == "none" ? first : hot), nullptr) << heat;
      EXPECT_EQ(a.blob(heat == "none" ? hot : first), nullptr) << heat;
    }
    ASSERT_EQ(run_pin("stop --model " + m.path, &out), 0) << out;
  }
  // A heat file of another model is refused before anything is made.
  coli::save_heat(m.dir / "other.txt", h, m.fingerprint + 1);
  EXPECT_EQ(run_pin("start --model " + m.path + " --budget 1M --heat " + m.dir / "other.txt", &out), 1) << out;
  EXPECT_TRUE(has(out, "other.txt")) << out;
  EXPECT_EQ(run_pin("start --model " + m.path + " --heat " + m.dir / "missing.txt", &out), 1) << out;
  EXPECT_TRUE(has(out, "missing.txt")) << out;
  EXPECT_EQ(run_pin("start --model " + m.path + " --budget 1", &out), 1) << out;  // less than any expert
  EXPECT_TRUE(has(out, "holds no expert")) << out;
  EXPECT_FALSE(fs::exists(shm(m.name)));
}

TEST(PinTool, ForegroundStopsOnSigterm) {
  PinModel m("foreground");
  SKIP_UNLESS_LOCKABLE(m);
  Cleanup guard{m.name};
  const pid_t pid = start_foreground(m, m.dir / "out.txt");
  ASSERT_GT(pid, 0);
  EXPECT_EQ(status_of(m.name)["owner_alive"], true);
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  EXPECT_FALSE(fs::exists(shm(m.name)));
  EXPECT_TRUE(status_of(m.name).is_null());
  const std::string out = coli::test::read_file(m.dir / "out.txt");
  EXPECT_TRUE(has(out, m.name + " ready: ")) << out;
  EXPECT_EQ(pid_of(out), pid) << out;
}

// A stop signal at any point of a start leaves either a ready keeper (it
// came after the start was done) or nothing: in the foreground the keeper
// abandons the load and removes the segment; detached, the parent passes
// the signal on and exits 1.
TEST(PinTool, InterruptedStartLeavesNoSegment) {
  PinModel m("interrupt");
  SKIP_UNLESS_LOCKABLE(m);
  Cleanup guard{m.name};
  for (const bool foreground : {true, false})
    for (int delay_us : {0, 200, 1000, 3000, 10000, 30000}) {
      const std::string what = std::string(foreground ? "foreground" : "detached") + ", signal after " + std::to_string(delay_us) + " us";
      std::vector<std::string> args = {pin(), "start", "--model", m.path};
      if (foreground) args.push_back("--foreground");
      const pid_t pid = spawn(args, m.dir / "out.txt");
      ASSERT_GT(pid, 0);
      std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
      ::kill(pid, foreground ? SIGTERM : SIGINT);
      int st = 0;
      ASSERT_EQ(::waitpid(pid, &st, 0), pid);
      const coli::MirrorStatus s = coli::mirror_status(m.name);
      if (!foreground && WIFEXITED(st) && WEXITSTATUS(st) == 0) {
        // Done before the signal: the keeper runs; stop it.
        EXPECT_EQ(s.state, "ready") << what;
        std::string out;
        EXPECT_EQ(run_pin("stop " + m.name, &out), 0) << what << ": " << out;
        continue;
      }
      EXPECT_TRUE(WIFSIGNALED(st) || (WIFEXITED(st) && WEXITSTATUS(st) == (foreground ? 0 : 1))) << what << ": status " << st;
      EXPECT_EQ(s.state, "") << what;
      EXPECT_FALSE(fs::exists(shm(m.name))) << what;
    }
}

// kill -9 leaves the segment with a dead owner: status says stale, and
// start replaces it.
TEST(PinTool, StaleSegmentIsShownAndStartRecovers) {
  PinModel m("stale");
  SKIP_UNLESS_LOCKABLE(m);
  Cleanup guard{m.name};
  const pid_t pid = start_foreground(m, m.dir / "out.txt");
  ASSERT_GT(pid, 0);
  ::kill(pid, SIGKILL);
  ASSERT_EQ(::waitpid(pid, nullptr, 0), pid);
  EXPECT_TRUE(fs::exists(shm(m.name)));
  const auto e = status_of(m.name);
  ASSERT_FALSE(e.is_null());
  EXPECT_EQ(e["state"], "stale");
  EXPECT_EQ(e["owner_pid"], pid);
  EXPECT_EQ(e["owner_alive"], false);
  std::string out;
  ASSERT_EQ(run_command(pin() + " status", &out), 0);
  EXPECT_TRUE(has(out, m.name + "  stale  ")) << out;
  EXPECT_TRUE(has(out, std::to_string(pid) + " gone")) << out;

  ASSERT_EQ(run_pin("start --model " + m.path, &out), 0) << out;
  EXPECT_TRUE(has(out, "replacing it (stale")) << out;
  const int keeper = pid_of(out);
  const auto r = status_of(m.name);
  ASSERT_FALSE(r.is_null());
  EXPECT_EQ(r["state"], "ready");
  EXPECT_EQ(r["owner_pid"], keeper);
  EXPECT_EQ(r["owner_alive"], true);
  ASSERT_EQ(run_pin("stop --model " + m.path, &out), 0) << out;
  EXPECT_FALSE(fs::exists(shm(m.name)));
}

TEST(PinTool, StopRemovesAStaleSegment) {
  PinModel m("stalestop");
  SKIP_UNLESS_LOCKABLE(m);
  Cleanup guard{m.name};
  const pid_t pid = start_foreground(m, m.dir / "out.txt");
  ASSERT_GT(pid, 0);
  ::kill(pid, SIGKILL);
  ASSERT_EQ(::waitpid(pid, nullptr, 0), pid);
  std::string out;
  ASSERT_EQ(run_pin("stop --model " + m.path, &out), 0) << out;
  EXPECT_TRUE(has(out, "removed " + m.name + " (stale")) << out;
  EXPECT_FALSE(fs::exists(shm(m.name)));
}

// A segment that is not a mirror is listed as invalid, with the reason,
// and stop removes it.
TEST(PinTool, InvalidSegmentIsShownAndStopRemovesIt) {
  const std::string name = "coli-pin-test-invalid-" + std::to_string(::getpid());
  Cleanup guard{name};
  coli::test::write_file(shm(name), std::string(8192, 'x'));
  const auto e = status_of(name);
  ASSERT_FALSE(e.is_null());
  EXPECT_EQ(e["state"], "invalid");
  EXPECT_TRUE(has(e["error"].get<std::string>(), "bad magic")) << e;
  std::string out;
  ASSERT_EQ(run_command(pin() + " status", &out), 0);
  EXPECT_TRUE(has(out, name + "  invalid  ")) << out;
  ASSERT_EQ(run_pin("stop " + name, &out), 0) << out;
  EXPECT_TRUE(has(out, "removed " + name)) << out;
  EXPECT_FALSE(fs::exists(shm(name)));
}

TEST(PinTool, StopOfAnAbsentMirrorExits1) {
  PinModel m("absent");
  std::string out;
  ASSERT_TRUE(coli::mirror_status(m.name).state.empty());
  EXPECT_EQ(run_pin("stop --model " + m.path, &out), 1) << out;
  EXPECT_TRUE(has(out, "no mirror " + m.name + " of " + m.path)) << out;
  EXPECT_EQ(run_pin("stop " + m.name, &out), 1) << out;
  EXPECT_TRUE(has(out, "no mirror " + m.name)) << out;
}

// Too low a lock limit is the library's message, exit 1, and no segment.
// Root locks past the limit (CAP_IPC_LOCK): it runs without that capability.
TEST(PinTool, LowMemlockLimitIsAnError) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers' runtime makes mlock a no-op that always succeeds";
#endif
  PinModel m("memlock");
  Cleanup guard{m.name};
  std::string out;
  std::string drop;
  if (::geteuid() == 0) {
    if (run_command("setpriv --bounding-set -ipc_lock true 2>&1", &out) != 0) GTEST_SKIP() << "root without setpriv to drop CAP_IPC_LOCK: " << out;
    drop = "setpriv --bounding-set -ipc_lock ";
  }
  for (const char* mode : {"", " --foreground"}) {
    EXPECT_EQ(run_command(drop + "sh -c 'ulimit -l 4 && exec " + pin() + " start --model " + m.path + mode + "' 2>&1", &out), 1) << out;
    EXPECT_TRUE(has(out, "RLIMIT_MEMLOCK")) << out;
    EXPECT_FALSE(fs::exists(shm(m.name))) << mode;
  }
}

TEST(PinTool, NotAContainerIsAnError) {
  TempDir d;
  coli::test::write_file(d / "text.coli", "not a container");
  std::string out;
  EXPECT_EQ(run_pin("start --model " + text_model(), &out), 1) << out;
  EXPECT_TRUE(has(out, "not a coli container")) << out;
  EXPECT_EQ(run_pin("start --model " + d / "text.coli", &out), 1) << out;
  EXPECT_TRUE(has(out, d / "text.coli")) << out;
  EXPECT_EQ(run_pin("start --model " + d / "missing.coli", &out), 1) << out;
  EXPECT_TRUE(has(out, d / "missing.coli")) << out;
  EXPECT_EQ(run_pin("stop --model " + d / "text.coli", &out), 1) << out;
}

TEST(PinTool, UsageErrorsExit2AndHelpExits0) {
  std::string out;
  for (const char* args : {"", "frobnicate", "start", "start --model x --budget lots", "start --model x --budget 0", "start --model x --heat ''",
                           "start --model x --bogus", "status --bogus", "status extra", "stop", "stop a b"}) {
    EXPECT_EQ(run_pin(args, &out), 2) << args << ": " << out;
    EXPECT_TRUE(has(out, "(see --help)")) << args << ": " << out;
  }
  for (const char* args : {"--help", "-h", "start --help", "status --help", "stop --help"}) {
    EXPECT_EQ(run_pin(args, &out), 0) << args;
    EXPECT_TRUE(has(out, "usage: coli-pin start")) << args << ": " << out;
  }
}

// Two runs attached at once; kill -9 of one leaves the keeper and the
// other run unaffected (it finishes with exit 0 and the same tokens as
// without the mirror), and status stops counting the dead run.
TEST(PinTool, AKilledRunLeavesTheKeeperAndTheOtherRun) {
  PinModel m("killrun");
  SKIP_UNLESS_LOCKABLE(m);
  Cleanup guard{m.name};
  std::string out;
  ASSERT_EQ(run_pin("start --model " + m.path + " --heat none", &out), 0) << out;
  TempDir d;
  const std::string run = coli::test::bin_dir() + "/coli-run";
  // The scalar reference backend: a few seconds for 4000 tokens, long
  // enough to be seen attached.
  auto args = [&](int n) { return std::vector<std::string>{run, "-m", m.path, "--reference", "--heat", "none", "--prompt-ids", "1,2", "-n", std::to_string(n), "--ignore-eos", "--temp", "0"}; };
  const pid_t a = spawn(args(4000), d / "a.txt"), b = spawn(args(4000), d / "b.txt");
  ASSERT_GT(a, 0);
  ASSERT_GT(b, 0);
  int runs = 0;
  for (int i = 0; i < 1000 && runs < 2; ++i) {
    runs = coli::mirror_status(m.name).runs;
    if (runs < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(runs, 2) << "both runs attached";
  ::kill(a, SIGKILL);
  ::waitpid(a, nullptr, 0);
  EXPECT_FALSE(process_gone(b)) << "the other run goes on";
  const coli::MirrorStatus s = coli::mirror_status(m.name);
  EXPECT_EQ(s.state, "ready");
  EXPECT_TRUE(s.owner_alive);
  EXPECT_LE(s.runs, 1) << "the killed run is not counted";
  int st = 0;
  ASSERT_EQ(::waitpid(b, &st, 0), b);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st;
  std::string off;
  ASSERT_EQ(run_command(run + " -m " + m.path + " --reference --heat none --prompt-ids 1,2 -n 4000 --ignore-eos --temp 0 --mirror off 2>/dev/null", &off), 0);
  EXPECT_EQ(coli::test::read_file(d / "b.txt"), off) << "the same tokens as without the mirror";
  EXPECT_EQ(coli::mirror_status(m.name).runs, 0);
}

// coli-pin start --gpu: the keeper copies the blobs to GPU 0; a run maps
// the copy (CUDA IPC) and reads the weights there in place. The logits are
// bit for bit those of a run that uploads from the container (the same
// bytes, the same kernels): whole, with every expert in tier slots filled
// from the twin, and with half of them (the CPU computing the others in
// both runs).
TEST(PinTool, GpuTwinIsReadInPlace) {
  std::string why;
  if (coli::cuda::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  PinModel m("gputwin");
  SKIP_UNLESS_LOCKABLE(m);
  Cleanup guard{m.name};
  std::string out;
  ASSERT_EQ(run_pin("start --model " + m.path + " --trunk --gpu --heat none", &out), 0) << out;
  EXPECT_TRUE(has(out, "device twin on GPU 0")) << out;
  coli::LoadedModel lm = coli::load_model(m.path, "auto");
  ASSERT_NE(lm.mirror, nullptr) << lm.note;
  const coli::Model& model = *lm.model;
  const coli::ModelSpec& s = model.spec();
  auto plain = coli::Model::load(m.path);
  const long long all = static_cast<long long>(s.num_layers) * s.num_experts;
  uint64_t expert_bytes = 0;
  for (int l = 0; l < s.num_layers; ++l)
    for (const coli::ExpertWeights& x : model.layer(l).moe.experts) expert_bytes += x.gate.bytes() + x.up.bytes() + x.down.bytes();
  for (long long slots : {-1LL, all, all / 2}) {
    coli::cuda::CudaOptions base;
    if (slots >= 0) base.expert_slots = slots;
    coli::cuda::CudaOptions o = base, p = base;
    if (slots >= 0) {
      o.expert_host = std::make_shared<coli::cpu::CpuExpertHost>(model, 2);
      p.expert_host = std::make_shared<coli::cpu::CpuExpertHost>(*plain, 2);
    }
    const uint8_t* data = nullptr;
    ASSERT_TRUE(lm.mirror->twin(&data, &o.twin.bytes, &o.twin.device, o.twin.handle));
    o.twin.host = data;
    auto twin = coli::cuda::make_cuda_backend(model, o);
    auto ref = coli::cuda::make_cuda_backend(*plain, p);
    long long in_place = -1;
    for (const auto& [name, ms] : twin->start_phases())
      if (name.rfind("twin read in place ", 0) == 0) in_place = std::atoll(name.c_str() + 19);
    std::printf("[ info     ] slots %lld: %lld KiB read in place from the twin (routed experts: %llu KiB)\n", slots, in_place,
                static_cast<unsigned long long>(expert_bytes >> 10));
    if (slots < 0) {
      EXPECT_GE(in_place, static_cast<long long>(expert_bytes >> 10)) << "every expert read from the twin";
    } else {
      EXPECT_GT(in_place, 0) << "the trunk read from the twin";
    }
    coli::Engine er(s, *ref, 64), et(s, *twin, 64);
    for (const auto& pr : coli::test::tiny_goldens()["prompts"]) {
      const std::vector<int> ids = pr["ids"];
      const std::vector<int> cont = coli::test::greedy_tokens(er, ids, 8);
      coli::Session sr = er.new_session(), st = et.new_session();
      float err = 0;
      auto diff = [&](const std::vector<float>& a, const std::vector<float>& b) {
        ASSERT_EQ(a.size(), b.size());
        for (std::size_t i = 0; i < a.size(); ++i) err = std::max(err, std::fabs(a[i] - b[i]));
      };
      diff(er.forward(sr, ids), et.forward(st, ids));
      for (int tok : cont) diff(er.forward(sr, std::vector<int>{tok}), et.forward(st, std::vector<int>{tok}));
      EXPECT_EQ(err, 0.0f) << "slots " << slots << ", prompt of " << ids.size();
    }
  }
  ASSERT_EQ(run_pin("stop --model " + m.path, &out), 0) << out;
}
