// The shared-memory weight mirror (coli-pin): a model's blobs copied once
// into a named POSIX shared-memory segment that every later run maps
// zero-copy, instead of reading (and on the GPU, staging) the container.
//
// Segment "coli-<16 hex digits of the container fingerprint>" (under
// /dev/shm on Linux), mode 0600 unless the creator asks for group access:
//
//   [0, 4096)             MirrorHeader: magic "COLIMIR1", layout version,
//                         fingerprint, state (loading | ready), owner pid,
//                         sizes and offsets of what follows, the slots of
//                         the runs attached now
//   [dir_offset, ...)     dir_count MirrorEntry: container blob index ->
//                         offset and size in the segment, and its xxh64
//   [heat_offset, ...)    layers x experts uint64 routing counts, which
//                         attached runs add to atomically
//   [data_offset, end)    the blobs, each 4 KiB aligned (DMA, huge pages)
//
// Contract: parse_mirror() validates every offset and size against the
// segment's size and the header's own fields, and an attacher checks every
// entry against its container (blob index, size, xxh64) before using it, so
// a corrupt or foreign segment is an Error naming it, never a bad read;
// an entry /dev/shm/coli-* that is not a regular file (a FIFO, directory,
// link) is checked without blocking and never opened as a segment. A
// segment whose magic, layout version or fingerprint differs is never used.
// The creator (MirrorBuilder) is the owner: it fills the segment, marks it
// ready last, and removes it when it stops; attached runs keep their mapping
// after that (POSIX unlink semantics).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "formats/container.h"
#include "util/error.h"

namespace coli {

constexpr uint32_t kMirrorLayoutVersion = 2;  // 2: the device twin's fields
constexpr std::size_t kMirrorHeaderBytes = 4096;
constexpr int kMirrorRunSlots = 64;

enum class MirrorState : uint32_t { kLoading = 0, kReady = 1 };

struct MirrorHeader {
  char magic[8];              // "COLIMIR1"
  uint32_t layout_version;    // kMirrorLayoutVersion
  uint32_t header_bytes;      // kMirrorHeaderBytes
  uint64_t fingerprint;       // the container's
  std::atomic<uint32_t> state;  // MirrorState; ready is stored last (release)
  int32_t owner_pid;          // the process that made it and keeps it
  uint64_t segment_bytes;
  uint64_t dir_offset;
  uint32_t dir_count;
  uint32_t layers, experts;   // the heat counters' shape
  uint32_t flags;             // kMirrorTrunk: the non-expert tensors too
  uint64_t heat_offset;
  uint64_t data_offset, data_bytes;
  uint64_t created_unix;
  uint64_t expert_blobs, trunk_blobs;  // how many of each it holds
  char model_path[512];       // for status (NUL-terminated)
  std::atomic<int32_t> runs[kMirrorRunSlots];  // pids of attached runs (0: free)
  // coli-pin start --gpu: the keeper's device copy of the data region
  // [data_offset, data_offset + data_bytes), which runs map through CUDA
  // IPC. twin_state is stored last (release); the handle is opaque here
  // (a cudaIpcMemHandle_t).
  std::atomic<uint32_t> twin_state;  // 0 none, 1 ready
  int32_t twin_device;               // the CUDA device ordinal in the keeper
  uint8_t twin_handle[64];
};
static_assert(sizeof(MirrorHeader) <= kMirrorHeaderBytes);
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<int32_t>::is_always_lock_free);
constexpr uint32_t kMirrorTrunk = 1;

struct MirrorEntry {
  uint32_t blob;    // index into the container's manifest blobs
  uint32_t kind;    // 0 tensor, 1 expert
  uint64_t offset;  // from the segment start
  uint64_t bytes;
  uint64_t xxh64;   // the manifest's
};

// The segment name for a fingerprint: "coli-" and 16 lowercase hex digits.
std::string mirror_name(uint64_t fingerprint);

// Header and directory of a segment's bytes, validated (see the contract).
// Exposed for the fuzz target and tests.
struct MirrorLayout {
  const MirrorHeader* header = nullptr;
  std::vector<MirrorEntry> entries;
};
MirrorLayout parse_mirror(const uint8_t* bytes, std::size_t size, const std::string& where);

// What to put in a segment.
struct MirrorBuildOptions {
  std::string name;                 // empty: mirror_name(fingerprint)
  uint64_t budget = 0;              // bytes of blobs; 0: every expert
  bool trunk = false;               // the non-expert tensors too
  bool group = false;               // mode 0660 instead of 0600
  std::vector<uint64_t> heat;       // [layers * experts]: the hottest experts first under a budget
  std::function<void(uint64_t, uint64_t)> progress;  // (bytes copied, bytes in all)
  // Tests: called with the segment's private name after its header is
  // written and before it is published under its name.
  std::function<void(const std::string& private_name)> before_publish;
};

// Another keeper published the same name first (two starts at once).
class MirrorTaken : public Error {
 public:
  using Error::Error;
};

