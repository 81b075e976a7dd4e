// coli-pin: keeps a container's blobs in a shared-memory mirror
// (mirror/mirror.h) that later runs attach zero-copy. Thin: flags, the
// keeper's process life (fork, the ready handshake, stop signals) and the
// status table; the segment itself is the library's.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "common/heat_flag.h"
#include "common/run_flags.h"
#include "cuda_device.h"
#include "device_twin.h"
#include "formats/container.h"
#include "mirror/mirror.h"
#include "model/model_spec.h"
#include "model/weights.h"
#include "placement/device_budget.h"
#include "placement/heat.h"
#include "placement/plan.h"
#include "parse_options.h"
#include "util/error.h"
#include "util/parse.h"
#include "util/progress.h"
#include "util/tool_main.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace {

const char* kUsage =
    "usage: coli-pin start --model PATH [--budget SIZE] [--plan FILE] [--trunk] [--gpu] [--group] [--heat FILE|none] [--foreground]\n"
    "       coli-pin status [--json]\n"
    "       coli-pin stop --model PATH|NAME\n"
    "\n"
    "Keeps a coli container's routed experts (and with --trunk its other tensors)\n"
    "in a shared-memory segment, /dev/shm/coli-FINGERPRINT, locked in RAM, which\n"
    "coli-run and coli-bench attach instead of reading the container.\n";

// --model as a container file: a directory stands for its model.coli, as
// in coli-run. Absolute, because status shows it from anywhere.
std::string container_path(const std::string& m) {
  std::string file = coli::container_file_of(m);
  std::error_code ec;
  if (file.empty() && fs::is_directory(m, ec))
    throw coli::Error(m + ": a directory without model.coli, not a coli container (make one with coli-convert)");
  if (file.empty()) file = m;  // missing: the container's own error names it
  return fs::absolute(file).lexically_normal().string();
}

std::string octal(unsigned mode) {
  char s[8];
  std::snprintf(s, sizeof s, "%04o", mode);
  return s;
}

// What start prints: the name first, so `coli-pin start ... | cut -d' ' -f1`
// is the segment.
std::string describe(const std::string& name, const char* what, uint64_t bytes, uint64_t experts, uint64_t trunk, int pid) {
  return name + " " + what + ": " + std::to_string(bytes) + " bytes, " + std::to_string(experts) + " expert blobs, " + std::to_string(trunk) +
         " trunk blobs, pid " + std::to_string(pid);
}

// ---- start -----------------------------------------------------------------

// The signals that stop the keeper. They stay blocked for its whole life:
// one that comes while the segment loads abandons the copy (see
// LoadProgress) instead of killing the process before the builder's
// destructor can remove the segment; after that, sigwait takes it.
sigset_t stop_signals() {
  sigset_t s;
  sigemptyset(&s);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&s, sig);
  return s;
}

bool stop_pending() {
  sigset_t pending;
  sigpending(&pending);
  for (int sig : {SIGTERM, SIGINT, SIGHUP})
    if (sigismember(&pending, sig)) return true;
  return false;
}

// Thrown from the progress callback (fill() rethrows what a copy job throws)
// when a stop signal is pending.
struct Stopped {};

// fill()'s progress callback: the bar, and the check for a stop signal.
// Called from the copy threads, with totals that can arrive out of order.
struct LoadProgress {
  std::mutex mu;
  std::unique_ptr<coli::Progress> bar;
  uint64_t shown = 0;
  void operator()(uint64_t done, uint64_t total) {
    if (stop_pending()) throw Stopped{};
    std::lock_guard<std::mutex> lock(mu);
    if (!bar) bar = std::make_unique<coli::Progress>("pin", total, coli::stderr_is_tty());
    if (done > shown) bar->add(done - shown), shown = done;
  }
};

// The routed experts' heat that orders them under --budget: --heat FILE,
// else the file coli-run keeps for this model when there is one.
std::vector<uint64_t> heat_counts(const po::variables_map& vm, const coli::cli::HeatFlag& flag, const coli::Container& c, const std::string& path) {
  const std::string file = flag.path(c.fingerprint());
  std::error_code ec;
  if (file.empty() || (!flag.given() && !fs::exists(file, ec))) return {};
  const coli::ModelSpec spec = coli::parse_model_spec(c.config_json(), path);
  const coli::Heat h = coli::load_heat(file, c.fingerprint(), spec.num_layers, spec.num_experts);
  if (vm.count("budget")) std::fprintf(stderr, "coli-pin: hottest experts first, by %s (%llu tokens)\n", file.c_str(), (unsigned long long)h.tokens());
  return {h.counts().begin(), h.counts().end()};
}

