// Checkpoint -> coli container conversion.
//
// The source is bound as a Model first (so every check of the loader
// applies: layouts, shapes, fp8 block scales), then each tensor is
// dequantized row by row and quantized to its class's format by a pool of
// threads writing straight into the mapped output, tensor by tensor of the
// tensor table (model/layer_tensors.h). Tensor classes:
//   experts   routed experts' gate and up      (default int4-g64)
//   down      routed experts' down             (default: as experts)
//   shared    shared expert                    (default: as trunk)
//   trunk     attention, Gated DeltaNet projections (default int8)
//   router    mlp.gate                         (default bf16)
//   lm_head   output projection                (default int8)
//   embed     token embeddings                 (default bf16)
// Norms, conv taps, A_log, dt_bias and the shared-expert gate stay f32.
#pragma once
#include <cstdint>
#include <string>

#include "model/layer_tensors.h"
#include "quant/format.h"

namespace coli {

struct ConvertOptions {
  QuantFormat experts = QuantFormat::I4_G64;
  QuantFormat down = QuantFormat::I4_G64;
  QuantFormat shared = QuantFormat::I8;
  QuantFormat trunk = QuantFormat::I8;
  QuantFormat router = QuantFormat::BF16;
  QuantFormat lm_head = QuantFormat::I8;
  QuantFormat embed = QuantFormat::BF16;
  int threads = 0;  // 0: all cores
  bool overwrite = false;
  bool verify = true;
  bool progress = false;
  std::string settings_string() const;
  // The format tensors of class c are stored in.
  QuantFormat format_of(TensorClass c) const;
};

struct ConvertReport {
  std::string out;
  uint64_t fingerprint = 0;
  uint64_t bytes_in = 0, bytes_out = 0;
  double seconds = 0, verify_seconds = 0;
  std::size_t blobs = 0;
};

ConvertReport convert_checkpoint(const std::string& src_dir, const std::string& out_path, const ConvertOptions& opt);

// The fingerprint a conversion of src_dir with these options gets: source
// config, tensor names, dtypes, shapes and sampled bytes, plus the settings.
uint64_t source_fingerprint(const std::string& src_dir, const std::string& settings);

}  // namespace coli