// Makes and fills a segment from a container; the maker is its owner.
// An existing segment of that name is MirrorTaken while its owner lives,
// an Error when it is invalid or no segment, and removed first when its
// owner is dead (stale). The segment is made under a private
// name (.NAME.new-PID-N, which no status, list or stop sees) and published
// under NAME only once its header says loading and names its owner, by a
// rename that never replaces a segment (MirrorTaken when another keeper
// published first): a segment under a mirror's name always has a header.
// The destructor removes the segment, unless release() was called, and
// only when the name still holds the segment this builder made (its
// inode): a keeper whose segment was removed never removes another's.
class MirrorBuilder {
 public:
  MirrorBuilder(const Container& c, const std::string& model_path, const MirrorBuildOptions& opt);
  ~MirrorBuilder();
  MirrorBuilder(const MirrorBuilder&) = delete;
  MirrorBuilder& operator=(const MirrorBuilder&) = delete;
  // Copies the blobs (progress as it goes), then marks the segment ready.
  // progress may throw to abandon the copy: fill() rethrows it and the
  // segment stays loading (the destructor removes it).
  void fill();
  // mlock()s the segment (before or after fill()); an Error naming
  // RLIMIT_MEMLOCK and the fix when the limit is what refused it.
  void lock_pages();
  void set_owner(int pid);  // after a fork: the daemon's pid
  // The data region (the blobs), and the device twin's handle once made.
  const uint8_t* data() const;
  void set_twin(int device, const uint8_t (&handle)[64]);
  const std::string& name() const { return name_; }
  uint64_t bytes() const;
  const MirrorHeader& header() const;
  void release() { remove_ = false; }  // leave the segment in place

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string name_;
  bool remove_ = true;
  uint64_t dev_ = 0, ino_ = 0;  // the segment made (the destructor's identity check)
};

// A ready segment attached read-write (the heat counters and the run slot
// are written; the blobs are only read). Detaches (and frees its run slot)
// when destroyed; the mapping stays valid until then even if the segment is
// removed meanwhile.
class MirrorAttachment {
 public:
  // Attaches NAME and checks it against c: magic, version, fingerprint,
  // ready, every entry's blob index, size and xxh64. Errors name NAME.
  MirrorAttachment(const std::string& name, const Container& c);
  ~MirrorAttachment();
  MirrorAttachment(const MirrorAttachment&) = delete;
  MirrorAttachment& operator=(const MirrorAttachment&) = delete;

  const std::string& name() const { return name_; }
  const MirrorHeader& header() const { return *layout_.header; }
  const std::vector<MirrorEntry>& entries() const { return layout_.entries; }
  // The mirrored bytes of container blob i, or null when not mirrored.
  const uint8_t* blob(uint32_t i) const;
  const uint8_t* base() const { return base_; }
  std::size_t size() const { return size_; }
  // The keeper's device copy of the data region (coli-pin start --gpu):
  // true, with the region and the IPC handle, when it is ready.
  bool twin(const uint8_t** data, std::size_t* bytes, int* device, uint8_t (&handle)[64]) const;
  // Adds routing counts [layers * experts] to the segment's heat.
  void add_heat(const std::vector<uint64_t>& counts);
  std::vector<uint64_t> heat() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string name_;
  uint8_t* base_ = nullptr;
  std::size_t size_ = 0;
  MirrorLayout layout_;
  std::vector<const uint8_t*> by_blob_;
  int slot_ = -1;
};

// A container whose mirrored blobs are served from an attachment: the
// TensorSource a model binds when a run uses a mirror. Keeps both alive.
std::shared_ptr<TensorSource> mirrored_source(std::shared_ptr<Container> c, std::shared_ptr<MirrorAttachment> m);

// Segments that look like coli mirrors (/dev/shm/coli-*), for status.
struct MirrorStatus {
  std::string name;
  std::string state;  // loading | ready | stale | invalid
  std::string model, error;
  uint64_t fingerprint = 0, bytes = 0, expert_blobs = 0, trunk_blobs = 0, heat_total = 0;
  int owner_pid = 0;
  bool owner_alive = false;
  int runs = 0;        // attached runs alive now
  unsigned mode = 0;   // permission bits
  // false: /dev/shm/NAME is no segment at all (a FIFO, a directory, a
  // symbolic link...: anyone can make one there). Its state is invalid and
  // error says what it is; it is never opened (a FIFO's open would block),
  // attached or removed.
  bool segment = true;
};
std::vector<MirrorStatus> list_mirrors();
// NAME's status; state empty when there is no such segment. An owner that
// is gone or a zombie makes a segment stale.
MirrorStatus mirror_status(const std::string& name);
// Removes segment NAME (attached runs keep their mapping). False if absent,
// or if NAME is no segment (errno EPERM: MirrorStatus::segment).
bool remove_mirror(const std::string& name);

}  // namespace coli
