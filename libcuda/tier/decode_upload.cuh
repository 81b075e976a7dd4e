// ExpertTier::DecodeUpload: decode misses over PCIe
// (CudaOptions::decode_upload_max; decode_upload.cu). The handoff's host
// thread gives it up to k of a one-token layer's misses whose weights lie in
// pinned host memory; it copies them into k slots of its own and runs the
// routed-expert kernels on them on a stream of its own, writing one row
// the join adds. Lives inside the tier: reads its slot layout, tables and
// the last post's normed row.
#pragma once
#include <algorithm>
#include <vector>

#include "expert_tier.cuh"

namespace coli::cuda::detail {

class ExpertTier::DecodeUpload : public ExpertHandoff::DevicePart {
 public:
  explicit DecodeUpload(ExpertTier& tier);
  ~DecodeUpload() override;
  int take(int layer, ExpertPair* misses, int n) override;
  void wait() override;
  const float* out() const { return out_.get(); }
  bool any_pinned() const { return std::find(pinned_.begin(), pinned_.end(), uint8_t{1}) != pinned_.end(); }

 private:
  ExpertTier& t_;
  int k_ = 0;                      // slots
  std::vector<uint8_t> pinned_;    // [layers * experts]: the expert's parts are in pinned host memory
  DeviceArray<uint8_t> stage_;     // k slots
  DeviceArray<const uint8_t*> gate_, up_, down_;  // slot i's parts
  DeviceArray<int> idx_;           // 0 .. k-1
  DeviceArray<float> w_, act_, out_;
  DeviceArray<int8_t> codes_;
  DeviceArray<float> scale_;
  DeviceArray<int> sum_;
  float* h_w_ = nullptr;           // pinned weights of the taken misses
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
};

}  // namespace coli::cuda::detail