// Another keeper's mirror of that name: waited for while it loads; its
// status once ready, or none when there is none (absent, or stale: said).
std::optional<coli::MirrorStatus> other_keeper(const std::string& name) {
  for (;; std::this_thread::sleep_for(std::chrono::milliseconds(100))) {
    const coli::MirrorStatus s = coli::mirror_status(name);
    if (s.state == "loading") continue;
    if (s.state == "ready") return s;
    if (s.state == "stale") std::fprintf(stderr, "coli-pin: %s: replacing it (stale: its owner, pid %d, is gone)\n", name.c_str(), s.owner_pid);
    return std::nullopt;
  }
}

// Makes, locks and fills the mirror, calls ready(line) once it is ready,
// then keeps it until a stop signal. Returns the exit status; the builder's
// destructor removes the segment.
int keep(const coli::Container& c, const std::string& path, coli::MirrorBuildOptions o, bool gpu, const std::function<void(const std::string&)>& ready) {
  auto progress = std::make_shared<LoadProgress>();
  o.progress = [progress](uint64_t done, uint64_t total) { (*progress)(done, total); };
  // Two starts at once: the one that publishes second waits for the
  // other's mirror and leaves it be, as a start that finds it loading does.
  // --gpu without a GPU: said by the flag, before the keeper loads (CUDA's
  // own error would come later and name neither). Asked here, in the
  // keeper, not before the fork: a CUDA runtime initialised in the parent
  // cannot be used in a forked child ("initialization error").
  if (std::string why; gpu && coli::cuda::device_count(&why) == 0) throw coli::Error("--gpu: no usable CUDA device (" + why + ")");
  std::unique_ptr<coli::MirrorBuilder> made;
  while (!made) {
    try {
      made = std::make_unique<coli::MirrorBuilder>(c, path, o);
    } catch (const coli::MirrorTaken&) {
      const std::string name = coli::mirror_name(c.fingerprint());
      if (const auto s = other_keeper(name)) {
        ready(describe(name, "already running", s->bytes, s->expert_blobs, s->trunk_blobs, s->owner_pid));
        return 0;
      }
    }
  }
  coli::MirrorBuilder& b = *made;
  const coli::MirrorHeader& h = b.header();
  if (h.expert_blobs + h.trunk_blobs == 0) throw coli::Error(b.name() + ": --budget of " + std::to_string(o.budget) + " bytes holds no expert");
  // Locked before the copy: a too-low RLIMIT_MEMLOCK fails at once, not
  // after gigabytes are copied.
  b.lock_pages();
  // Test hook (tests/hostile_input_test.cpp): the keeper dies here, loading,
  // as a kill -9 would leave it; the detaching start must say so.
  if (const char* v = std::getenv("COLI_PIN_TEST_DIE_LOADING"); v && std::string(v) == "1") ::raise(SIGKILL);
  try {
    b.fill();
    if (progress->bar) progress->bar->finish();
    if (stop_pending()) throw Stopped{};
  } catch (const Stopped&) {
    std::fprintf(stderr, "coli-pin: %s: stopped by a signal while loading\n", b.name().c_str());
    return 0;
  }
  b.set_owner(::getpid());  // this process keeps it (a daemon forked before building)
  // --gpu: a device copy of the blobs that runs on this GPU map (CUDA IPC).
  std::unique_ptr<coli::cuda::DeviceTwin> twin;
  std::string twin_note;
  if (gpu) {
    twin = std::make_unique<coli::cuda::DeviceTwin>(b.data(), h.data_bytes, 0);
    b.set_twin(twin->device(), twin->handle());
    char note[96];
    std::snprintf(note, sizeof note, ", device twin on GPU %d (%.1f s)", twin->device(), twin->copy_ms() / 1e3);
    twin_note = note;
  }
  ready(describe(b.name(), "ready", b.bytes(), h.expert_blobs, h.trunk_blobs, ::getpid()) + twin_note);
  const sigset_t stop = stop_signals();
  int sig = SIGTERM;
  sigwait(&stop, &sig);
  std::fprintf(stderr, "coli-pin: %s: %s, removing it\n", b.name().c_str(), strsignal(sig));
  return 0;
}

