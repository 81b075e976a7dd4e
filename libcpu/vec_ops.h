// Small vector operations on float arrays for the fast path (attention),
// AVX-512 where the CPU has it, plain loops otherwise.
#pragma once

namespace coli::cpu {

float vdot(const float* a, const float* b, int n);
// y += alpha * x
void vaxpy(float alpha, const float* x, float* y, int n);

}  // namespace coli::cpu
