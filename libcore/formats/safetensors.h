// Read-only access to safetensors checkpoints, memory-mapped, zero-copy.
//
// Contract: opening validates the whole header before any tensor is handed
// out: header length within the file, JSON well-formed, every dtype known,
// every shape non-negative with a byte size that matches its data_offsets,
// and every [begin, end) inside the data section. Any violation throws
// coli::Error naming the file (and tensor). Tensors point into the mapping,
// which lives as long as the SafetensorsFile.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "formats/dtype.h"
#include "util/mapped_file.h"

namespace coli {

// "[2, 3]": a shape as error messages print it.
std::string shape_string(const std::vector<int64_t>& shape);

struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  std::size_t nbytes = 0;
  std::string file;  // which file holds it, for error messages

  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  std::string shape_str() const { return shape_string(shape); }
};

class SafetensorsFile {
 public:
  // Maps and validates `path`. Throws coli::Error.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // Parses and validates a header against a file of `file_size` bytes whose
  // first bytes are `bytes` (at least 8 + header length of them). Exposed for
  // the fuzz target and tests; `path` is used in messages only.
  static std::map<std::string, TensorView> parse(const std::string& path, const uint8_t* bytes,
                                                 std::size_t file_size);

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const TensorView* find(const std::string& name) const;

 private:
  std::string path_;
  std::unique_ptr<MappedFile> file_;
  std::map<std::string, TensorView> tensors_;
};

// A checkpoint directory: either model.safetensors.index.json with its shards
// or a single model.safetensors. Lookups go through the weight map.
class SafetensorsArchive {
 public:
  explicit SafetensorsArchive(const std::string& dir);

  const TensorView* find(const std::string& name) const;
  // Every tensor name in the checkpoint, sorted.
  std::vector<std::string> names() const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> index_;
};

}  // namespace coli
