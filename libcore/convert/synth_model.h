// SynthModel: the synthetic model SynthOptions describe (synth.h), as a
// plan rather than bytes: every tensor in seed order with its init, each
// value a pure function of (seed, tensor, index), and the config.json and
// generation_config.json texts. The checkpoint writer and the container
// input (synth.cpp) both read it, so a checkpoint and a container made with
// the same options hold the same values; neither ever needs the whole model
// in memory (fill() computes any range of any tensor on demand).
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "convert/synth.h"
#include "model/model_spec.h"

namespace coli {

class SynthModel {
 public:
  enum class Init { Normal, Zeros, Ones, Uniform, ALog, Router, Embed, NormMasked, OnesMasked };
  struct Tensor {
    std::string name;  // canonical
    std::vector<int64_t> shape;
    Init init;
    float a = 0, b = 0;      // std, or [a, b)
    bool zero_row0 = false;  // output projections: channel 0 of the residual is never written
    int layer = -1;
    uint64_t id = 0;  // its position in seed order: the RNG stream
    int64_t numel() const;
  };

  // Throws coli::Error naming the option (--layers, --routing-skew, --tokenizer).
  explicit SynthModel(const SynthOptions& opt);

  // In seed order, which is also the checkpoint's order.
  const std::vector<Tensor>& tensors() const { return plan_; }
  const Tensor* find(const std::string& name) const;
  // Values [i0, i0 + n) of t (row-major) as bf16. Thread-safe.
  void fill(const Tensor& t, int64_t i0, int64_t n, uint16_t* out) const;

  const std::string& config_text() const { return config_; }
  const std::string& generation_config_text() const { return generation_config_; }
  const SynthOptions& options() const { return opt_; }
  uint64_t params() const;

  // Copied from --tokenizer DIR when there.
  static const std::vector<std::string>& tokenizer_files();

 private:
  SynthOptions opt_;
  std::vector<Tensor> plan_;
  std::unordered_map<std::string, std::size_t> index_;
  std::vector<std::vector<int>> ranks_;  // per layer: expert -> Zipf rank (1-based)
  std::string config_, generation_config_;
};

}  // namespace coli
