// qwen3_next's fused Gated DeltaNet input projections and qwen3_5_moe's
// split ones: the same rows in another order.
//
// A qwen3_next checkpoint stores linear_attn.in_proj_qkvz [nk P, H] and
// linear_attn.in_proj_ba [nk 2r, H], grouped per key head g (P = 2 dk +
// 2 r dv, r = nv / nk value heads a group): group g's q rows, k rows, its r
// value heads' v rows, their z rows; then b and a. qwen3_5_moe (and coli's
// tensor table, containers, backends) keep in_proj_qkv = [all q; all k; all
// v], in_proj_z, in_proj_b, in_proj_a. fused_row() says where a split row
// lives in the fused tensors (docs/design/qwen3-families.md, section 5):
// the binder copies checkpoint rows with it, the synthetic writer fills
// split rows from its fused plan with it.
#pragma once
#include <cstdint>
#include <vector>

#include "model/layer_tensors.h"
#include "model/model_spec.h"

namespace coli {

inline constexpr const char* kFusedQkvz = "linear_attn.in_proj_qkvz.weight";
inline constexpr const char* kFusedBa = "linear_attn.in_proj_ba.weight";

// Whether role is one of the four split projections a fused checkpoint
// stores in the two fused tensors.
bool is_split_projection(TensorRole role);

struct FusedRow {
  bool ba = false;  // in in_proj_ba (else in_proj_qkvz)
  int64_t row = 0;
};
// Row r of the split projection `role` (kInProjQkv, kInProjZ, kInProjB,
// kInProjA) of a spec with DeltaNet layers. Throws coli::Error for another
// role or a row out of range.
FusedRow fused_row(const ModelSpec& s, TensorRole role, int64_t r);

// The fused tensors' shapes: [nk P, H] and [nk 2r, H].
std::vector<int64_t> fused_qkvz_shape(const ModelSpec& s);
std::vector<int64_t> fused_ba_shape(const ModelSpec& s);

}  // namespace coli
