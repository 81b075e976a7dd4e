#include "formats/container.h"

#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include "util/error.h"
#include "util/mapped_file.h"

namespace coli {

using nlohmann::json;

std::string hex64(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

namespace {

uint64_t parse_hex64(const json& j, const std::string& where) {
  if (!j.is_string() || j.get<std::string>().size() != 16) throw Error(where + " is not a 16-digit hex string");
  uint64_t v = 0;
  for (char c : j.get<std::string>()) {
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) throw Error(where + " is not a 16-digit hex string");
    v = v << 4 | static_cast<uint64_t>(d);
  }
  return v;
}

uint64_t need_u64(const json& o, const char* key, const std::string& where) {
  auto it = o.find(key);
  if (it == o.end() || !it->is_number_unsigned()) throw Error(where + ": '" + key + "' is missing or not a non-negative integer");
  return it->get<uint64_t>();
}

BlobPart parse_part(const json& p, const std::string& where) {
  if (!p.is_object()) throw Error(where + ": not an object");
  BlobPart part;
  if (!p.contains("name") || !p["name"].is_string()) throw Error(where + ": no name");
  part.name = p["name"].get<std::string>();
  if (!p.contains("format") || !p["format"].is_string() || !parse_format(p["format"].get<std::string>(), &part.format) ||
      part.format == QuantFormat::FP8_E4M3_B128)
    throw Error(where + " ('" + part.name + "'): unknown format");
  if (!p.contains("shape") || !p["shape"].is_array() || p["shape"].empty() || p["shape"].size() > 4)
    throw Error(where + " ('" + part.name + "'): bad shape");
  uint64_t numel = 1;
  for (const auto& d : p["shape"]) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() == 0 || d.get<uint64_t>() > (1ull << 32)) throw Error(where + " ('" + part.name + "'): bad shape");
    part.shape.push_back(d.get<int64_t>());
    numel *= d.get<uint64_t>();
    if (numel > (1ull << 40)) throw Error(where + " ('" + part.name + "'): shape too large");
  }
  part.offset = need_u64(p, "offset", where + " ('" + part.name + "')");
  part.bytes = need_u64(p, "bytes", where + " ('" + part.name + "')");
  // Matrices are [rows, cols]; anything else is stored as one row.
  const int64_t cols = part.shape.back();
  const int64_t rows = static_cast<int64_t>(numel) / cols;
  if (part.shape.size() != 2 && format_info(part.format).quantized) throw Error(where + " ('" + part.name + "'): quantized tensors must be 2-D");
  if (layout_of(part.format, rows, cols).total != part.bytes)
    throw Error(where + " ('" + part.name + "'): " + std::to_string(part.bytes) + " bytes do not match its format and shape");
  return part;
}

}  // namespace

