// The shared-memory weight mirror (mirror/mirror.h, mirror/mirror_load.h):
// a run bound through a mirror computes exactly what the container alone
// computes, budgets keep the hottest experts, and every segment that is not
// a ready mirror of this container (corrupt, loading, foreign, stale) is
// refused or reported, never read. Segments get per-test names; each test
// removes what it made.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "engine_util.h"
#include "mirror/mirror.h"
#include "mirror/mirror_load.h"
#include "util/error.h"

namespace {

using namespace coli;

// A segment name unique to this process and call; removed on scope exit.
struct Segment {
  std::string name;
  explicit Segment(const char* tag) : name(std::string("coli-test-") + std::to_string(::getpid()) + "-" + tag) { remove_mirror(name); }
  ~Segment() { remove_mirror(name); }
};

struct Fixture {
  test::TempDir dir;
  std::string path;
  std::shared_ptr<Container> c;
  explicit Fixture(QuantFormat f = QuantFormat::I8) : path(dir / "m.coli") {
    test::convert_all(test::data_dir() + "/tiny-qwen35moe-text", path, f);
    c = std::make_shared<Container>(path);
  }
};

std::unique_ptr<Model> bind_through(const Fixture& fx, std::shared_ptr<MirrorAttachment> m) {
  return Model::bind_container(*fx.c, mirrored_source(fx.c, std::move(m)), fx.path);
}

bool inside(const void* p, const MirrorAttachment& m) {
  const auto* b = static_cast<const uint8_t*>(p);
  return b >= m.base() && b < m.base() + m.size();
}

int dead_pid() {
  const pid_t p = ::fork();
  if (p == 0) ::_exit(0);
  ::waitpid(p, nullptr, 0);
  return p;
}

}  // namespace

TEST(Mirror, ARunThroughTheMirrorComputesTheSameLogits) {
  Fixture fx;
  Segment seg("same");
  MirrorBuildOptions o;
  o.name = seg.name, o.trunk = true;
  uint64_t last = 0, total = 0;
  o.progress = [&](uint64_t d, uint64_t t) { last = std::max(last, d), total = t; };
  MirrorBuilder b(*fx.c, fx.path, o);
  b.fill();
  EXPECT_EQ(last, total) << "progress reaches the total";
  auto m = std::make_shared<MirrorAttachment>(seg.name, *fx.c);
  auto plain = Model::load(fx.path);
  const ModelSpec& s = plain->spec();
  EXPECT_EQ(m->header().expert_blobs, static_cast<uint64_t>(s.num_layers) * s.num_experts);
  EXPECT_GT(m->header().trunk_blobs, 0u);
  auto mirrored = bind_through(fx, m);
  EXPECT_TRUE(inside(mirrored->layer(1).moe.experts[3].down.data, *m)) << "experts are read from the segment";
  EXPECT_TRUE(inside(mirrored->embed().data, *m)) << "--trunk: the trunk too";
  cpu::CpuBackend a(*plain, {2, true}), bb(*mirrored, {2, true});
  Engine ea(s, a, 64), eb(s, bb, 64);
  for (const auto& p : test::tiny_goldens()["prompts"]) {
    Session sa = ea.new_session(), sb = eb.new_session();
    EXPECT_EQ(ea.forward(sa, p["ids"].get<std::vector<int>>()), eb.forward(sb, p["ids"].get<std::vector<int>>())) << "bit for bit";
  }
}

