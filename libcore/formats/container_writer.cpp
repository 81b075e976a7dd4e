#include "formats/container_writer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>

#include "util/error.h"
#include "util/parallel.h"

namespace coli {

namespace {
uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }
std::size_t part_bytes(const PartSpec& p) {
  int64_t numel = 1;
  for (auto d : p.shape) numel *= d;
  return layout_of(p.format, numel / p.shape.back(), p.shape.back()).total;
}
}  // namespace

ContainerWriter::ContainerWriter(std::string out_path, bool overwrite, bool named_temp)
    : out_(std::move(out_path)), file_(out_, overwrite, named_temp) {}

ContainerWriter::~ContainerWriter() {
  if (map_) ::munmap(map_, data_end_);
}

uint64_t ContainerWriter::place(uint64_t bytes) {
  const uint64_t off = align_up(data_end_, kBlobAlign);
  data_end_ = off + bytes;
  return off;
}

int ContainerWriter::add_tensor(const PartSpec& p) { return add_expert(-1, -1, {p}); }

int ContainerWriter::add_expert(int layer, int expert, const std::vector<PartSpec>& parts) {
  Blob b;
  b.kind = layer < 0 ? "tensor" : "expert";
  b.layer = layer;
  b.expert = expert;
  uint64_t rel = 0;
  for (const auto& p : parts) {
    rel = align_up(rel, 64);
    b.parts.push_back(BlobPart{p.name, p.format, p.shape, rel, part_bytes(p)});
    rel += b.parts.back().bytes;
  }
  b.bytes = rel;
  b.offset = place(rel);
  for (auto& p : b.parts) p.offset += b.offset;
  m_.blobs.push_back(std::move(b));
  files_.emplace_back();
  return static_cast<int>(m_.blobs.size() - 1);
}

int ContainerWriter::add_file(const std::string& name, std::string bytes) {
  Blob b;
  b.kind = "file";
  b.file_name = name;
  b.bytes = bytes.size();
  b.offset = place(bytes.size());
  m_.blobs.push_back(std::move(b));
  files_.push_back(std::move(bytes));
  return static_cast<int>(m_.blobs.size() - 1);
}

void ContainerWriter::allocate() {
  data_end_ = align_up(data_end_, kBlobAlign);
  // Stores into a mapping of a sparse file die of SIGBUS when the disk
  // fills: allocate every byte first, so a full disk is an error here.
  reserve_space(file_.fd(), out_, data_end_);
  void* p = ::mmap(nullptr, data_end_, PROT_READ | PROT_WRITE, MAP_SHARED, file_.fd(), 0);
  if (p == MAP_FAILED) throw Error(out_ + ": cannot mmap: " + std::strerror(errno));
  map_ = static_cast<uint8_t*>(p);
  for (std::size_t i = 0; i < files_.size(); ++i)
    if (m_.blobs[i].kind == "file") std::memcpy(map_ + m_.blobs[i].offset, files_[i].data(), files_[i].size());
}

uint8_t* ContainerWriter::part_data(int blob, int part) { return map_ + m_.blobs[blob].parts[part].offset; }

uint64_t ContainerWriter::finish(uint64_t fingerprint, const nlohmann::json& config, const nlohmann::json& settings, int threads) {
  parallel_for(m_.blobs.size(), threads, [&](std::size_t i) { m_.blobs[i].xxh64 = XXH64(map_ + m_.blobs[i].offset, m_.blobs[i].bytes, 0); });
  m_.version = kContainerVersion;
  m_.fingerprint = fingerprint;
  m_.config = config;
  m_.settings = settings;
  const std::string manifest = manifest_to_json(m_).dump();
  if (::munmap(map_, data_end_) != 0) throw Error(out_ + ": munmap failed: " + std::strerror(errno));
  map_ = nullptr;
  auto write_at = [&](const void* p, std::size_t n, uint64_t off) {
    const auto* c = static_cast<const uint8_t*>(p);
    while (n) {
      const ssize_t w = ::pwrite(file_.fd(), c, n, static_cast<off_t>(off));
      if (w < 0) throw Error(out_ + ": " + std::strerror(errno) + " (writing " + std::to_string(n) + " bytes at " + std::to_string(off) + ")");
      if (w == 0) throw Error(out_ + ": short write at " + std::to_string(off));
      c += w, n -= static_cast<std::size_t>(w), off += static_cast<uint64_t>(w);
    }
  };
  write_at(manifest.data(), manifest.size(), data_end_);
  ContainerHeader h{};
  std::memcpy(h.magic, "COLICNT1", 8);
  h.version = kContainerVersion;
  h.header_bytes = kContainerHeaderBytes;
  h.manifest_offset = data_end_;
  h.manifest_bytes = manifest.size();
  h.file_bytes = data_end_ + manifest.size();
  h.manifest_xxh64 = XXH64(manifest.data(), manifest.size(), 0);
  h.fingerprint = fingerprint;
  std::vector<uint8_t> head(kContainerHeaderBytes, 0);
  std::memcpy(head.data(), &h, sizeof h);
  write_at(head.data(), head.size(), 0);
  return file_.publish();
}

}  // namespace coli
