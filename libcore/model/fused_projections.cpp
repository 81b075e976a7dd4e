#include "model/fused_projections.h"

#include <string>

#include "util/error.h"

namespace coli {

bool is_split_projection(TensorRole role) {
  return role == TensorRole::kInProjQkv || role == TensorRole::kInProjZ || role == TensorRole::kInProjB || role == TensorRole::kInProjA;
}

FusedRow fused_row(const ModelSpec& s, TensorRole role, int64_t r) {
  const int64_t nk = s.linear_num_key_heads, dk = s.linear_key_head_dim, dv = s.linear_value_head_dim;
  const int64_t rr = s.linear_num_value_heads / nk, P = 2 * dk + 2 * rr * dv;
  auto bad = [&] { return Error("fused projections: row " + std::to_string(r) + " is outside its projection (internal)"); };
  if (r < 0) throw bad();
  switch (role) {
    case TensorRole::kInProjQkv: {
      if (r < nk * dk) return {false, r / dk * P + r % dk};                     // q of group r / dk
      if (r < 2 * nk * dk) return {false, (r - nk * dk) / dk * P + dk + r % dk};  // k
      const int64_t v = r - 2 * nk * dk;                                         // v: group v / (r dv)
      if (v >= nk * rr * dv) throw bad();
      return {false, v / (rr * dv) * P + 2 * dk + v % (rr * dv)};
    }
    case TensorRole::kInProjZ:
      if (r >= nk * rr * dv) throw bad();
      return {false, r / (rr * dv) * P + 2 * dk + rr * dv + r % (rr * dv)};
    case TensorRole::kInProjB:
      if (r >= nk * rr) throw bad();
      return {true, r / rr * 2 * rr + r % rr};
    case TensorRole::kInProjA:
      if (r >= nk * rr) throw bad();
      return {true, r / rr * 2 * rr + rr + r % rr};
    default: throw Error("fused projections: not a split DeltaNet projection (internal)");
  }
}

std::vector<int64_t> fused_qkvz_shape(const ModelSpec& s) {
  const int64_t nk = s.linear_num_key_heads, rr = s.linear_num_value_heads / nk;
  return {nk * (2 * int64_t(s.linear_key_head_dim) + 2 * rr * s.linear_value_head_dim), s.hidden_size};
}

std::vector<int64_t> fused_ba_shape(const ModelSpec& s) { return {2 * int64_t(s.linear_num_value_heads), s.hidden_size}; }

}  // namespace coli
