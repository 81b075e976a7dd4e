#include "mirror/mirror.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <xxhash.h>
#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <set>

#include "util/error.h"
#include "util/parallel.h"
#include "util/publish.h"

namespace coli {

namespace bip = boost::interprocess;

namespace {

constexpr char kMagic[8] = {'C', 'O', 'L', 'I', 'M', 'I', 'R', '1'};
constexpr std::size_t kBlobAlignment = 4096;

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// a + b <= limit without overflow.
bool fits(uint64_t a, uint64_t b, uint64_t limit) { return a <= limit && b <= limit - a; }

// A process that runs: signal 0 reaches it and it is not a zombie (a
// killed owner its parent has not reaped yet is gone for our purposes).
bool pid_alive(int pid) {
  if (pid <= 0 || (::kill(pid, 0) != 0 && errno != EPERM)) return false;
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (!f) return true;  // no /proc: trust the signal
  char buf[512];
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char* close = std::strrchr(buf, ')');  // "pid (comm) S ...": comm may hold spaces
  return !(close && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X'));
}

void check_name(const std::string& name) {
  if (name.empty() || name.size() > 200 || name.find('/') != std::string::npos || name[0] == '.')
    throw UsageError("mirror name '" + name + "': want a plain name such as coli-0123456789abcdef");
}

uint64_t heat_bytes(const MirrorHeader& h) { return uint64_t(h.layers) * h.experts * sizeof(uint64_t); }

// Where a POSIX shared-memory object of that name lives (Linux: tmpfs).
std::string shm_path(const std::string& name) { return "/dev/shm/" + name; }

// Segment NAME opened without blocking and only if it is a regular file:
// anyone can make /dev/shm/coli-NAME a FIFO (whose open would wait for a
// writer forever), a directory or a symbolic link, and none of them is a
// segment. lstat first names what the entry is; O_NONBLOCK and the fstat
// after the open cover an entry swapped in between. Returns the fd, with
// *st filled; -1 with *what empty when it cannot be opened (errno: ENOENT
// when absent); -1 with *what set ("a FIFO", ...) when the entry is there
// but is no segment.
int open_segment(const std::string& name, int flags, struct stat* st, std::string* what) {
  what->clear();
  if (::lstat(shm_path(name).c_str(), st) != 0) return -1;
  if (!S_ISREG(st->st_mode)) {
    *what = file_type_name(st->st_mode);
    return -1;
  }
  const int fd = ::shm_open(("/" + name).c_str(), flags | O_NONBLOCK | O_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (::fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
    const int e = errno;
    *what = file_type_name(st->st_mode);
    ::close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

std::string not_a_segment(const std::string& name, const std::string& what) {
  return shm_path(name) + " is " + what + ", not a shared-memory segment";
}

// A shared mapping of a whole segment, unmapped and closed on scope exit.
struct SegmentMap {
  int fd = -1;
  void* addr = nullptr;
  std::size_t size = 0;
  SegmentMap() = default;
  SegmentMap(const SegmentMap&) = delete;
  SegmentMap& operator=(const SegmentMap&) = delete;
  ~SegmentMap() {
    if (addr) ::munmap(addr, size);
    if (fd >= 0) ::close(fd);
  }
  // Maps [0, size) of fd (a size of 0 maps nothing; parse_mirror refuses it).
  bool map(int prot) {
    if (size == 0) return true;
    void* p = ::mmap(nullptr, size, prot, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return false;
    addr = p;
    return true;
  }
  const uint8_t* bytes() const { return static_cast<const uint8_t*>(addr); }
};

// Private segments of this name (.NAME.new-PID-N) whose maker is gone: a
// keeper killed while it sized its segment, before publishing it.
void sweep_private_leftovers(const std::string& name) {
  DIR* d = ::opendir("/dev/shm");
  if (!d) return;
  const std::string prefix = "." + name + ".new-";
  std::vector<std::string> gone;
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n.rfind(prefix, 0) != 0) continue;
    const int pid = std::atoi(n.c_str() + prefix.size());
    if (pid > 0 && !pid_alive(pid)) gone.push_back(n);
  }
  ::closedir(d);
  for (const std::string& n : gone) bip::shared_memory_object::remove(n.c_str());
}

// The private segment takes the mirror's name, never replacing one:
// renameat2(RENAME_NOREPLACE), or link + unlink where the file system
// lacks it. EEXIST: another keeper published first (MirrorTaken).
void publish_segment(const std::string& priv, const std::string& name) {
  const std::string from = shm_path(priv), to = shm_path(name);
  int rc = ::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE);
  if (rc != 0 && (errno == EINVAL || errno == ENOSYS)) {
    rc = ::link(from.c_str(), to.c_str());
    if (rc == 0) ::unlink(from.c_str());
  }
  if (rc == 0) return;
  const int e = errno;
  ::unlink(from.c_str());
  if (e == EEXIST) throw MirrorTaken(name + ": another keeper published it first");
  throw Error(name + ": cannot publish the segment (" + to + "): " + std::strerror(e));
}

}  // namespace

std::string mirror_name(uint64_t fingerprint) { return "coli-" + hex64(fingerprint); }

MirrorLayout parse_mirror(const uint8_t* bytes, std::size_t size, const std::string& where) {
  auto bad = [&](const std::string& why) { return Error(where + ": not a usable coli mirror: " + why); };
  if (size < kMirrorHeaderBytes) throw bad("segment of " + std::to_string(size) + " bytes, shorter than its header");
  const auto* h = reinterpret_cast<const MirrorHeader*>(bytes);
  if (std::memcmp(h->magic, kMagic, sizeof kMagic) != 0) throw bad("bad magic");
  if (h->layout_version != kMirrorLayoutVersion)
    throw bad("layout version " + std::to_string(h->layout_version) + ", this build reads " + std::to_string(kMirrorLayoutVersion));
  if (h->header_bytes != kMirrorHeaderBytes) throw bad("header of " + std::to_string(h->header_bytes) + " bytes");
  if (h->segment_bytes > size || h->segment_bytes < kMirrorHeaderBytes)
    throw bad("says " + std::to_string(h->segment_bytes) + " bytes, the segment has " + std::to_string(size));
  const uint64_t end = h->segment_bytes;
  const uint32_t st = h->state.load(std::memory_order_acquire);
  if (st != uint32_t(MirrorState::kLoading) && st != uint32_t(MirrorState::kReady)) throw bad("state " + std::to_string(st));
  if (std::memchr(h->model_path, 0, sizeof h->model_path) == nullptr) throw bad("model path not terminated");
  const uint32_t twin = h->twin_state.load(std::memory_order_acquire);
  if (twin > 1) throw bad("device twin state " + std::to_string(twin));
  if (twin && (h->twin_device < 0 || h->twin_device > 1024)) throw bad("device twin on device " + std::to_string(h->twin_device));
  if (h->layers > 4096 || h->experts > 65536) throw bad("heat of " + std::to_string(h->layers) + " x " + std::to_string(h->experts));
  if (h->dir_count > (1u << 24)) throw bad(std::to_string(h->dir_count) + " directory entries");
  const uint64_t dir_bytes = uint64_t(h->dir_count) * sizeof(MirrorEntry);
  if (h->dir_offset < kMirrorHeaderBytes || h->dir_offset % 8 || !fits(h->dir_offset, dir_bytes, end)) throw bad("directory outside the segment");
  if (h->heat_offset < h->dir_offset + dir_bytes || h->heat_offset % 8 || !fits(h->heat_offset, heat_bytes(*h), end))
    throw bad("heat counters outside the segment or over the directory");
  if (h->data_offset < h->heat_offset + heat_bytes(*h) || h->data_offset % kBlobAlignment || !fits(h->data_offset, h->data_bytes, end))
    throw bad("data region outside the segment");
  MirrorLayout l;
  l.header = h;
  l.entries.resize(h->dir_count);
  if (dir_bytes) std::memcpy(l.entries.data(), bytes + h->dir_offset, dir_bytes);
  std::set<uint32_t> seen;
  uint64_t experts = 0, tensors = 0;
  for (std::size_t i = 0; i < l.entries.size(); ++i) {
    const MirrorEntry& e = l.entries[i];
    const std::string what = "entry " + std::to_string(i) + " (blob " + std::to_string(e.blob) + ")";
    if (e.kind > 1) throw bad(what + ": kind " + std::to_string(e.kind));
    if (e.offset < h->data_offset || e.offset % kBlobAlignment || !fits(e.offset, e.bytes, h->data_offset + h->data_bytes))
      throw bad(what + " outside the data region");
    if (!seen.insert(e.blob).second) throw bad(what + " repeated");
    (e.kind ? experts : tensors) += 1;
  }
  if (experts != h->expert_blobs || tensors != h->trunk_blobs) throw bad("blob counts disagree with the directory");
  return l;
}

// ---- MirrorBuilder ----

struct MirrorBuilder::Impl {
  const Container* c = nullptr;
  bip::shared_memory_object shm;
  bip::mapped_region region;
  MirrorHeader* h = nullptr;
  std::vector<MirrorEntry> entries;
  MirrorBuildOptions opt;
  bool locked = false;
};

MirrorBuilder::MirrorBuilder(const Container& c, const std::string& model_path, const MirrorBuildOptions& opt) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.c = &c, m.opt = opt;
  name_ = opt.name.empty() ? mirror_name(c.fingerprint()) : opt.name;
  check_name(name_);
  // An existing segment: refused while its owner lives, replaced when stale.
  const MirrorStatus old = mirror_status(name_);
  if (!old.state.empty()) {
    if (!old.segment) throw Error(name_ + ": " + old.error + "; remove it to keep this model (coli-pin stop leaves what is no mirror)");
    if (old.state == "invalid") throw Error(name_ + ": exists and is not a usable coli mirror (" + old.error + "); remove it with coli-pin stop " + name_);
    // MirrorTaken, as when the other keeper publishes first: a second start
    // that finds the first's segment already there waits for it (coli-pin's
    // keep) instead of failing.
    if (old.owner_alive) throw MirrorTaken(name_ + ": already kept by pid " + std::to_string(old.owner_pid) + " (" + old.state + ")");
    remove_mirror(name_);
  }
  const Manifest& mf = c.manifest();
  // The heat table: the main layers' experts (the MTP layer's, mtp.*, are
  // not in the runs' heat: they count 0 here).
  auto heated = [](const Blob& b) { return b.kind == "expert" && !(!b.parts.empty() && b.parts[0].name.rfind("mtp.", 0) == 0); };
  uint32_t layers = 0, experts = 0;
  for (const Blob& b : mf.blobs)
    if (heated(b)) layers = std::max<uint32_t>(layers, b.layer + 1), experts = std::max<uint32_t>(experts, b.expert + 1);
  auto heat_of = [&](const Blob& b) { return heated(b) ? opt.heat[std::size_t(b.layer) * experts + b.expert] : 0; };
  if (!opt.heat.empty() && opt.heat.size() != std::size_t(layers) * experts)
    throw Error(name_ + ": heat of " + std::to_string(opt.heat.size()) + " counts for " + std::to_string(std::size_t(layers) * experts) + " experts");
  // What goes in: the trunk's tensors when asked, then experts, hottest
  // first (ties: manifest order), while the budget lasts.
  std::vector<uint32_t> trunk, exp;
  for (uint32_t i = 0; i < mf.blobs.size(); ++i) {
    if (mf.blobs[i].kind == "tensor" && opt.trunk) trunk.push_back(i);
    if (mf.blobs[i].kind == "expert") exp.push_back(i);
  }
  if (!opt.heat.empty())
    std::stable_sort(exp.begin(), exp.end(), [&](uint32_t a, uint32_t b) {
      return heat_of(mf.blobs[a]) > heat_of(mf.blobs[b]);
    });
  uint64_t data = 0;
  std::vector<std::pair<uint32_t, uint32_t>> chosen;  // blob, kind
  for (uint32_t i : trunk) chosen.push_back({i, 0}), data += align_up(mf.blobs[i].bytes, kBlobAlignment);
  for (uint32_t i : exp) {
    const uint64_t b = align_up(mf.blobs[i].bytes, kBlobAlignment);
    if (opt.budget && data + b > opt.budget) break;
    chosen.push_back({i, 1}), data += b;
  }
  if (opt.budget && opt.trunk && data > opt.budget)
    throw Error(name_ + ": the trunk alone needs " + std::to_string(data) + " bytes, more than the budget of " + std::to_string(opt.budget));
  const uint64_t dir_offset = kMirrorHeaderBytes, dir_bytes = chosen.size() * sizeof(MirrorEntry);
  const uint64_t heat_offset = align_up(dir_offset + dir_bytes, 64), hbytes = uint64_t(layers) * experts * 8;
  const uint64_t data_offset = align_up(heat_offset + hbytes, kBlobAlignment), total = data_offset + data;
  // Made under a private name; published under name_ once its header is
  // written (publish_segment below).
  sweep_private_leftovers(name_);
  static std::atomic<unsigned> builders{0};
  const std::string priv = "." + name_ + ".new-" + std::to_string(::getpid()) + "-" + std::to_string(builders++);
  bip::shared_memory_object::remove(priv.c_str());  // a leftover of a killed process that had this pid
  try {
    m.shm = bip::shared_memory_object(bip::create_only, priv.c_str(), bip::read_write, bip::permissions(opt.group ? 0660 : 0600));
    ::fchmod(m.shm.get_mapping_handle().handle, opt.group ? 0660 : 0600);  // exactly, whatever the umask
    m.shm.truncate(static_cast<bip::offset_t>(total));
    // Reserve the pages now: a full /dev/shm is an error here, not a
    // SIGBUS in the middle of the copy.
    if (const int rc = ::posix_fallocate(m.shm.get_mapping_handle().handle, 0, static_cast<off_t>(total)); rc != 0)
      throw Error(name_ + ": cannot reserve " + std::to_string(total) + " bytes of shared memory (/dev/shm): " + std::strerror(rc));
    m.region = bip::mapped_region(m.shm, bip::read_write);
  } catch (const bip::interprocess_exception& e) {
    bip::shared_memory_object::remove(priv.c_str());
    throw Error(name_ + ": cannot make a shared-memory segment of " + std::to_string(total) + " bytes: " + e.what());
  } catch (const Error&) {
    bip::shared_memory_object::remove(priv.c_str());
    throw;
  }
  struct stat st {};
  if (::fstat(m.shm.get_mapping_handle().handle, &st) == 0) dev_ = uint64_t(st.st_dev), ino_ = uint64_t(st.st_ino);
  auto* base = static_cast<uint8_t*>(m.region.get_address());
  m.h = new (base) MirrorHeader{};
  std::memcpy(m.h->magic, kMagic, sizeof kMagic);
  m.h->layout_version = kMirrorLayoutVersion, m.h->header_bytes = kMirrorHeaderBytes;
  m.h->fingerprint = c.fingerprint();
  m.h->state.store(uint32_t(MirrorState::kLoading));
  m.h->owner_pid = ::getpid();
  m.h->segment_bytes = total;
  m.h->dir_offset = dir_offset, m.h->dir_count = static_cast<uint32_t>(chosen.size());
  m.h->layers = layers, m.h->experts = experts;
  m.h->flags = opt.trunk ? kMirrorTrunk : 0;
  m.h->heat_offset = heat_offset;
  m.h->data_offset = data_offset, m.h->data_bytes = data;
  m.h->created_unix = static_cast<uint64_t>(std::time(nullptr));
  std::snprintf(m.h->model_path, sizeof m.h->model_path, "%s", model_path.c_str());
  uint64_t at = data_offset;
  for (auto [i, kind] : chosen) {
    const Blob& b = mf.blobs[i];
    m.entries.push_back(MirrorEntry{i, kind, at, b.bytes, b.xxh64});
    (kind ? m.h->expert_blobs : m.h->trunk_blobs) += 1;
    at += align_up(b.bytes, kBlobAlignment);
  }
  if (dir_bytes) std::memcpy(base + dir_offset, m.entries.data(), dir_bytes);
  if (opt.before_publish) {
    try {
      opt.before_publish(priv);
    } catch (...) {
      bip::shared_memory_object::remove(priv.c_str());
      throw;
    }
  }
  publish_segment(priv, name_);
}

MirrorBuilder::~MirrorBuilder() {
  if (impl_ && impl_->locked) ::munlock(impl_->region.get_address(), impl_->region.get_size());
  // Only the segment this builder made: a stop that removed it (or a start
  // that replaced it) leaves another keeper's segment under the name.
  struct stat st {};
  if (remove_ && ::stat(shm_path(name_).c_str(), &st) == 0 && uint64_t(st.st_dev) == dev_ && uint64_t(st.st_ino) == ino_)
    bip::shared_memory_object::remove(name_.c_str());
}

void MirrorBuilder::fill() {
  Impl& m = *impl_;
  auto* base = static_cast<uint8_t*>(m.region.get_address());
  uint64_t total = 0;
  for (const MirrorEntry& e : m.entries) total += e.bytes;
  std::mutex progress_mu;  // progress() is called from one thread at a time
  // Pieces of at most 64 MiB, on every core: a page-cache copy runs at a
  // few GB/s per thread.
  constexpr uint64_t kPiece = 64ull << 20;
  std::vector<std::pair<std::size_t, uint64_t>> pieces;  // entry, offset in it
  for (std::size_t i = 0; i < m.entries.size(); ++i)
    for (uint64_t o = 0; o < m.entries[i].bytes; o += kPiece) pieces.push_back({i, o});
  std::atomic<uint64_t> done{0};
  const uint8_t* src = m.c->base();
  parallel_for(pieces.size(), default_threads(), [&](std::size_t k) {
    const auto [i, o] = pieces[k];
    const MirrorEntry& e = m.entries[i];
    const uint64_t n = std::min(kPiece, e.bytes - o);
    std::memcpy(base + e.offset + o, src + m.c->manifest().blobs[e.blob].offset + o, n);
    const uint64_t d = done.fetch_add(n) + n;
    if (m.opt.progress) {
      std::lock_guard<std::mutex> lock(progress_mu);
      m.opt.progress(d, total);
    }
  });
  // Every blob's checksum over the copy (the manifest's xxh64): a
  // container corrupted on disk is refused here, not served.
  std::atomic<std::size_t> bad{m.entries.size()};
  parallel_for(m.entries.size(), default_threads(), [&](std::size_t i) {
    const MirrorEntry& e = m.entries[i];
    if (XXH64(base + e.offset, e.bytes, 0) != e.xxh64) {
      std::size_t cur = bad.load();
      while (i < cur && !bad.compare_exchange_weak(cur, i)) {
      }
    }
  });
  if (const std::size_t i = bad.load(); i < m.entries.size()) {
    throw Error(name_ + ": the container's " + blob_description(m.c->manifest().blobs[m.entries[i].blob]) +
                " fails its checksum (corrupt container: coli-convert verify tells more); not served");
  }
  m.h->state.store(uint32_t(MirrorState::kReady), std::memory_order_release);
}

void MirrorBuilder::lock_pages() {
  Impl& m = *impl_;
  const uint64_t bytes = m.region.get_size();
  // mlock first: a process with CAP_IPC_LOCK is not bound by the limit.
  if (::mlock(m.region.get_address(), bytes) == 0) {
    m.locked = true;
    return;
  }
  const int err = errno;
  rlimit rl{};
  if ((err == ENOMEM || err == EPERM) && ::getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < bytes)
    throw Error(name_ + ": locking its " + std::to_string(bytes) + " bytes in RAM needs RLIMIT_MEMLOCK of at least that (now " + std::to_string(rl.rlim_cur) +
                "): run `ulimit -l unlimited` first (as root or with a raised hard limit), or set LimitMEMLOCK=infinity in the systemd unit");
  throw Error(name_ + ": mlock of " + std::to_string(bytes) + " bytes: " + std::strerror(err));
}

void MirrorBuilder::set_owner(int pid) { impl_->h->owner_pid = pid; }
const uint8_t* MirrorBuilder::data() const { return static_cast<const uint8_t*>(impl_->region.get_address()) + impl_->h->data_offset; }
void MirrorBuilder::set_twin(int device, const uint8_t (&handle)[64]) {
  impl_->h->twin_device = device;
  std::memcpy(impl_->h->twin_handle, handle, sizeof handle);
  impl_->h->twin_state.store(1, std::memory_order_release);
}
uint64_t MirrorBuilder::bytes() const { return impl_->region.get_size(); }
const MirrorHeader& MirrorBuilder::header() const { return *impl_->h; }

// ---- MirrorAttachment ----

bool MirrorAttachment::twin(const uint8_t** data, std::size_t* bytes, int* device, uint8_t (&handle)[64]) const {
  const MirrorHeader& h = *layout_.header;
  if (h.twin_state.load(std::memory_order_acquire) != 1) return false;
  *data = base_ + h.data_offset, *bytes = h.data_bytes, *device = h.twin_device;
  std::memcpy(handle, h.twin_handle, sizeof handle);
  return true;
}

struct MirrorAttachment::Impl {
  SegmentMap map;
};

MirrorAttachment::MirrorAttachment(const std::string& name, const Container& c) : impl_(std::make_unique<Impl>()), name_(name) {
  check_name(name);
  SegmentMap& m = impl_->map;
  struct stat st {};
  std::string what;
  m.fd = open_segment(name, O_RDWR, &st, &what);
  if (m.fd < 0 && !what.empty()) throw Error("mirror " + name + ": " + not_a_segment(name, what));
  if (m.fd < 0) throw Error("mirror " + name + ": cannot attach: " + std::strerror(errno));
  m.size = static_cast<std::size_t>(st.st_size);
  if (!m.map(PROT_READ | PROT_WRITE)) throw Error("mirror " + name + ": cannot attach: " + std::strerror(errno));
  base_ = static_cast<uint8_t*>(m.addr);
  size_ = m.size;
  layout_ = parse_mirror(base_, size_, "mirror " + name);
  const MirrorHeader& h = *layout_.header;
  if (h.fingerprint != c.fingerprint())
    throw Error("mirror " + name + ": holds fingerprint " + hex64(h.fingerprint) + ", " + c.where() + " has " + hex64(c.fingerprint()));
  if (h.state.load(std::memory_order_acquire) != uint32_t(MirrorState::kReady)) throw Error("mirror " + name + ": still loading");
  const std::vector<Blob>& blobs = c.manifest().blobs;
  by_blob_.assign(blobs.size(), nullptr);
  for (const MirrorEntry& e : layout_.entries) {
    if (e.blob >= blobs.size()) throw Error("mirror " + name + ": blob " + std::to_string(e.blob) + " is not in " + c.where());
    const Blob& b = blobs[e.blob];
    if (b.bytes != e.bytes || b.xxh64 != e.xxh64 || (b.kind == "expert") != (e.kind == 1))
      throw Error("mirror " + name + ": blob " + std::to_string(e.blob) + " differs from " + c.where() + "'s");
    by_blob_[e.blob] = base_ + e.offset;
  }
  // A run slot (status counts attached runs); slots of dead runs are reused.
  auto* hw = reinterpret_cast<MirrorHeader*>(base_);
  const int32_t me = ::getpid();
  for (int i = 0; i < kMirrorRunSlots && slot_ < 0; ++i) {
    int32_t cur = hw->runs[i].load();
    if ((cur == 0 || !pid_alive(cur)) && hw->runs[i].compare_exchange_strong(cur, me)) slot_ = i;
  }
}

MirrorAttachment::~MirrorAttachment() {
  if (slot_ >= 0) reinterpret_cast<MirrorHeader*>(base_)->runs[slot_].store(0);
}

const uint8_t* MirrorAttachment::blob(uint32_t i) const { return i < by_blob_.size() ? by_blob_[i] : nullptr; }

void MirrorAttachment::add_heat(const std::vector<uint64_t>& counts) {
  const MirrorHeader& h = *layout_.header;
  if (counts.size() != std::size_t(h.layers) * h.experts)
    throw Error("mirror " + name_ + ": heat of " + std::to_string(counts.size()) + " counts for " + std::to_string(std::size_t(h.layers) * h.experts));
  auto* c = reinterpret_cast<uint64_t*>(base_ + h.heat_offset);
  for (std::size_t i = 0; i < counts.size(); ++i)
    if (counts[i]) std::atomic_ref<uint64_t>(c[i]).fetch_add(counts[i], std::memory_order_relaxed);
}

std::vector<uint64_t> MirrorAttachment::heat() const {
  const MirrorHeader& h = *layout_.header;
  std::vector<uint64_t> out(std::size_t(h.layers) * h.experts);
  auto* c = reinterpret_cast<uint64_t*>(base_ + h.heat_offset);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = std::atomic_ref<uint64_t>(c[i]).load(std::memory_order_relaxed);
  return out;
}

// ---- a container served from a mirror ----

namespace {

class MirroredSource : public TensorSource {
 public:
  MirroredSource(std::shared_ptr<Container> c, std::shared_ptr<MirrorAttachment> m) : c_(std::move(c)), m_(std::move(m)) {
    const std::vector<Blob>& blobs = c_->manifest().blobs;
    for (uint32_t i = 0; i < blobs.size(); ++i)
      if (const uint8_t* p = m_->blob(i))
        for (const BlobPart& part : blobs[i].parts) at_[part.name] = p + (part.offset - blobs[i].offset);
  }
  const SourceTensor* find(const std::string& name) override {
    const SourceTensor* t = c_->find(name);
    if (!t) return nullptr;
    const auto it = at_.find(name);
    if (it == at_.end()) return t;
    auto [slot, fresh] = copies_.try_emplace(name, *t);
    if (fresh) slot->second.data = it->second;
    return &slot->second;
  }
  std::vector<std::string> names() const override { return c_->names(); }
  std::string where() const override { return c_->where(); }

