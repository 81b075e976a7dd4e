#include "formats/container_writer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

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

ContainerWriter::ContainerWriter(std::string out_path, bool overwrite) : out_(std::move(out_path)) {
  if (std::filesystem::exists(out_) && !overwrite) throw Error(out_ + " exists; use --force to overwrite it");
  tmp_ = out_ + ".tmp." + std::to_string(::getpid());
}

ContainerWriter::~ContainerWriter() {
  if (map_) ::munmap(map_, data_end_);
  if (fd_ >= 0) ::close(fd_);
  if (!done_) std::filesystem::remove(tmp_);
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
  fd_ = ::open(tmp_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(tmp_ + ": cannot create: " + std::strerror(errno));
  if (::ftruncate(fd_, static_cast<off_t>(data_end_)) != 0) throw Error(tmp_ + ": cannot size to " + std::to_string(data_end_) + " bytes: " + std::strerror(errno));
  void* p = ::mmap(nullptr, data_end_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) throw Error(tmp_ + ": cannot mmap: " + std::strerror(errno));
  map_ = static_cast<uint8_t*>(p);
  for (std::size_t i = 0; i < files_.size(); ++i)
    if (m_.blobs[i].kind == "file") std::memcpy(map_ + m_.blobs[i].offset, files_[i].data(), files_[i].size());
}

uint8_t* ContainerWriter::part_data(int blob, int part) { return map_ + m_.blobs[blob].parts[part].offset; }

void ContainerWriter::finish(uint64_t fingerprint, const nlohmann::json& config, const nlohmann::json& settings, int threads) {
  parallel_for(m_.blobs.size(), threads, [&](std::size_t i) { m_.blobs[i].xxh64 = XXH64(map_ + m_.blobs[i].offset, m_.blobs[i].bytes, 0); });
  m_.version = kContainerVersion;
  m_.fingerprint = fingerprint;
  m_.config = config;
  m_.settings = settings;
  const std::string manifest = manifest_to_json(m_).dump();
  if (::munmap(map_, data_end_) != 0) throw Error(tmp_ + ": munmap failed");
  map_ = nullptr;
  auto write_at = [&](const void* p, std::size_t n, uint64_t off) {
    const auto* c = static_cast<const uint8_t*>(p);
    while (n) {
      const ssize_t w = ::pwrite(fd_, c, n, static_cast<off_t>(off));
      if (w <= 0) throw Error(tmp_ + ": write failed: " + std::strerror(errno));
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
  if (::fsync(fd_) != 0) throw Error(tmp_ + ": fsync failed: " + std::strerror(errno));
  ::close(fd_);
  fd_ = -1;
  std::filesystem::rename(tmp_, out_);
  done_ = true;
}

}  // namespace coli
