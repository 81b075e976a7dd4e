// Issue 29's hostile inputs that used to hang or grow without limit: a
// FIFO given as a container, non-regular files (/dev/zero, /dev/full) as
// heat, rates and prompt files, and coli-pin stop's arguments; and what its
// sweep re-run found (docs/hardening.md): FIFOs and directories named like
// segments, standard output on a full device, two keepers at once, flags
// checked late. Every tool call runs under timeout(1): a hang is exit 124,
// not a stuck test.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "cuda_device.h"
#include "engine_util.h"
#include "mirror/mirror.h"
#include "placement/heat.h"
#include "placement/machine_rates.h"
#include "placement/plan.h"
#include "test_util.h"
#include "util/error.h"
#include "util/io.h"
#include "util/parse.h"

namespace {

using coli::test::run_command;

std::string bin(const char* tool) { return "timeout 20 " + coli::test::bin_dir() + "/" + tool; }

std::string error_of(const std::string& path, std::size_t max = coli::kTextFileMax) {
  try {
    coli::read_text_file(path, max);
  } catch (const coli::Error& e) {
    return e.what();
  }
  return "(no error)";
}

struct Files {
  coli::test::TempDir dir;
  std::string model, fifo;
  Files() {
    model = dir / "m.coli", fifo = dir / "f.coli";
    coli::test::convert_all(coli::test::data_dir() + "/tiny-qwen35moe-text", model, coli::QuantFormat::I8);
    EXPECT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  }
};

// How often part occurs in text.
int count_of(const std::string& text, const std::string& part) {
  int n = 0;
  for (std::size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + part.size())) ++n;
  return n;
}

// The tiny model as a container of this test's own (a config key naming
// the process), so that the segment name of its fingerprint is this
// test's alone while other suites run.
std::string own_model(const coli::test::TempDir& dir, const std::string& tag) {
  const std::string ck = dir / "ck", out = dir / (tag + ".coli");
  std::filesystem::create_directories(ck);
  for (const auto& e : std::filesystem::directory_iterator(coli::test::data_dir() + "/tiny-qwen35moe-text"))
    std::filesystem::copy_file(e.path(), ck + "/" + e.path().filename().string(), std::filesystem::copy_options::overwrite_existing);
  auto config = nlohmann::json::parse(coli::test::read_file(ck + "/config.json"));
  config["coli_test_tag"] = tag + "-" + std::to_string(::getpid());
  coli::test::write_file(ck + "/config.json", config.dump(2));
  coli::test::convert_all(ck, out, coli::QuantFormat::I8);
  return out;
}

// A FIFO or directory under /dev/shm named like a segment, removed on scope
// exit (by unlink and rmdir: remove_mirror leaves what is no segment).
struct ShmEntry {
  std::string name, path;
  ShmEntry(const std::string& n, bool fifo) : name(n), path("/dev/shm/" + n) {
    remove();
    EXPECT_EQ(fifo ? ::mkfifo(path.c_str(), 0600) : ::mkdir(path.c_str(), 0700), 0) << path;
  }
  ~ShmEntry() { remove(); }
  void remove() {
    ::unlink(path.c_str());
    ::rmdir(path.c_str());
  }
};

}  // namespace

// The one reader of text files: regular files up to a size, nothing else,
// each refusal naming the file; a FIFO refused without waiting for a writer.
TEST(HostileInput, TextFilesAreRegularAndBounded) {
  Files f;
  EXPECT_EQ(error_of(f.dir.path()), f.dir.path() + ": is a directory, not a file");
  EXPECT_EQ(error_of("/dev/null"), "/dev/null: is not a regular file (a device, FIFO or socket)");
  EXPECT_EQ(error_of("/dev/zero"), "/dev/zero: is not a regular file (a device, FIFO or socket)");
  EXPECT_EQ(error_of(f.fifo), f.fifo + ": is not a regular file (a device, FIFO or socket)");
  const std::string small = f.dir / "t.txt";
  coli::test::write_file(small, std::string(3000, 'x'));
  EXPECT_EQ(coli::read_text_file(small).size(), 3000u);
  EXPECT_NE(error_of(small, 2048).find("3000 bytes, more than"), std::string::npos) << error_of(small, 2048);
  EXPECT_NE(error_of(f.dir / "missing.txt").find("cannot open"), std::string::npos);
}

