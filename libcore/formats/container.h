// The coli container: one file, memory-mapped, zero-copy.
//
//   [0, 4096)        header: magic "COLICNT1", layout version, sizes, the
//                    manifest's offset, length and xxh64, the fingerprint
//   [4096, ...)      blobs, each 4 KiB aligned: tensors, one blob per routed
//                    expert holding its gate, up and down matrices (each part
//                    64-byte aligned), embedded files (tokenizer.json, ...)
//   [manifest, end)  JSON manifest: version, fingerprint, source and
//                    conversion settings, the model's config.json, and for
//                    every tensor / expert / file its format, shape, offset,
//                    length and xxh64.
//
// One read, one memcpy or one DMA moves an expert. Opening validates the
// header, the manifest checksum and every entry against the file size and
// its format's layout; verify_checksums() rereads every blob. Problems are
// coli::Errors naming the file (and entry). man/coli-container.5 has the
// byte layout.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "formats/tensor_source.h"
#include "util/mapped_file.h"

namespace coli {

constexpr uint32_t kContainerVersion = 1;
constexpr std::size_t kContainerHeaderBytes = 4096;
constexpr std::size_t kBlobAlign = 4096;

struct ContainerHeader {
  char magic[8];  // "COLICNT1"
  uint32_t version;
  uint32_t header_bytes;
  uint64_t file_bytes;
  uint64_t manifest_offset;
  uint64_t manifest_bytes;
  uint64_t manifest_xxh64;
  uint64_t fingerprint;
};

// One part of a blob: a matrix or vector in some format.
struct BlobPart {
  std::string name;  // canonical tensor name
  QuantFormat format = QuantFormat::F32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // from the file start
  uint64_t bytes = 0;
};

struct Blob {
  std::string kind;  // "tensor", "expert" or "file"
  uint64_t offset = 0, bytes = 0, xxh64 = 0;
  int layer = -1, expert = -1;  // experts
  std::string file_name;        // files
  std::vector<BlobPart> parts;  // tensors: one; experts: gate, up, down
};

// "expert E of layer L", "file NAME" or "tensor 'NAME'": a blob in messages.
std::string blob_description(const Blob& b);

struct Manifest {
  uint32_t version = 0;
  uint64_t fingerprint = 0;
  nlohmann::json config;    // the model's config.json
  nlohmann::json settings;  // conversion settings and source description
  std::vector<Blob> blobs;
};

// Validates a manifest's JSON against a data region ending at data_end.
// Exposed for the fuzz target and tests.
Manifest parse_manifest(std::string_view json_text, uint64_t data_end, const std::string& where);
nlohmann::json manifest_to_json(const Manifest& m);
std::string hex64(uint64_t v);

class Container : public TensorSource {
 public:
  // Maps and validates PATH. With expect_fingerprint, a container made from
  // another source or with other settings is refused.
  explicit Container(const std::string& path, std::optional<uint64_t> expect_fingerprint = std::nullopt);
  ~Container() override;
  Container(const Container&) = delete;
  Container& operator=(const Container&) = delete;

  const SourceTensor* find(const std::string& name) override;
  std::vector<std::string> names() const override;
  std::string where() const override { return path_; }

  const Manifest& manifest() const { return manifest_; }
  uint64_t fingerprint() const { return manifest_.fingerprint; }
  std::string config_json() const { return manifest_.config.dump(); }
  const uint8_t* base() const { return file_->data(); }
  // An embedded file (tokenizer.json, tokenizer_config.json), if present.
  std::optional<std::string_view> file(const std::string& name) const;
  // Rereads every blob and compares its xxh64; throws naming the first bad
  // one. progress(done_bytes, total_bytes) is called as it goes.
  void verify_checksums(const std::function<void(uint64_t, uint64_t)>& progress = {}) const;

 private:
  std::string path_;
  std::unique_ptr<MappedFile> file_;
  Manifest manifest_;
  std::map<std::string, SourceTensor> tensors_;
};

// Reads and checks just the header of a container file (tests, fuzzing).
ContainerHeader read_container_header(const uint8_t* bytes, std::size_t size, const std::string& where);

}  // namespace coli
