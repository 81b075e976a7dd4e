// ContainerWriter: lays out and writes a coli container atomically.
//
// Plan every blob first (add_tensor / add_expert / add_file), then
// allocate() maps a temporary file next to the target; threads fill the
// parts in place; finish() checksums the blobs, appends the manifest, writes
// the header, fsyncs and renames over the target. A writer destroyed before
// finish() removes its temporary file: a failed conversion leaves nothing.
#pragma once
#include <string>
#include <vector>

#include "formats/container.h"

namespace coli {

struct PartSpec {
  std::string name;
  QuantFormat format;
  std::vector<int64_t> shape;
};

class ContainerWriter {
 public:
  // Throws if out_path exists and !overwrite.
  ContainerWriter(std::string out_path, bool overwrite);
  ~ContainerWriter();
  ContainerWriter(const ContainerWriter&) = delete;
  ContainerWriter& operator=(const ContainerWriter&) = delete;

  int add_tensor(const PartSpec& p);
  int add_expert(int layer, int expert, const std::vector<PartSpec>& parts);
  int add_file(const std::string& name, std::string bytes);

  void allocate();
  uint8_t* part_data(int blob, int part);
  const Blob& blob(int i) const { return m_.blobs[i]; }
  std::size_t num_blobs() const { return m_.blobs.size(); }
  uint64_t data_bytes() const { return data_end_; }

  void finish(uint64_t fingerprint, const nlohmann::json& config, const nlohmann::json& settings, int threads);
  const std::string& path() const { return out_; }

 private:
  uint64_t place(uint64_t bytes);
  std::string out_, tmp_;
  Manifest m_;
  std::vector<std::string> files_;  // contents of file blobs, by blob index (empty otherwise)
  uint64_t data_end_ = kContainerHeaderBytes;
  int fd_ = -1;
  uint8_t* map_ = nullptr;
  bool done_ = false;
};

}  // namespace coli
