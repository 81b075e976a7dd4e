// MappedFile: a whole file mapped read-only for the object's lifetime.
// Open, stat and mmap failures throw coli::Error naming the path; an empty
// file maps to size() == 0 (callers say what an empty file means to them).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace coli {

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return static_cast<const uint8_t*>(map_); }
  std::size_t size() const { return size_; }

 private:
  void* map_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace coli
