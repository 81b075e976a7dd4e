// Scalar float32 kernels of the reference CPU path. Plain loops, written to
// read next to the model code; fast kernels live elsewhere and are tested
// against these.
#pragma once
#include <cmath>
#include <cstddef>

#include "model/weights.h"

namespace coli::cpu {

float dot(const float* a, const float* b, int n);

// y[t, r] = W[r, :] . x[t, :] for t < T (x rows of W.cols, y rows of W.rows).
// Each weight row is converted once and used for all T inputs.
void matmul(const Matrix& W, const float* x, int T, float* y);

// y = x * rsqrt(mean(x^2) + eps) * (1 + w)   (Qwen3.5's zero-centred RMSNorm)
void rms_norm_1p(const float* x, const float* w, int n, float eps, float* y);
// y = x * rsqrt(mean(x^2) + eps) * w         (the gated norm's plain weight)
void rms_norm(const float* x, const float* w, int n, float eps, float* y);
// x *= rsqrt(sum(x^2) + eps)
void l2_norm(float* x, int n, float eps);

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float silu(float x) { return x * sigmoid(x); }
// torch.nn.functional.softplus with beta 1, threshold 20.
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// In-place softmax over n values.
void softmax(float* x, int n);

// Rotary embedding (rotate-half convention) on the first rotary_dim values of
// one head vector, at position pos.
void rope(float* x, int rotary_dim, int pos, double theta);

}  // namespace coli::cpu