void write_all(int fd, const std::string& s) {
  for (std::size_t at = 0; at < s.size();) {
    const ssize_t n = ::write(fd, s.data() + at, s.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the parent is gone: nobody to tell
    at += std::size_t(n);
  }
}

void to_dev_null(std::initializer_list<int> fds) {
  const int null = ::open("/dev/null", O_RDWR);
  if (null < 0) return;
  for (int fd : fds) ::dup2(null, fd);
  if (null > 2) ::close(null);
}

// The parent's side while the daemon loads: a stop signal to it (Ctrl-C on
// start) is passed on, so the load is abandoned rather than left running.
// Once the keeper is ready g_daemon is cleared: a signal after that no
// longer stops it (the start succeeded), and g_forwarded tells whether one
// before did.
volatile sig_atomic_t g_daemon = 0, g_forwarded = 0;
void forward_stop(int) {
  if (g_daemon > 0) {
    ::kill(g_daemon, SIGTERM);
    g_forwarded = 1;
  }
}

// Forks the keeper first (mlock is not inherited across fork), waits for
// its "ready" line on a pipe, prints it and returns. The keeper leaves the
// session, reports errors on the inherited stderr until it is ready, then
// lets go of the terminal.
int start_daemon(const coli::Container& c, const std::string& path, const coli::MirrorBuildOptions& o, bool gpu) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw coli::Error(std::string("pipe: ") + std::strerror(errno));
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw coli::Error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::close(fds[0]);
    ::setsid();
    ::signal(SIGPIPE, SIG_IGN);  // the parent may be gone by the time it is ready
    to_dev_null({0, 1});
    if (::chdir("/") != 0) throw coli::Error(std::string("chdir /: ") + std::strerror(errno));  // hold no mount busy
    return keep(c, path, o, gpu, [&](const std::string& line) {
      to_dev_null({2});
      write_all(fds[1], line + "\n");
      ::close(fds[1]);
    });
  }
  ::close(fds[1]);
  g_daemon = pid;
  struct sigaction sa {};
  sa.sa_handler = forward_stop;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  const sigset_t stop = stop_signals();
  ::sigprocmask(SIG_UNBLOCK, &stop, nullptr);
  std::string line;
  bool whole = false;  // the line ended: the keeper is ready
  for (char ch;;) {
    const ssize_t n = ::read(fds[0], &ch, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (ch == '\n') {
      whole = true;
      break;
    }
    line += ch;
  }
  ::close(fds[0]);
  if (whole) g_daemon = 0;
  if (whole && !g_forwarded) {
    std::printf("%s\n", line.c_str());
    return 0;
  }
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  // A keeper that failed said why on stderr; one that exited 0 was stopped;
  // one killed by a signal could say nothing: said here.
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) throw coli::Error("stopped before the mirror was ready");
  if (WIFSIGNALED(st))
    throw coli::Error("the keeper (pid " + std::to_string(pid) + ") was killed by " + strsignal(WTERMSIG(st)) + " before the mirror was ready");
  return 1;
}

