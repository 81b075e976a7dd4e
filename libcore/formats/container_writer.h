// ContainerWriter: lays out and writes a coli container atomically.
//
// Plan every blob first (add_tensor / add_expert / add_file), then
// allocate() reserves the whole data section on disk and maps it; threads
// fill the parts in place; finish() checksums the blobs, appends the
// manifest, writes the header, fsyncs and publishes the file (see
// util/publish.h: an unnamed temporary linked in at the end, never over an
// output that appeared meanwhile, and with overwrite only over a regular
// file). A writer destroyed before finish() leaves nothing behind; a full
// disk is an error from allocate(), not a SIGBUS while filling.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "formats/container.h"
#include "util/publish.h"

namespace coli {

struct PartSpec {
  std::string name;
  QuantFormat format;
  std::vector<int64_t> shape;
};

class ContainerWriter {
 public:
  // Throws if out_path exists and !overwrite, or exists and is not a
  // regular file. named_temp: see OutputFile.
  ContainerWriter(std::string out_path, bool overwrite, bool named_temp = false);
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

  // Returns the size of the file this writer published.
  uint64_t finish(uint64_t fingerprint, const nlohmann::json& config, const nlohmann::json& settings, int threads);
  const std::string& path() const { return out_; }

 private:
  uint64_t place(uint64_t bytes);
  std::string out_;
  OutputFile file_;
  Manifest m_;
  std::vector<std::string> files_;  // contents of file blobs, by blob index (empty otherwise)
  uint64_t data_end_ = kContainerHeaderBytes;
  uint8_t* map_ = nullptr;
};

}  // namespace coli