// The line-based files (heat, plan, rates) are parsed as they are read:
// a line longer than kTextLineMax fails at that line, and a bad line early
// in a large file fails before the rest is read (the process's read bytes,
// /proc/self/io rchar, grow by far less than the file).
TEST(HostileInput, LineFilesFailAtTheFirstBadLine) {
  Files f;
  const std::string longline = f.dir / "long.txt";
  coli::test::write_file(longline, "coli-heat 1\n" + std::string(coli::kTextLineMax + 10, '7') + "\nmore\n");
  auto err = [](auto&& fn) {
    try {
      fn();
    } catch (const coli::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string want = longline + ":2: a line longer than 1 MiB, which no file of this kind has";
  EXPECT_EQ(err([&] { coli::read_heat_file(longline); }), want);
  EXPECT_EQ(err([&] { coli::read_plan_file(longline); }), longline + ":1: not a coli plan file (expected 'coli-plan 1')");
  EXPECT_EQ(err([&] { coli::parse_heat(coli::read_text_file(longline), longline); }), want) << "in memory: the same rule";
  const std::string rates = f.dir / "rates.txt";
  coli::test::write_file(rates, "coli-rates 1\n" + std::string(coli::kTextLineMax + 1, 'k'));
  EXPECT_EQ(err([&] { coli::load_rates(rates); }), rates + ":2: a line longer than 1 MiB, which no file of this kind has");

  // 64 MiB after a bad second line.
  const std::string big = f.dir / "big.txt";
  {
    std::string junk = "coli-heat 1\nbogus line\n";
    const std::string row(1023, 'x');
    junk.reserve(std::size_t(64) << 20);
    while (junk.size() < (std::size_t(64) << 20)) junk += row + "\n";
    coli::test::write_file(big, junk);
  }
  auto rchar = [] {
    std::FILE* io = std::fopen("/proc/self/io", "r");
    if (!io) return -1.0;
    char key[64];
    unsigned long long v = 0;
    double got = -1;
    while (std::fscanf(io, "%63s %llu", key, &v) == 2)
      if (std::string(key) == "rchar:") got = double(v);
    std::fclose(io);
    return got;
  };
  const double r0 = rchar();
  EXPECT_EQ(err([&] { coli::read_heat_file(big); }), big + ":2: expected 'model FINGERPRINT'");
  const double r1 = rchar();
  if (r0 >= 0 && r1 >= 0) {
    EXPECT_LT(r1 - r0, double(1 << 20)) << "read " << (r1 - r0) << " bytes of a 64 MiB file to fail at its line 2";
  }
}

// mkfifo f.coli; coli-pin start -m f.coli and coli-place plan -m f.coli:
// one line, exit 1, at once (they used to block in open()).
TEST(HostileInput, AFifoIsNotAContainer) {
  Files f;
  std::string out;
  EXPECT_EQ(run_command(bin("coli-place") + " plan -m " + f.fifo + " --vram 1G 2>&1", &out), 1) << out;
  EXPECT_NE(out.find("is not a regular file"), std::string::npos) << out;
  EXPECT_EQ(run_command(bin("coli-pin") + " start -m " + f.fifo + " --heat none 2>&1", &out), 1) << out;
  EXPECT_NE(out.find("is not a regular file"), std::string::npos) << out;
}

// Devices as heat, rates and prompt files: refused by name at once (they
// used to be read until memory ran out).
TEST(HostileInput, DevicesAreNotTextFiles) {
  Files f;
  std::string out;
  EXPECT_EQ(run_command(bin("coli-place") + " plan -m " + f.model + " --vram 1G --heat /dev/zero 2>&1", &out), 1) << out;
  EXPECT_NE(out.find("/dev/zero: is not a regular file"), std::string::npos) << out;
  EXPECT_EQ(run_command(bin("coli-place") + " probe -o " + (f.dir / "no/such/dir/r.txt") + " 2>&1", &out), 1) << out;
  EXPECT_NE(out.find("is not a directory (-o writes into an existing one)"), std::string::npos) << out;
  EXPECT_EQ(out.find("host memory read"), std::string::npos) << "refused before measuring";
  EXPECT_EQ(run_command(bin("coli-place") + " probe -o /dev/full 2>&1", &out), 1) << out;
  EXPECT_NE(out.find("/dev/full: is not a regular file"), std::string::npos) << out;
  EXPECT_EQ(run_command(bin("coli-run") + " -m " + f.model + " --device cpu --prompt-ids 1,2 -n 1 --heat /dev/full 2>&1", &out), 1) << out;
  EXPECT_NE(out.find("/dev/full: is not a regular file"), std::string::npos) << out;
  EXPECT_EQ(run_command(bin("coli-bench") + " -m " + f.model + " --device cpu -p 4 -n 0 -r 1 --heat none --prompt-file /dev/zero 2>&1", &out), 1)
      << out;
  EXPECT_NE(out.find("/dev/zero: is not a regular file"), std::string::npos) << out;
}

// coli-pin stop "": a usage line (exit 2), not a raw filesystem error; the
// segment's path as coli-pin(1) shows it names the segment.
TEST(HostileInput, PinStopTakesANameOrPath) {
  std::string out;
  EXPECT_EQ(run_command(bin("coli-pin") + " stop \"\" 2>&1", &out), 2) << out;
  EXPECT_NE(out.find("--model"), std::string::npos) << out;
  EXPECT_EQ(run_command(bin("coli-pin") + " stop /dev/shm/coli-0000000000000bad 2>&1", &out), 1) << out;
  EXPECT_NE(out.find("no mirror coli-0000000000000bad"), std::string::npos) << out;
}

// Eight runs saving into one heat file at once: the file ends as eight runs
// one after the other leave it (each merge read, added and renamed under
// the file's lock; they used to lose about a sixth of the tokens).
TEST(HostileInput, RunsAtOnceLoseNoHeat) {
  Files f;
  const std::string run = bin("coli-run") + " -m " + f.model + " --device cpu --prompt-ids 1,2,3,4 -n 8 --temp 0 --ignore-eos --heat ";
  std::string out;
  const std::string one_by_one = f.dir / "seq.txt", at_once = f.dir / "par.txt";
  for (int i = 0; i < 8; ++i) ASSERT_EQ(run_command(run + one_by_one + " >/dev/null 2>&1", &out), 0) << out;
  std::string all;
  for (int i = 0; i < 8; ++i) all += run + at_once + " >/dev/null 2>&1 & ";
  ASSERT_EQ(run_command("{ " + all + "wait; } 2>&1", &out), 0) << out;
  const std::string seq = coli::read_text_file(one_by_one), par = coli::read_text_file(at_once);
  EXPECT_NE(seq.find("tokens"), std::string::npos) << seq.substr(0, 200);
  EXPECT_EQ(par, seq);
}

// Weak spots of the sweep: list items are counts, not token ids; a heat
// file under a regular file fails at the start, before any token; random
// bytes are not prompts to calibrate heat from.
TEST(HostileInput, CountsHeatPathsAndPromptText) {
  Files f;
  try {
    coli::parse_int_list("512,1e9", "-p");
    ADD_FAILURE() << "1e9 taken";
  } catch (const coli::UsageError& e) {
    EXPECT_EQ(std::string(e.what()), "-p: '1e9' is not a count from 0 to 2147483647");
  }
  std::string out;
  const std::string file = f.dir / "plain.txt";
  coli::test::write_file(file, "x");
  EXPECT_EQ(run_command(bin("coli-run") + " -m " + f.model + " --device cpu --prompt-ids 1,2 -n 4 --temp 0 --heat " + file + "/sub/h.txt 2>/dev/null", &out), 1);
  EXPECT_EQ(out, "") << "refused before the first token";
  EXPECT_EQ(run_command(bin("coli-run") + " -m " + f.model + " --device cpu --prompt-ids 1,2 -n 4 --temp 0 --heat " + file + "/h.txt 2>&1", &out), 1);
  EXPECT_NE(out.find("is not a directory"), std::string::npos) << out;
  std::string junk;
  for (int i = 0; i < 4096; ++i) junk += char((i * 2654435761u) >> 24);
  const std::string prompts = f.dir / "junk.txt";
  coli::test::write_file(prompts, junk);
  EXPECT_EQ(run_command(bin("coli-place") + " calibrate -m " + f.model + " --prompts " + prompts + " --heat " + (f.dir / "h.txt") + " 2>&1", &out), 1)
      << out;
  EXPECT_NE(out.find("not UTF-8 text"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(f.dir / "h.txt")) << "no junk merged";
}

// A usage error is the first line: no informational note before it (coli-pin
// start used to say which heat orders the experts, then refuse --plan with
// --heat).
TEST(HostileInput, UsageErrorsComeFirst) {
  Files f;
  std::string out;
  const std::string heat = f.dir / "h.txt";
  ASSERT_EQ(run_command(bin("coli-run") + " -m " + f.model + " --device cpu --prompt-ids 1,2 -n 2 --temp 0 --heat " + heat + " >/dev/null 2>&1", &out), 0);
  EXPECT_EQ(run_command(bin("coli-pin") + " start -m " + f.model + " --budget 1M --heat " + heat + " --plan " + (f.dir / "p.plan") + " 2>&1", &out), 2)
      << out;
  EXPECT_EQ(out.rfind("coli-pin: --plan and --heat both order the experts", 0), 0u) << out;
}

// A keeper killed while it loads (a test hook kills it there): the
// detaching start says so and exits 1; the next start replaces the stale
// segment it left.
TEST(HostileInput, AKeeperKilledWhileLoadingIsReported) {
  Files f;
  std::string out;
  const std::string pin = bin("coli-pin");
  EXPECT_EQ(run_command("COLI_PIN_TEST_DIE_LOADING=1 " + pin + " start -m " + f.model + " --heat none 2>&1", &out), 1) << out;
  EXPECT_NE(out.find("was killed by"), std::string::npos) << out;
  EXPECT_NE(out.find("before the mirror was ready"), std::string::npos) << out;
  EXPECT_EQ(run_command(pin + " start -m " + f.model + " --heat none 2>&1", &out), 0) << out;
  EXPECT_NE(out.find("stale"), std::string::npos) << out;
  EXPECT_EQ(run_command(pin + " stop -m " + f.model + " 2>&1", &out), 0) << out;
}

// P15, P16: a FIFO and a directory named like segments (anyone can make
// them in /dev/shm). status lists them as what they are, without opening
// them (a FIFO's open used to block status forever); stop refuses them,
// exit 1, instead of claiming it removed them (it used to say "removed" of
// a directory that stayed).
TEST(HostileInput, ShmEntriesThatAreNoSegmentsAreNoMirrors) {
  const std::string tag = "coli-test-" + std::to_string(::getpid());
  const ShmEntry fifo(tag + "-fifo", true), dir(tag + "-dir", false);
  const coli::MirrorStatus s = coli::mirror_status(fifo.name);
  EXPECT_EQ(s.state, "invalid");
  EXPECT_FALSE(s.segment);
  EXPECT_EQ(s.error, fifo.path + " is a FIFO, not a shared-memory segment");
  EXPECT_FALSE(coli::remove_mirror(fifo.name));
  EXPECT_FALSE(coli::remove_mirror(dir.name));
  std::string out;
  const std::string pin = coli::test::bin_dir() + "/coli-pin";
  EXPECT_EQ(run_command("timeout 10 " + pin + " status 2>&1", &out), 0) << out;
  EXPECT_NE(out.find(fifo.name + "  invalid"), std::string::npos) << out;
  EXPECT_NE(out.find(fifo.path + " is a FIFO, not a shared-memory segment"), std::string::npos) << out;
  EXPECT_NE(out.find(dir.path + " is a directory, not a shared-memory segment"), std::string::npos) << out;
  EXPECT_EQ(run_command("timeout 10 " + pin + " stop " + fifo.name + " 2>&1", &out), 1) << out;
  EXPECT_EQ(out, "coli-pin: " + fifo.name + ": " + fifo.path + " is a FIFO, not a shared-memory segment; not removed\n");
  EXPECT_EQ(run_command("timeout 10 " + pin + " stop " + dir.name + " 2>&1", &out), 1) << out;
  EXPECT_EQ(out, "coli-pin: " + dir.name + ": " + dir.path + " is a directory, not a shared-memory segment; not removed\n");
  struct stat st {};
  EXPECT_TRUE(::lstat(fifo.path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode));
  EXPECT_TRUE(::lstat(dir.path.c_str(), &st) == 0 && S_ISDIR(st.st_mode));
}

// R22: a FIFO where a model's mirror would be. Every tool that looks for
// the mirror by default reads the container instead (saying so once); an
// explicit --mirror and coli-pin start refuse it by name. They all used to
// block in the FIFO's open.
TEST(HostileInput, AFifoWhereTheMirrorWouldBeIsIgnored) {
  coli::test::TempDir dir;
  const std::string model = own_model(dir, "fifo-mirror");
  const std::string name = coli::mirror_name(coli::Container(model).fingerprint());
  const ShmEntry fifo(name, true);
  auto tool = [](const char* t) { return "timeout 10 " + coli::test::bin_dir() + "/" + t; };
  const std::string ignored = "ignoring " + name + ": not a coli mirror (" + fifo.path + " is a FIFO, not a shared-memory segment); reading the container";
  std::string out;
  EXPECT_EQ(run_command(tool("coli-run") + " -m " + model + " --device cpu -t 1 --temp 0 --prompt-ids 1,2 -n 2 --heat none 2>&1 >/dev/null", &out), 0) << out;
  EXPECT_EQ(out.rfind("coli-run: " + ignored + "\n", 0), 0u) << out;
  EXPECT_EQ(count_of(out, "ignoring"), 1) << out;
  EXPECT_EQ(run_command(tool("coli-bench") + " -m " + model + " --device cpu -t 1 -r 1 -p 4 -n 0 --heat none 2>&1 >/dev/null", &out), 0) << out;
  EXPECT_EQ(count_of(out, ignored), 1) << out;
  EXPECT_EQ(run_command(tool("coli-place") + " plan -m " + model + " --vram 1G --heat none 2>&1 >/dev/null", &out), 0) << out;
  EXPECT_EQ(run_command(tool("coli-run") + " -m " + model + " --device cpu --prompt-ids 1,2 -n 2 --heat none --mirror " + name + " 2>&1", &out), 1) << out;
  EXPECT_NE(out.find("mirror " + name + ": " + fifo.path + " is a FIFO"), std::string::npos) << out;
  EXPECT_EQ(run_command(tool("coli-pin") + " start -m " + model + " --heat none 2>&1", &out), 1) << out;
  EXPECT_NE(out.find(fifo.path + " is a FIFO, not a shared-memory segment; remove it"), std::string::npos) << out;
  struct stat st {};
  EXPECT_TRUE(::lstat(fifo.path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode)) << "left as it was";
}

// R21, C08, L22: output onto a full device is an error naming standard
// output, exit 1 (the tools used to exit 0 with the output lost).
TEST(HostileInput, AFullStandardOutputFails) {
  Files f;
  std::string out;
  const std::string rates = f.dir / "rates.txt";
  ASSERT_EQ(run_command(bin("coli-place") + " probe -o " + rates + " --seconds 0.01 >/dev/null 2>&1", &out), 0);
  const std::pair<std::string, std::string> cases[] = {
      {"coli-run", " -m " + f.model + " --device cpu -t 1 --temp 0 --prompt-ids 1,2 -n 4 --heat none"},
      {"coli-run", " --tokenizer " + coli::test::data_dir() + "/tiny-tokenizer --tokenize < " + coli::test::data_dir() + "/tiny-tokenizer/tokenizer.json"},
      {"coli-bench", " -m " + f.model + " --device cpu -t 1 -r 1 -p 4 -n 0 --heat none"},
      {"coli-place", " plan -m " + f.model + " --vram 1G --heat none --rates " + rates},
      {"coli-pin", " status"},
  };
  for (const auto& [tool, args] : cases) {
    EXPECT_EQ(run_command(bin(tool.c_str()) + args + " 2>&1 >/dev/full", &out), 1) << tool << args << ": " << out;
    EXPECT_EQ(out.rfind(tool + ": standard output: write error", 0), 0u) << tool << args << ": the first line: " << out;
    EXPECT_EQ(run_command(bin(tool.c_str()) + args + " >/dev/null 2>&1", &out), 0) << tool << args << ": " << out;
  }
}

// P19: a keeper that finds another's live segment already published (the
// first loads in milliseconds) gets MirrorTaken, as when the other
// publishes first, so coli-pin's second start waits for it and exits 0
// (it used to fail: "already kept by pid N (loading)").
TEST(HostileInput, ASecondKeeperOfALiveSegmentIsTaken) {
  coli::test::TempDir dir;
  const std::string model = dir / "m.coli";
  coli::test::convert_all(coli::test::data_dir() + "/tiny-qwen35moe-text", model, coli::QuantFormat::I8);
  const coli::Container c(model);
  coli::MirrorBuildOptions o;
  o.name = "coli-test-" + std::to_string(::getpid()) + "-taken";
  coli::remove_mirror(o.name);
  {
    coli::MirrorBuilder first(c, model, o);
    EXPECT_THROW(coli::MirrorBuilder(c, model, o), coli::MirrorTaken) << "loading";
    first.fill();
    EXPECT_THROW(coli::MirrorBuilder(c, model, o), coli::MirrorTaken) << "ready";
  }
  EXPECT_TRUE(coli::mirror_status(o.name).state.empty());
}

// L03, L15, R18: --chunks items are counts (not token ids); plan -o into a
// missing directory fails before any note; a negative seed is a usage error
// naming --seed (it used to become 2^64-1).
TEST(HostileInput, ChunksOutputDirAndSeedAreCheckedFirst) {
  Files f;
  std::string out;
  EXPECT_EQ(run_command(bin("coli-place") + " plan -m " + f.model + " --vram 1G --heat none --chunks 512,1e9 2>&1", &out), 2) << out;
  EXPECT_EQ(out.rfind("coli-place: --chunks: '1e9' is not a count from 0 to 2147483647", 0), 0u) << out;
  EXPECT_EQ(run_command(bin("coli-place") + " plan -m " + f.model + " --vram 1G --heat none -o " + (f.dir / "nodir/p.plan") + " 2>&1", &out), 1) << out;
  EXPECT_EQ(out, "coli-place: " + (f.dir / "nodir/p.plan") + ": " + (f.dir / "nodir") + " is not a directory (-o writes into an existing one)\n");
  EXPECT_EQ(run_command(bin("coli-run") + " -m " + f.model + " --device cpu --prompt-ids 1,2 -n 2 --heat none --seed -1 2>&1", &out), 2) << out;
  EXPECT_EQ(out.rfind("coli-run: --seed: '-1' is not a seed from 0 to 18446744073709551615", 0), 0u) << out;
  EXPECT_EQ(coli::parse_seed("18446744073709551615", "--seed"), UINT64_MAX);
  EXPECT_EQ(coli::parse_seed("0", "--seed"), 0u);
  for (const char* bad : {"-1", "18446744073709551616", "", " 1", "+1", "1e3", "0x10"}) EXPECT_THROW(coli::parse_seed(bad, "--seed"), coli::UsageError) << bad;
}

// P14: coli-pin start --gpu on a machine without a usable GPU names the
// flag and why, before a keeper loads (it used to end with CUDA's own
// "driver version is insufficient").
TEST(HostileInput, PinGpuWithoutAGpuSaysSo) {
  std::string why;
  if (coli::cuda::device_count(&why) > 0) GTEST_SKIP() << "a usable GPU: --gpu works here";
  Files f;
  std::string out;
  EXPECT_EQ(run_command(bin("coli-pin") + " start -m " + f.model + " --gpu --heat none 2>&1", &out), 1) << out;
  EXPECT_EQ(out, "coli-pin: --gpu: no usable CUDA device (" + why + ")\n");
}

// C07: a test's own error (here a depth beyond the model's context) is on
// stderr, once however many configurations hit it, not only in the
// records (stderr used to say only "N record(s) failed").
TEST(HostileInput, BenchSaysEachFailureOnce) {
  Files f;
  std::string out;
  EXPECT_EQ(run_command(bin("coli-bench") + " -m " + f.model + " --device cpu -t 1,1 -r 1 -p 8 -n 0 -d 99999999 --heat none 2>&1 >/dev/null", &out), 1) << out;
  const std::string cause = "coli-bench: " + f.model + ": depth 99999999 + prompt 8 + generation 0 tokens exceed the model's context of 4096";
  EXPECT_EQ(out.rfind(cause, 0), 0u) << out;
  EXPECT_EQ(count_of(out, "exceed the model's context"), 1) << out;
  EXPECT_NE(out.find("coli-bench: 2 record(s) failed"), std::string::npos) << out;
}
