#include "ref_kernels.h"

#include <algorithm>
#include <vector>

namespace coli::cpu {

float dot(const float* a, const float* b, int n) {
  // Eight partial sums: vectorisable and less rounding than one chain.
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += a[i + j] * b[i + j];
  float tail = 0;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7])) + tail;
}

void matmul(const Matrix& W, const float* x, int T, float* y) {
  const int cols = static_cast<int>(W.cols);
  std::vector<float> row(cols);
  for (int64_t r = 0; r < W.rows; ++r) {
    W.row_f32(r, row.data());
    for (int t = 0; t < T; ++t) y[static_cast<std::size_t>(t) * W.rows + r] = dot(row.data(), x + static_cast<std::size_t>(t) * cols, cols);
  }
}

static float inv_rms(const float* x, int n, float eps) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  return 1.0f / std::sqrt(static_cast<float>(ss / n) + eps);
}

void rms_norm_1p(const float* x, const float* w, int n, float eps, float* y) {
  const float r = inv_rms(x, n, eps);
  for (int i = 0; i < n; ++i) y[i] = x[i] * r * (1.0f + w[i]);
}

void rms_norm(const float* x, const float* w, int n, float eps, float* y) {
  const float r = inv_rms(x, n, eps);
  for (int i = 0; i < n; ++i) y[i] = x[i] * r * w[i];
}

void l2_norm(float* x, int n, float eps) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  const float r = 1.0f / std::sqrt(static_cast<float>(ss) + eps);
  for (int i = 0; i < n; ++i) x[i] *= r;
}

void softmax(float* x, int n) {
  const float m = *std::max_element(x, x + n);
  double sum = 0;
  for (int i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int i = 0; i < n; ++i) x[i] *= inv;
}

void rope(float* x, int rotary_dim, int pos, double theta) {
  const int half = rotary_dim / 2;
  for (int i = 0; i < half; ++i) {
    // Same float32 steps as the reference: inv_freq in f32, angle = pos * inv_freq in f32.
    const float inv_freq = static_cast<float>(1.0 / std::pow(theta, double(2 * i) / rotary_dim));
    const float angle = static_cast<float>(pos) * inv_freq;
    const float c = static_cast<float>(std::cos(double(angle))), s = static_cast<float>(std::sin(double(angle)));
    const float x1 = x[i], x2 = x[i + half];
    x[i] = x1 * c - x2 * s;
    x[i + half] = x2 * c + x1 * s;
  }
}

}  // namespace coli::cpu
