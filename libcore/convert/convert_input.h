// ConvertInput: what the conversion pipeline (convert.h) turns into a
// container. Two implementations: a Hugging Face checkpoint on disk
// (convert.cpp) and the synthetic model generated in memory (synth.h), so
// both go through one pipeline and a synthetic container is the same file
// however it was made.
//
// An input hands out values row range by row range, never whole tensors:
// the pipeline asks for at most a few MB per worker thread at a time, so
// an input that computes its values (synth) holds none of the model.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/layer_tensors.h"
#include "quant/format.h"

namespace coli {

// One source tensor as source_fingerprint samples it (convert.h).
struct FingerprintSample {
  std::string name;    // the source's (canonical for a text-only checkpoint)
  std::string format;  // format_name of its stored format
  std::string shape;   // shape_string
  std::string head, tail;  // its first and last min(256, bytes) bytes as stored
};

class ConvertInput {
 public:
  virtual ~ConvertInput() = default;
  // config.json's text, byte for byte (the fingerprint hashes it).
  virtual const std::string& config_text() const = 0;
  virtual const ModelSpec& spec() const = 0;
  // The table entries to convert, in container order (tensors_of).
  virtual std::vector<TensorDesc> tensors() const = 0;
  // The format entry t is stored in at the source (for byte counts).
  virtual QuantFormat source_format(const TensorDesc& t) const = 0;
  // Rows [r0, r1) of entry t as f32 into dst[(r1 - r0) * cols]; a vector
  // entry is one row of all its values. Called from many threads at once.
  virtual void rows_f32(const TensorDesc& t, int64_t r0, int64_t r1, float* dst) const = 0;
  // A companion file to embed (tokenizer.json, ...), if the source has it.
  virtual std::optional<std::string> file(const std::string& name) const = 0;
  // Every source tensor sampled for the fingerprint, in any order.
  virtual std::vector<FingerprintSample> fingerprint_samples() const = 0;
  // What the manifest's settings record as the source.
  virtual std::string source_name() const = 0;
  // For messages.
  virtual std::string where() const = 0;
};

}  // namespace coli