Manifest parse_manifest(std::string_view text, uint64_t data_end, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(where + ": corrupt manifest: " + e.what());
  }
  if (!j.is_object()) throw Error(where + ": corrupt manifest: not an object");
  Manifest m;
  if (!j.contains("version") || !j["version"].is_number_unsigned()) throw Error(where + ": manifest has no version");
  m.version = j["version"].get<uint32_t>();
  if (m.version != kContainerVersion)
    throw Error(where + ": manifest layout version " + std::to_string(m.version) + "; this build reads version " + std::to_string(kContainerVersion));
  if (!j.contains("fingerprint")) throw Error(where + ": manifest has no fingerprint");
  m.fingerprint = parse_hex64(j["fingerprint"], where + ": fingerprint");
  if (!j.contains("config") || !j["config"].is_object()) throw Error(where + ": manifest has no model config");
  m.config = j["config"];
  m.settings = j.value("settings", json::object());
  if (!j.contains("blobs") || !j["blobs"].is_array()) throw Error(where + ": manifest has no blobs");
  for (std::size_t i = 0; i < j["blobs"].size(); ++i) {
    const json& b = j["blobs"][i];
    const std::string at = where + ": blob " + std::to_string(i);
    if (!b.is_object() || !b.contains("kind") || !b["kind"].is_string()) throw Error(at + ": no kind");
    Blob blob;
    blob.kind = b["kind"].get<std::string>();
    blob.offset = need_u64(b, "offset", at);
    blob.bytes = need_u64(b, "bytes", at);
    if (!b.contains("xxh64")) throw Error(at + ": no xxh64");
    blob.xxh64 = parse_hex64(b["xxh64"], at + ": xxh64");
    if (blob.offset % kBlobAlign || blob.offset < kContainerHeaderBytes) throw Error(at + ": offset " + std::to_string(blob.offset) + " is not a 4 KiB-aligned data offset");
    if (blob.bytes > data_end || blob.offset > data_end - blob.bytes)
      throw Error(at + ": [" + std::to_string(blob.offset) + ", +" + std::to_string(blob.bytes) + ") lies outside the data (truncated?)");
    if (blob.kind == "file") {
      if (!b.contains("name") || !b["name"].is_string()) throw Error(at + ": file without a name");
      blob.file_name = b["name"].get<std::string>();
    } else if (blob.kind == "tensor" || blob.kind == "expert") {
      if (blob.kind == "expert") {
        blob.layer = static_cast<int>(need_u64(b, "layer", at));
        blob.expert = static_cast<int>(need_u64(b, "expert", at));
      }
      if (!b.contains("parts") || !b["parts"].is_array() || b["parts"].empty() || b["parts"].size() > 3) throw Error(at + ": bad parts");
      for (std::size_t k = 0; k < b["parts"].size(); ++k) {
        BlobPart p = parse_part(b["parts"][k], at + " part " + std::to_string(k));
        if (p.offset < blob.offset || p.bytes > blob.bytes || p.offset - blob.offset > blob.bytes - p.bytes)
          throw Error(at + " part '" + p.name + "' lies outside its blob");
        if ((p.offset - blob.offset) % 64) throw Error(at + " part '" + p.name + "' is not 64-byte aligned");
        blob.parts.push_back(std::move(p));
      }
    } else {
      throw Error(at + ": unknown kind '" + blob.kind + "'");
    }
    m.blobs.push_back(std::move(blob));
  }
  return m;
}

json manifest_to_json(const Manifest& m) {
  json j = {{"format", "coli-container"}, {"version", m.version}, {"fingerprint", hex64(m.fingerprint)}, {"config", m.config}, {"settings", m.settings}};
  json blobs = json::array();
  for (const auto& b : m.blobs) {
    json jb = {{"kind", b.kind}, {"offset", b.offset}, {"bytes", b.bytes}, {"xxh64", hex64(b.xxh64)}};
    if (b.kind == "expert") {
      jb["layer"] = b.layer;
      jb["expert"] = b.expert;
    }
    if (b.kind == "file") jb["name"] = b.file_name;
    if (!b.parts.empty()) {
      jb["parts"] = json::array();
      for (const auto& p : b.parts)
        jb["parts"].push_back({{"name", p.name}, {"format", format_name(p.format)}, {"shape", p.shape}, {"offset", p.offset}, {"bytes", p.bytes}});
    }
    blobs.push_back(std::move(jb));
  }
  j["blobs"] = std::move(blobs);
  return j;
}