int cmd_start(int argc, char** argv) {
  po::options_description opts("start options");
  opts.add_options()("help,h", "show this help")("model,m", po::value<std::string>(), "coli container (or a directory holding model.coli)")
      ("budget", po::value<std::string>(), "bytes of blobs to hold, e.g. 12G (default: every routed expert); the hottest experts first")
      ("trunk", po::bool_switch(), "hold the non-expert tensors too (they count against --budget)")
      ("plan", po::value<std::string>(), "hold the experts a coli-place plan puts in VRAM or RAM (man coli-plan); without --budget, exactly those")
      ("gpu", po::bool_switch(), "also keep a copy of the blobs on GPU 0, which runs on that GPU read in place (CUDA IPC) instead of uploading")
      ("group", po::bool_switch(), "mode 0660 (the owner's group may attach) instead of 0600");
  coli::cli::add_flags(opts, coli::cli::Tool::kPin, {coli::cli::Flag::kHeat});
  opts.add_options()("foreground", po::bool_switch(), "stay in the foreground (systemd Type=simple) instead of detaching");
  auto vm = coli::parse_options(argc, argv, opts, {});
  if (vm.count("help")) {
    std::cout << kUsage << "\n" << opts << "\nStops on SIGTERM, SIGINT or SIGHUP, removing the segment (coli-pin stop sends SIGTERM).\n";
    return 0;
  }
  if (!vm.count("model")) throw coli::UsageError("--model PATH is required");
  coli::MirrorBuildOptions o;
  if (vm.count("budget")) o.budget = coli::parse_size(vm["budget"].as<std::string>(), "--budget");
  if (vm.count("budget") && o.budget == 0) throw coli::UsageError("--budget must be more than 0 (leave it out for every expert)");
  o.trunk = vm["trunk"].as<bool>();
  o.group = vm["group"].as<bool>();
  const bool gpu = vm["gpu"].as<bool>();
  const coli::cli::HeatFlag heat = coli::cli::HeatFlag::from(vm);
  const std::string path = container_path(vm["model"].as<std::string>());
  const coli::Container c(path);
  if (vm.count("plan") && vm.count("heat")) throw coli::UsageError("--plan and --heat both order the experts: give one");  // before any note
  o.heat = heat_counts(vm, heat, c, path);
  if (vm.count("plan")) {
    // The plan's VRAM and RAM experts first (VRAM's hottest of all), and
    // without --budget only those (with the trunk under --trunk).
    const coli::ModelSpec spec = coli::parse_model_spec(c.config_json(), path);
    const coli::Plan plan = coli::load_plan(vm["plan"].as<std::string>(), c.fingerprint(), spec.num_layers, spec.num_experts);
    o.heat.assign(plan.tier.size(), 0);
    for (std::size_t i = 0; i < plan.tier.size(); ++i) o.heat[i] = static_cast<uint64_t>(plan.tier[i]);  // disk 0, ram 1, vram 2
    if (!vm.count("budget")) {
      auto aligned = [](uint64_t b) { return (b + 4095) / 4096 * 4096; };
      for (const coli::Blob& b : c.manifest().blobs) {
        if (b.kind == "expert" && b.layer >= 0 && b.layer < spec.num_layers && b.expert >= 0 && b.expert < spec.num_experts &&
            plan.at(b.layer, b.expert) != coli::Tier::kDisk)
          o.budget += aligned(b.bytes);
        if (b.kind == "tensor" && o.trunk) o.budget += aligned(b.bytes);
      }
      if (o.budget == 0) throw coli::Error(vm["plan"].as<std::string>() + ": the plan puts no expert in VRAM or RAM: nothing to hold");
    }
  }
  const std::string name = coli::mirror_name(c.fingerprint());
  // Another keeper: wait while it loads, then leave it be.
  if (const auto s = other_keeper(name)) {
    std::printf("%s\n", describe(name, "already running", s->bytes, s->expert_blobs, s->trunk_blobs, s->owner_pid).c_str());
    return 0;
  }
  // Blocked before the fork, so the keeper never runs without its mask.
  const sigset_t stop = stop_signals();
  ::sigprocmask(SIG_BLOCK, &stop, nullptr);
  if (vm["foreground"].as<bool>())
    return keep(c, path, o, gpu, [](const std::string& line) {
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    });
  return start_daemon(c, path, o, gpu);
}

// ---- status ----------------------------------------------------------------

int cmd_status(int argc, char** argv) {
  po::options_description opts("status options");
  opts.add_options()("help,h", "show this help")("json", po::bool_switch(), "one JSON array instead of the table");
  auto vm = coli::parse_options(argc, argv, opts, {});
  if (vm.count("help")) {
    std::cout << kUsage << "\n" << opts << std::endl;
    return 0;
  }
  const auto mirrors = coli::list_mirrors();
  if (vm["json"].as<bool>()) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& s : mirrors)
      a.push_back({{"name", s.name}, {"state", s.state}, {"model", s.model}, {"error", s.error}, {"fingerprint", coli::hex64(s.fingerprint)},
                   {"bytes", s.bytes}, {"owner_pid", s.owner_pid}, {"owner_alive", s.owner_alive}, {"runs", s.runs},
                   {"expert_blobs", s.expert_blobs}, {"trunk_blobs", s.trunk_blobs}, {"heat_total", s.heat_total}, {"mode", octal(s.mode)}});
    std::printf("%s\n", a.dump().c_str());
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {{"NAME", "STATE", "SIZE", "OWNER", "RUNS", "EXPERTS", "TRUNK", "HEAT", "MODE", "MODEL"}};
  for (const auto& s : mirrors) {
    const std::string owner = s.owner_pid ? std::to_string(s.owner_pid) + (s.owner_alive ? " alive" : " gone") : "-";
    rows.push_back({s.name, s.state, coli::format_bytes(s.bytes), owner, std::to_string(s.runs), std::to_string(s.expert_blobs), std::to_string(s.trunk_blobs),
                    std::to_string(s.heat_total), octal(s.mode), s.error.empty() ? s.model : s.error});
  }
  std::vector<std::size_t> width(rows[0].size(), 0);
  for (const auto& r : rows)
    for (std::size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  for (const auto& r : rows) {
    std::string line;
    for (std::size_t i = 0; i < r.size(); ++i) line += i + 1 < r.size() ? r[i] + std::string(width[i] - r[i].size() + 2, ' ') : r[i];
    std::printf("%s\n", line.c_str());
  }
  return 0;
}