 private:
  std::shared_ptr<Container> c_;
  std::shared_ptr<MirrorAttachment> m_;
  std::map<std::string, const uint8_t*> at_;
  std::map<std::string, SourceTensor> copies_;
};

}  // namespace

std::shared_ptr<TensorSource> mirrored_source(std::shared_ptr<Container> c, std::shared_ptr<MirrorAttachment> m) {
  return std::make_shared<MirroredSource>(std::move(c), std::move(m));
}

// ---- status ----

MirrorStatus mirror_status(const std::string& name) {
  MirrorStatus s;
  s.name = name;
  check_name(name);
  SegmentMap m;
  struct stat st {};
  std::string what;
  m.fd = open_segment(name, O_RDONLY, &st, &what);
  if (m.fd < 0 && what.empty()) return s;  // absent: state empty
  s.mode = st.st_mode & 07777;
  if (m.fd < 0) {  // listed, so that status shows it, but never opened, mapped or removed
    s.state = "invalid", s.segment = false, s.error = not_a_segment(name, what);
    return s;
  }
  s.bytes = static_cast<uint64_t>(st.st_size);
  if (s.bytes < kMirrorHeaderBytes) {
    s.state = "invalid", s.error = "segment of " + std::to_string(s.bytes) + " bytes";
    return s;
  }
  m.size = static_cast<std::size_t>(st.st_size);
  if (!m.map(PROT_READ)) {
    s.state = "invalid", s.error = std::string("cannot map it: ") + std::strerror(errno);
    return s;
  }
  try {
    const MirrorLayout l = parse_mirror(m.bytes(), m.size, name);
    const MirrorHeader& h = *l.header;
    s.fingerprint = h.fingerprint, s.model = h.model_path, s.owner_pid = h.owner_pid, s.owner_alive = pid_alive(h.owner_pid);
    s.expert_blobs = h.expert_blobs, s.trunk_blobs = h.trunk_blobs;
    for (int i = 0; i < kMirrorRunSlots; ++i) s.runs += pid_alive(h.runs[i].load());
    const auto* c = reinterpret_cast<const uint64_t*>(m.bytes() + h.heat_offset);
    for (uint64_t i = 0; i < uint64_t(h.layers) * h.experts; ++i) s.heat_total += c[i];
    s.state = !s.owner_alive ? "stale" : h.state.load() == uint32_t(MirrorState::kReady) ? "ready" : "loading";
  } catch (const std::exception& e) {
    s.state = "invalid", s.error = e.what();
  }
  return s;
}

std::vector<MirrorStatus> list_mirrors() {
  std::vector<MirrorStatus> out;
  DIR* d = ::opendir("/dev/shm");
  if (!d) return out;
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d))
    if (std::strncmp(e->d_name, "coli-", 5) == 0) names.push_back(e->d_name);
  ::closedir(d);
  std::sort(names.begin(), names.end());
  for (const std::string& n : names) {
    if (n.size() > 200) continue;  // not a name a mirror gets (check_name)
    MirrorStatus s = mirror_status(n);
    if (!s.state.empty()) out.push_back(std::move(s));
  }
  return out;
}

bool remove_mirror(const std::string& name) {
  check_name(name);
  // Only a segment: a FIFO or directory someone named like one is not a
  // mirror's to remove (false, errno EPERM).
  struct stat st {};
  if (::lstat(shm_path(name).c_str(), &st) != 0) return false;
  if (!S_ISREG(st.st_mode)) {
    errno = EPERM;
    return false;
  }
  return ::shm_unlink(("/" + name).c_str()) == 0;
}

}  // namespace coli
