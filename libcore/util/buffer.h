// Buffer<T>: a heap array that is not value-initialised on creation.
// Prefill temporaries (10-50 MB per layer) are written in full before they
// are read; zero-filling them first, as std::vector does, would be one more
// pass over memory on a single thread while all others wait.
#pragma once
#include <cstddef>
#include <memory>

namespace coli {

template <typename T>
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(std::size_t n) : p_(std::make_unique_for_overwrite<T[]>(n)), n_(n) {}
  T* data() { return p_.get(); }
  const T* data() const { return p_.get(); }
  std::size_t size() const { return n_; }
  T& operator[](std::size_t i) { return p_[i]; }
  const T& operator[](std::size_t i) const { return p_[i]; }
  T* begin() { return p_.get(); }
  T* end() { return p_.get() + n_; }
  const T* begin() const { return p_.get(); }
  const T* end() const { return p_.get() + n_; }

 private:
  std::unique_ptr<T[]> p_;
  std::size_t n_ = 0;
};

}  // namespace coli