// ---- stop ------------------------------------------------------------------

// Whether process pid maps segment name: the owner pid of a keeper that
// died may since belong to another process, which must not get SIGTERM.
// Unknown (no /proc, another user's process): assumed so.
bool maps_segment(int pid, const std::string& name) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  if (!maps) return true;
  for (std::string l; std::getline(maps, l);)
    if (l.find("/dev/shm/" + name) != std::string::npos || l.find("/dev/shm/." + name + ".new-") != std::string::npos) return true;
  return false;
}

int cmd_stop(int argc, char** argv) {
  po::options_description opts("stop options");
  opts.add_options()("help,h", "show this help")("model,m", po::value<std::string>(), "the container (or its directory), or the segment's name coli-...");
  po::positional_options_description pos;
  pos.add("model", 1);
  auto vm = coli::parse_options(argc, argv, opts, pos);
  if (vm.count("help")) {
    std::cout << kUsage << "\n" << opts << std::endl;
    return 0;
  }
  if (!vm.count("model")) throw coli::UsageError("--model PATH|NAME is required");
  std::string arg = vm["model"].as<std::string>();
  if (arg.empty()) throw coli::UsageError("--model: give the container (or its directory), or the segment's name coli-...");
  if (arg.rfind("/dev/shm/coli-", 0) == 0) arg = arg.substr(9);  // the segment's path, as coli-pin(1) shows it
  std::error_code ec;
  const bool is_name = arg.rfind("coli-", 0) == 0 && arg.find('/') == std::string::npos && !fs::exists(arg, ec);
  const std::string name = is_name ? arg : coli::mirror_name(coli::Container(container_path(arg)).fingerprint());
  const coli::MirrorStatus s = coli::mirror_status(name);
  if (s.state.empty()) throw coli::Error("no mirror " + name + (is_name ? "" : " of " + arg));
  // A FIFO or directory named like a segment is someone's file, not a
  // mirror: stop neither signals anyone nor removes it.
  if (!s.segment) throw coli::Error(name + ": " + s.error + "; not removed");
  if (s.state != "invalid" && s.owner_alive && maps_segment(s.owner_pid, name)) {
    if (::kill(s.owner_pid, SIGTERM) != 0)
      throw coli::Error(name + ": cannot signal its owner, pid " + std::to_string(s.owner_pid) + ": " + std::strerror(errno));
    // The keeper removes the segment as it exits.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!coli::mirror_status(name).state.empty()) {
      if (std::chrono::steady_clock::now() > until)
        throw coli::Error(name + ": its owner, pid " + std::to_string(s.owner_pid) + ", got SIGTERM but has not removed it after 10 s");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::fprintf(stderr, "coli-pin: stopped %s (pid %d)\n", name.c_str(), s.owner_pid);
    return 0;
  }
  // "removed" only when it was: the entry may have changed since the status.
  if (!coli::remove_mirror(name)) throw coli::Error(name + ": cannot remove it: " + std::strerror(errno));
  std::fprintf(stderr, "coli-pin: removed %s (%s)\n", name.c_str(), s.state == "invalid" ? s.error.c_str() : "stale: its owner is gone");
  return 0;
}

int run(int argc, char** argv) {
  if (argc < 2) throw coli::UsageError("nothing to do: start, status or stop");
  const std::string cmd = argv[1];
  if (cmd == "start") return cmd_start(argc - 1, argv + 1);
  if (cmd == "status") return cmd_status(argc - 1, argv + 1);
  if (cmd == "stop") return cmd_stop(argc - 1, argv + 1);
  if (cmd == "-h" || cmd == "--help") {
    std::cout << kUsage << "\nRun 'coli-pin SUBCOMMAND --help' for the options of each.\n";
    return 0;
  }
  throw coli::UsageError("unknown subcommand '" + cmd + "' (start, status or stop)");
}

}  // namespace

int main(int argc, char** argv) { return coli::tool_main("coli-pin", [&] { return run(argc, argv); }); }