ContainerHeader read_container_header(const uint8_t* bytes, std::size_t size, const std::string& where) {
  if (size < kContainerHeaderBytes) throw Error(where + ": truncated container (" + std::to_string(size) + " bytes, no header)");
  ContainerHeader h;
  std::memcpy(&h, bytes, sizeof h);
  if (std::memcmp(h.magic, "COLICNT1", 8) != 0) throw Error(where + ": not a coli container (bad magic)");
  if (h.version != kContainerVersion)
    throw Error(where + ": container layout version " + std::to_string(h.version) + "; this build reads version " + std::to_string(kContainerVersion));
  if (h.header_bytes != kContainerHeaderBytes) throw Error(where + ": corrupt container header (header size)");
  if (h.file_bytes != size)
    throw Error(where + ": " + (size < h.file_bytes ? "truncated container" : "container has trailing bytes") + ": " + std::to_string(size) + " bytes, header says " +
                std::to_string(h.file_bytes));
  if (h.manifest_offset < kContainerHeaderBytes || h.manifest_offset > size || h.manifest_bytes > size - h.manifest_offset)
    throw Error(where + ": corrupt container header (manifest outside the file)");
  if (XXH64(bytes + h.manifest_offset, h.manifest_bytes, 0) != h.manifest_xxh64) throw Error(where + ": corrupt container: manifest checksum mismatch");
  return h;
}

namespace {
// Opens `path`, saying what it is when it is not a container file.
std::unique_ptr<MappedFile> open_container_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw Error(path + ": is a directory; expected a coli container file (" +
                (std::filesystem::exists(std::filesystem::path(path) / "config.json", ec) ? "this is a checkpoint directory: convert it with coli-convert"
                                                                                          : "made by coli-convert") +
                ")");
  return std::make_unique<MappedFile>(path);
}
}  // namespace

Container::Container(const std::string& path, std::optional<uint64_t> expect) : path_(path), file_(open_container_file(path)) {
  if (file_->size() == 0) throw Error(path + ": truncated container (0 bytes, no header)");
  const ContainerHeader h = read_container_header(base(), file_->size(), path);
  manifest_ = parse_manifest(std::string_view(reinterpret_cast<const char*>(base()) + h.manifest_offset, h.manifest_bytes), h.manifest_offset, path);
  if (manifest_.fingerprint != h.fingerprint) throw Error(path + ": corrupt container: header and manifest fingerprints differ");
  if (expect && *expect != manifest_.fingerprint)
    throw Error(path + ": fingerprint " + hex64(manifest_.fingerprint) + " does not match the expected " + hex64(*expect) +
                " (another source checkpoint or other conversion settings)");
  for (const auto& b : manifest_.blobs)
    for (const auto& p : b.parts) {
      SourceTensor t;
      t.name = p.name;
      t.format = p.format;
      t.shape = p.shape;
      t.data = base() + p.offset;
      t.nbytes = p.bytes;
      t.file = path;
      if (!tensors_.emplace(p.name, std::move(t)).second) throw Error(path + ": manifest lists tensor '" + p.name + "' twice");
    }
}

Container::~Container() = default;

const SourceTensor* Container::find(const std::string& name) {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> Container::names() const {
  std::vector<std::string> v;
  for (const auto& kv : tensors_) v.push_back(kv.first);
  return v;
}

std::optional<std::string_view> Container::file(const std::string& name) const {
  for (const auto& b : manifest_.blobs)
    if (b.kind == "file" && b.file_name == name) return std::string_view(reinterpret_cast<const char*>(base()) + b.offset, b.bytes);
  return std::nullopt;
}

std::string blob_description(const Blob& b) {
  if (b.kind == "expert") return "expert " + std::to_string(b.expert) + " of layer " + std::to_string(b.layer);
  if (b.kind == "file") return "file " + b.file_name;
  return "tensor '" + (b.parts.empty() ? std::string() : b.parts[0].name) + "'";
}

void Container::verify_checksums(const std::function<void(uint64_t, uint64_t)>& progress) const {
  uint64_t total = 0, done = 0;
  for (const auto& b : manifest_.blobs) total += b.bytes;
  for (std::size_t i = 0; i < manifest_.blobs.size(); ++i) {
    const Blob& b = manifest_.blobs[i];
    if (XXH64(base() + b.offset, b.bytes, 0) != b.xxh64) throw Error(path_ + ": corrupt container: checksum mismatch in " + blob_description(b));
    done += b.bytes;
    if (progress) progress(done, total);
  }
}

}  // namespace coli
