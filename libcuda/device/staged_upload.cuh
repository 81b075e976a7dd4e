// StagedUploader: the weights' host -> device copies, pipelined. Sources
// are pageable memory (the container's mapping in the page cache, or a
// coli-pin mirror), which a plain cudaMemcpy moves at about 8.6 GB/s on the
// H200 machine (one thread staging through the driver's buffer): here host
// threads copy 16 MiB pieces into a ring of pinned buffers while the copy
// engine moves the ones before (55 GB/s pinned).
//
// Contract: add() records a copy; its source must stay valid and unchanged
// and its destination unused until flush() returns, when every copy added
// has arrived. One thread calls add() and flush(); flush() uses `threads`
// host threads inside the call. Errors are coli::Errors naming the copy.
// A source inside a range given to add_pinned() (registered with the
// driver) is copied straight from there, without staging.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <utility>
#include <vector>

namespace coli::cuda::detail {

class StagedUploader {
 public:
  // piece: bytes per staging buffer (a ring of 8).
  StagedUploader(int threads, std::size_t piece);
  ~StagedUploader();
  StagedUploader(const StagedUploader&) = delete;
  StagedUploader& operator=(const StagedUploader&) = delete;

  void add(void* dst, const void* src, std::size_t n);
  void add_pinned(const void* p, std::size_t n) { pinned_.push_back({p, n}); }
  // Host bytes [p, p + n) have a copy at dev on the device (a twin): copies
  // from inside it go device to device.
  void add_twin(const void* p, std::size_t n, const void* dev) { twin_ = {p, n, dev}; }
  void flush(cudaStream_t s);
  std::size_t pending_bytes() const { return pending_; }

 private:
  struct Copy {
    void* dst;
    const void* src;
    std::size_t n;
  };
  int threads_;
  std::size_t piece_;
  std::vector<std::pair<const void*, std::size_t>> pinned_;
  std::vector<Copy> copies_, direct_, device_;
  struct {
    const void* host = nullptr;
    std::size_t n = 0;
    const void* dev = nullptr;
  } twin_;
  std::size_t pending_ = 0;
};

}  // namespace coli::cuda::detail