TEST(Mirror, ABudgetKeepsTheHottestExperts) {
  Fixture fx;
  Segment seg("budget");
  const Manifest& mf = fx.c->manifest();
  std::vector<uint32_t> experts;
  uint32_t L = 0, E = 0;
  for (uint32_t i = 0; i < mf.blobs.size(); ++i)
    if (mf.blobs[i].kind == "expert") experts.push_back(i), L = std::max<uint32_t>(L, mf.blobs[i].layer + 1), E = std::max<uint32_t>(E, mf.blobs[i].expert + 1);
  // Heat on three experts; a budget for exactly three blobs.
  MirrorBuildOptions o;
  o.name = seg.name;
  o.heat.assign(std::size_t(L) * E, 0);
  const uint32_t hot[3] = {experts[5], experts[17], experts.back()};
  for (int k = 0; k < 3; ++k) o.heat[std::size_t(mf.blobs[hot[k]].layer) * E + mf.blobs[hot[k]].expert] = 100 - k;
  o.budget = 3 * ((mf.blobs[experts[0]].bytes + 4095) / 4096 * 4096);
  MirrorBuilder b(*fx.c, fx.path, o);
  b.fill();
  MirrorAttachment m(seg.name, *fx.c);
  EXPECT_EQ(m.header().expert_blobs, 3u);
  EXPECT_EQ(m.header().trunk_blobs, 0u);
  for (uint32_t i : hot) EXPECT_NE(m.blob(i), nullptr) << "blob " << i;
  EXPECT_EQ(m.blob(experts[0]), nullptr);
  // The bytes are the container's.
  EXPECT_EQ(std::memcmp(m.blob(hot[1]), fx.c->base() + mf.blobs[hot[1]].offset, mf.blobs[hot[1]].bytes), 0);
  // The rest of the model still comes from the container.
  auto model = bind_through(fx, std::make_shared<MirrorAttachment>(seg.name, *fx.c));
  const auto& e0 = model->layer(mf.blobs[experts[0]].layer).moe.experts[mf.blobs[experts[0]].expert];
  EXPECT_EQ(e0.gate.data, fx.c->base() + mf.blobs[experts[0]].parts[0].offset);
}

