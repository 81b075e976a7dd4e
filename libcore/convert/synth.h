// Synthetic Hugging Face checkpoints at real Qwen3.6-35B-A3B shapes (any
// number of layers), for speed benchmarks: safetensors shards + index,
// config.json (text-only Qwen3_5MoeForCausalLM layout, per-expert tensor
// names, bf16), generation_config.json and optionally tokenizer files.
// Or the same model straight into a coli container (write_synthetic_
// container), for a machine whose disk cannot hold the bf16 checkpoint (70
// GB at 40 layers): the values are generated as the conversion pipeline
// reads them, a few MB per thread, and the container is byte for byte the
// one converting the checkpoint with the same options gives (fingerprint,
// config and embedded files included).
//
// Weights follow transformers' init (normal(0, 0.02) projections and
// embeddings, zero-centred norms, ones for the gated norm, conv taps
// U(-0.5, 0.5), dt_bias 1, A_log = log U(0.5, 16)). Every value is a pure
// function of (seed, tensor, index): the output is identical for any thread
// count.
//
// routing_skew s > 0 biases every router so that expert popularity per layer
// follows a Zipf law of exponent s over a random per-layer ranking: hidden
// channel 0 carries a constant (64) that no layer writes to, so after the
// post-attention RMSNorm it is ~sqrt(hidden) for every token, and router row
// e gets -s*ln(rank_e)/sqrt(hidden) in that column: a per-expert logit bias
// of -s*ln(rank_e), the log of a Zipf weight. The other router columns are
// scaled so the token-dependent part of the logits stays O(1). Channel 0 is
// masked out of the mixers' and lm_head's inputs (norm weight -1).
#pragma once
#include <cstdint>
#include <string>

#include "convert/convert.h"

namespace coli {

struct SynthOptions {
  int layers = 8;
  uint64_t seed = 0;
  double routing_skew = 0.0;
  std::string tokenizer_dir;  // copy tokenizer files from here when set
  // Checkpoint only (a container takes these from its ConvertOptions).
  int threads = 0;
  bool overwrite = false;
  bool progress = false;
  uint64_t shard_bytes = 4ull << 30;
  // The family's layout (config.json, tensor names, norms): qwen3_5_moe,
  // qwen3_moe (attention only, no shared expert) or qwen3_next (fused
  // DeltaNet projections in the checkpoint). synth_shapes() gives its real
  // shapes.
  ModelFamily family = ModelFamily::kQwen35Moe;
  // With the multi-token-prediction module the released checkpoints carry
  // (mtp.*: fc, norms and one decoder layer with its own experts; config
  // mtp_num_hidden_layers 1). Off by default: benchmarks of the main model
  // stay comparable. Not for qwen3_moe.
  bool mtp = false;
  // Shapes (Qwen3.6-35B-A3B); tests shrink them (not on the command line).
  int vocab = 248320, hidden = 2048, experts = 256, top_k = 8, moe_inter = 512, shared_inter = 512;
  int heads = 16, kv_heads = 2, head_dim = 256, lin_k_heads = 16, lin_v_heads = 32, lin_k_dim = 128, lin_v_dim = 128, conv = 4;
};

// o with family f and that family's released shapes: Qwen3.6-35B-A3B
// (qwen3_5_moe), Qwen3-30B-A3B (qwen3_moe: 32 / 4 heads of 128, 128
// experts of 768, top-8, no shared expert), Qwen3-Next-80B-A3B (qwen3_next:
// 512 experts of 512, top-10, vocabulary 151,936). Layers, seed and the
// rest of o are kept.
SynthOptions synth_shapes(SynthOptions o, ModelFamily f);

struct SynthReport {
  uint64_t bytes = 0, params = 0;
  int shards = 0;
  double seconds = 0;
};

SynthReport write_synthetic_checkpoint(const std::string& out_dir, const SynthOptions& opt);

// The container converting write_synthetic_checkpoint(dir, so) with co would
// give, without the checkpoint. Threads, overwrite, progress and verify come
// from co; so's shard_bytes does not matter (shards are not in a container).
ConvertReport write_synthetic_container(const std::string& out_path, const SynthOptions& so, const ConvertOptions& co);

}  // namespace coli
