// One Gated DeltaNet recurrent step for one value head, in place:
//   S <- decay * S;  delta = beta * (v - S^T k);  S <- S + k delta^T;  o = S^T q
// S is [dk, dv] row-major. Two passes over S (the decay is folded into the
// first). gdn_head_step_ref is the plain four-pass loop, kept as the
// reference the vector version is tested against.
#pragma once

namespace coli::cpu {

void gdn_head_step(float* S, const float* q, const float* k, const float* v, float beta, float decay, int dk, int dv, float* o);
void gdn_head_step_ref(float* S, const float* q, const float* k, const float* v, float beta, float decay, int dk, int dv, float* o);

}  // namespace coli::cpu