TEST(Mirror, SegmentsAreTheOwnersOnly) {
  Fixture fx;
  for (bool group : {false, true}) {
    Segment seg(group ? "perm-g" : "perm");
    MirrorBuildOptions o;
    o.name = seg.name, o.group = group;
    MirrorBuilder b(*fx.c, fx.path, o);
    struct stat st{};
    ASSERT_EQ(::stat(("/dev/shm/" + seg.name).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, group ? 0660u : 0600u);
    EXPECT_EQ(mirror_status(seg.name).mode, group ? 0660u : 0600u);
  }
}

TEST(Mirror, OnlyAReadyMirrorOfThisContainerAttaches) {
  Fixture fx, other(QuantFormat::I4_G32);
  Segment seg("states");
  MirrorBuildOptions o;
  o.name = seg.name;
  {
    MirrorBuilder b(*fx.c, fx.path, o);
    EXPECT_EQ(mirror_status(seg.name).state, "loading");
    try {
      MirrorAttachment m(seg.name, *fx.c);
      ADD_FAILURE() << "attached while loading";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("still loading"), std::string::npos) << e.what();
    }
    b.fill();
    EXPECT_EQ(mirror_status(seg.name).state, "ready");
    try {
      MirrorAttachment m(seg.name, *other.c);
      ADD_FAILURE() << "attached to another container";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("fingerprint"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(seg.name), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(mirror_status(seg.name).state.empty()) << "the owner removes it when it goes";
  try {
    MirrorAttachment m(seg.name, *fx.c);
    ADD_FAILURE() << "attached to nothing";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(seg.name), std::string::npos) << e.what();
  }
}

// kill -9 of the owner (here: an owner pid that no longer runs) leaves a
// stale segment: status says so and the next builder replaces it.
TEST(Mirror, AStaleSegmentIsReportedAndReplaced) {
  Fixture fx;
  Segment seg("stale");
  MirrorBuildOptions o;
  o.name = seg.name;
  {
    MirrorBuilder b(*fx.c, fx.path, o);  // killed during its load: never filled
    b.set_owner(dead_pid());
    b.release();
  }
  const MirrorStatus st = mirror_status(seg.name);
  EXPECT_EQ(st.state, "stale");
  EXPECT_FALSE(st.owner_alive);
  bool listed = false;
  for (const MirrorStatus& s : list_mirrors()) listed |= s.name == seg.name && s.state == "stale";
  EXPECT_TRUE(listed);
  MirrorBuilder again(*fx.c, fx.path, o);
  again.fill();
  EXPECT_EQ(mirror_status(seg.name).state, "ready");
  MirrorAttachment m(seg.name, *fx.c);
  // A live owner's segment is never taken over.
  try {
    MirrorBuilder third(*fx.c, fx.path, o);
    ADD_FAILURE() << "took over a live mirror";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already kept by pid"), std::string::npos) << e.what();
  }
}

TEST(Mirror, RunsAttachTogetherAndHeatAddsUp) {
  Fixture fx;
  Segment seg("runs");
  MirrorBuildOptions o;
  o.name = seg.name;
  MirrorBuilder b(*fx.c, fx.path, o);
  b.fill();
  auto m1 = std::make_unique<MirrorAttachment>(seg.name, *fx.c);
  auto m2 = std::make_unique<MirrorAttachment>(seg.name, *fx.c);
  EXPECT_EQ(mirror_status(seg.name).runs, 2);
  std::vector<uint64_t> h(m1->heat().size(), 0);
  h[0] = 3, h.back() = 5;
  m1->add_heat(h);
  m2->add_heat(h);
  EXPECT_EQ(m1->heat()[0], 6u);
  EXPECT_EQ(m2->heat().back(), 10u);
  EXPECT_EQ(mirror_status(seg.name).heat_total, 16u);
  m2.reset();
  EXPECT_EQ(mirror_status(seg.name).runs, 1);
  // Removed under a run: the run keeps reading its mapping.
  EXPECT_TRUE(remove_mirror(seg.name));
  const Blob& blob = fx.c->manifest().blobs[m1->entries()[0].blob];
  EXPECT_EQ(std::memcmp(m1->blob(m1->entries()[0].blob), fx.c->base() + blob.offset, blob.bytes), 0);
  EXPECT_THROW(m1->add_heat(std::vector<uint64_t>(3)), Error);
}

// Every field the parser bounds, broken one at a time in a copy of a real
// segment, is an Error naming the segment; the unbroken copy parses.
TEST(Mirror, CorruptHeadersAreRefused) {
  Fixture fx;
  Segment seg("corrupt");
  MirrorBuildOptions o;
  o.name = seg.name;
  MirrorBuilder b(*fx.c, fx.path, o);
  b.fill();
  const MirrorAttachment m(seg.name, *fx.c);
  const std::vector<uint8_t> good(m.base(), m.base() + m.size());
  EXPECT_NO_THROW(parse_mirror(good.data(), good.size(), "copy"));
  auto hdr = [](std::vector<uint8_t>& v) { return reinterpret_cast<MirrorHeader*>(v.data()); };
  auto entry0 = [&](std::vector<uint8_t>& v) { return reinterpret_cast<MirrorEntry*>(v.data() + hdr(v)->dir_offset); };
  const std::vector<std::pair<const char*, std::function<void(std::vector<uint8_t>&)>>> breaks = {
      {"magic", [&](auto& v) { hdr(v)->magic[0] = 'X'; }},
      {"version", [&](auto& v) { hdr(v)->layout_version = 99; }},
      {"size", [&](auto& v) { hdr(v)->segment_bytes = v.size() + 1; }},
      {"state", [&](auto& v) { hdr(v)->state.store(7); }},
      {"directory", [&](auto& v) { hdr(v)->dir_offset = v.size() - 8; }},
      {"count", [&](auto& v) { hdr(v)->dir_count = 1u << 30; }},
      {"heat", [&](auto& v) { hdr(v)->layers = 4000, hdr(v)->experts = 60000; }},
      {"data", [&](auto& v) { hdr(v)->data_bytes = ~0ull - 10; }},
      {"entry offset", [&](auto& v) { entry0(v)->offset = ~0ull - 4095; }},
      {"entry size", [&](auto& v) { entry0(v)->bytes = v.size(); }},
      {"entry repeated", [&](auto& v) { entry0(v)[1].blob = entry0(v)[0].blob; }},
      {"entry kind", [&](auto& v) { entry0(v)->kind = 9; }},
      {"path", [&](auto& v) { std::memset(hdr(v)->model_path, 'a', sizeof hdr(v)->model_path); }},
  };
  for (const auto& [what, fn] : breaks) {
    std::vector<uint8_t> bad = good;
    fn(bad);
    try {
      parse_mirror(bad.data(), bad.size(), "seg-x");
      ADD_FAILURE() << what << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("seg-x"), std::string::npos) << what << ": " << e.what();
    }
  }
  EXPECT_THROW(parse_mirror(good.data(), 100, "short"), Error);
  // A live segment corrupted in place: attaching fails, status says invalid.
  reinterpret_cast<MirrorHeader*>(const_cast<uint8_t*>(m.base()))->magic[1] = '?';
  EXPECT_THROW(MirrorAttachment(seg.name, *fx.c), Error);
  EXPECT_EQ(mirror_status(seg.name).state, "invalid");
}

TEST(Mirror, ToolsLoadThroughTheMirrorWhenOneIsReady) {
  Fixture fx;
  const std::string name = mirror_name(fx.c->fingerprint());
  remove_mirror(name);
  LoadedModel none = load_model(fx.path, "auto");
  EXPECT_EQ(none.mirror, nullptr);
  EXPECT_NE(none.note.find(name), std::string::npos) << none.note;
  EXPECT_THROW(load_model(fx.path, name), Error);
  EXPECT_THROW(load_model(fx.path, "bogus"), UsageError);
  EXPECT_THROW(load_model(test::data_dir() + "/tiny-qwen35moe-text", name), Error) << "a checkpoint has no mirror";
  {
    MirrorBuilder b(*fx.c, fx.path, MirrorBuildOptions{});
    b.fill();
    ASSERT_EQ(b.name(), name);
    LoadedModel lm = load_model(fx.path, "auto");
    ASSERT_NE(lm.mirror, nullptr);
    EXPECT_TRUE(inside(lm.model->layer(0).moe.experts[0].gate.data, *lm.mirror));
    EXPECT_EQ(load_model(fx.path, "off").mirror, nullptr);
    EXPECT_NE(load_model(fx.path, name).mirror, nullptr);
  }
  EXPECT_TRUE(mirror_status(name).state.empty());
}

// coli-run and coli-bench attach a ready mirror by default (--mirror auto)
// and print the same tokens as without it.
TEST(Mirror, ToolsGiveTheSameTokensThroughTheMirror) {
  Fixture fx;
  MirrorBuilder b(*fx.c, fx.path, MirrorBuildOptions{});
  b.fill();
  const std::string run = test::bin_dir() + "/coli-run -m " + fx.path + " --device cpu --heat none --prompt-ids 1,2,3,4 -n 8 --temp 0 --ignore-eos";
  std::string off, on;
  ASSERT_EQ(test::run_command(run + " --mirror off 2>/dev/null", &off), 0);
  ASSERT_EQ(test::run_command(run + " -v 2>&1 >/dev/null | grep 'coli-run: mirror'", &on), 0) << "-v names the mirror used";
  EXPECT_NE(on.find(b.name()), std::string::npos) << on;
  ASSERT_EQ(test::run_command(run + " 2>/dev/null", &on), 0);
  EXPECT_EQ(on, off);
  ASSERT_EQ(test::run_command(run + " --mirror " + b.name() + " 2>/dev/null", &on), 0);
  EXPECT_EQ(on, off);
  EXPECT_EQ(test::run_command(run + " --mirror coli-nonesuch 2>&1", &on), 1) << on;
  EXPECT_NE(on.find("coli-nonesuch"), std::string::npos) << on;
  EXPECT_EQ(test::run_command(run + " --mirror /etc 2>&1", &on), 2) << on;
  std::string rec;
  ASSERT_EQ(test::run_command(test::bin_dir() + "/coli-bench --device cpu -m " + fx.path + " -p 0 -n 4 -r 1 --heat none --progress -o jsonl 2>&1 >/dev/null", &rec), 0);
  EXPECT_NE(rec.find("weights from mirror " + b.name()), std::string::npos) << rec;
}

// Issue 29: a segment is made under a private name and published only with
// its header written. While a keeper pauses between the two (the
// before_publish hook), no status, list or coli-pin stop sees it, so a stop
// cannot remove it as "bad magic"; once published it is loading, with its
// owner.
TEST(Mirror, ASegmentIsInvisibleUntilItsHeaderIsWritten) {
  Fixture fx;
  Segment seg("publish");
  MirrorBuildOptions o;
  o.name = seg.name;
  bool paused = false;
  o.before_publish = [&](const std::string& priv) {
    paused = true;
    EXPECT_TRUE(mirror_status(seg.name).state.empty()) << "not under its name yet";
    for (const MirrorStatus& s : list_mirrors()) EXPECT_NE(s.name, seg.name);
    EXPECT_EQ(priv.rfind("." + seg.name + ".new-", 0), 0u) << priv;
    EXPECT_TRUE(std::filesystem::exists("/dev/shm/" + priv));
    std::string out;
    EXPECT_EQ(test::run_command(test::bin_dir() + "/coli-pin stop " + seg.name + " 2>&1", &out), 1) << out;
    EXPECT_NE(out.find("no mirror " + seg.name), std::string::npos) << out;
    EXPECT_TRUE(std::filesystem::exists("/dev/shm/" + priv)) << "the stop removed nothing";
  };
  MirrorBuilder b(*fx.c, fx.path, o);
  EXPECT_TRUE(paused);
  const MirrorStatus st = mirror_status(seg.name);
  EXPECT_EQ(st.state, "loading");
  EXPECT_TRUE(st.owner_alive);
  b.fill();
  EXPECT_EQ(mirror_status(seg.name).state, "ready");
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
    EXPECT_EQ(e.path().filename().string().find(".new-"), std::string::npos) << e.path() << ": a private name left behind";
}

// Two keepers of one name: the second to publish gets MirrorTaken and
// leaves the first's segment alone (and no private segment behind); a
// keeper whose segment was removed under it (the old stop race) never
// removes the segment another keeper has since published.
TEST(Mirror, AKeeperOnlyEverRemovesItsOwnSegment) {
  Fixture fx;
  Segment seg("identity");
  MirrorBuildOptions o;
  o.name = seg.name;
  std::unique_ptr<MirrorBuilder> first;
  MirrorBuildOptions racing = o;
  racing.before_publish = [&](const std::string&) { first = std::make_unique<MirrorBuilder>(*fx.c, fx.path, o); };
  EXPECT_THROW(MirrorBuilder(*fx.c, fx.path, racing), MirrorTaken);
  ASSERT_TRUE(first);
  EXPECT_EQ(mirror_status(seg.name).state, "loading") << "the first keeper's segment stays";
  // Removed under its keeper, then made again by another: the orphaned
  // keeper's exit leaves the new segment in place.
  ASSERT_TRUE(remove_mirror(seg.name));
  {
    MirrorBuilder second(*fx.c, fx.path, o);
    second.fill();
    first.reset();  // the orphan exits
    EXPECT_EQ(mirror_status(seg.name).state, "ready") << "the orphan removed another keeper's segment";
  }
  EXPECT_TRUE(mirror_status(seg.name).state.empty()) << "its own keeper removes it";
}

// One byte flipped in an expert blob of the container: the keeper's copy
// fails the blob's checksum and the mirror is refused, not served.
TEST(Mirror, ACorruptBlobIsNotServed) {
  Fixture fx;
  Segment seg("corrupt");
  const std::string bad = fx.dir / "bad.coli";
  std::filesystem::copy_file(fx.path, bad);
  uint64_t at = 0;
  for (const Blob& b : fx.c->manifest().blobs)
    if (b.kind == "expert" && b.layer == 1 && b.expert == 2) at = b.offset + b.bytes / 2;
  ASSERT_GT(at, 0u);
  {
    std::FILE* fp = std::fopen(bad.c_str(), "r+b");
    ASSERT_NE(fp, nullptr);
    std::fseek(fp, long(at), SEEK_SET);
    const int c = std::fgetc(fp);
    std::fseek(fp, long(at), SEEK_SET);
    std::fputc(c ^ 0x40, fp);
    std::fclose(fp);
  }
  const Container c(bad);  // the manifest is intact: opening does not read the blobs
  MirrorBuildOptions o;
  o.name = seg.name;
  MirrorBuilder b(c, bad, o);
  try {
    b.fill();
    ADD_FAILURE() << "a corrupt blob was served";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expert 2 of layer 1 fails its checksum"), std::string::npos) << e.what();
  }
  EXPECT_EQ(mirror_status(seg.name).state, "loading") << "never ready";
}
