// Checkpoint -> coli container conversion.
//
// One pipeline (convert_input) serves every ConvertInput (convert_input.h):
// each tensor of the tensor table (model/layer_tensors.h) is read row range
// by row range as f32 and quantized to its class's format by a pool of
// threads writing straight into the mapped output; one blob per routed
// expert. A checkpoint is bound as a Model first (so every check of the
// loader applies: layouts, shapes, fp8 block scales); the synthetic model
// (synth.h) is generated as it is read. Tensor classes:
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

#include "convert/convert_input.h"
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

// out_path: a file, or a directory (OUT/model.coli). The manifest's
// settings record the source as the absolute checkpoint directory, except
// for a synthetic checkpoint (config.json has "coli_synthetic"), whose
// values its config fixes: "coli-convert synth", as write_synthetic_container
// records it, so both ways of making a synthetic container give one file.
ConvertReport convert_checkpoint(const std::string& src_dir, const std::string& out_path, const ConvertOptions& opt);

// The pipeline itself; label names the progress bar.
ConvertReport convert_input(const ConvertInput& in, const std::string& out_path, const ConvertOptions& opt, const std::string& label);

// The fingerprint a conversion of src_dir with these options gets: source
// config, tensor names, dtypes, shapes and sampled bytes, plus the settings.
uint64_t source_fingerprint(const std::string& src_dir, const std::string& settings);
// The same over any input: config text, then the samples sorted by name.
uint64_t source_fingerprint(const ConvertInput& in, const std::string& settings);

// The companion files a container embeds when its source has them.
extern const char* const kEmbeddedFiles[5];

// What the manifest records as the source of a synthetic model.
extern const char* const kSyntheticSourceName;

}  // namespace coli
