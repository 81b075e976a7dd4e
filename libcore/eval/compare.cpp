#include "eval/compare.h"

#include <cmath>
#include <random>

#include "model/layer_tensors.h"
#include "util/error.h"

namespace coli {

namespace {

void add_matrix_error(const Matrix& a, const Matrix& b, double* num, double* den) {
  std::vector<float> ra(a.cols), rb(b.cols);
  for (int64_t r = 0; r < a.rows; ++r) {
    a.row_f32(r, ra.data());
    b.row_f32(r, rb.data());
    for (int64_t c = 0; c < a.cols; ++c) {
      *num += double(ra[c] - rb[c]) * (ra[c] - rb[c]);
      *den += double(ra[c]) * ra[c];
    }
  }
}

}  // namespace

double weights_rel_rmse(const Model& a, const Model& b) {
  double num = 0, den = 0;
  for (const TensorDesc& t : tensors_of(a))
    if (t.form == TensorForm::kMatrix) add_matrix_error(matrix_of(a, t), matrix_of(b, t), &num, &den);
  return den > 0 ? std::sqrt(num / den) : 0;
}

CompareResult compare_outputs(Engine& ea, Engine& eb, const std::vector<std::vector<int>>& seqs) {
  if (ea.spec().vocab_size != eb.spec().vocab_size || ea.spec().num_layers != eb.spec().num_layers)
    throw Error("compare: the models have different shapes");
  const int V = ea.spec().vocab_size;
  CompareResult r;
  double kl_sum = 0;
  int agree = 0;
  for (const auto& seq : seqs) {
    Session sa = ea.new_session(), sb = eb.new_session();
    const auto la = ea.forward_all(sa, seq), lb = eb.forward_all(sb, seq);
    for (std::size_t t = 0; t < seq.size(); ++t) {
      const float* p = la.data() + t * V;
      const float* q = lb.data() + t * V;
      double mp = p[0], mq = q[0];
      int ap = 0, aq = 0;
      for (int i = 0; i < V; ++i) {
        if (p[i] > p[ap]) ap = i;
        if (q[i] > q[aq]) aq = i;
        r.max_abs_logit = std::max(r.max_abs_logit, double(std::fabs(p[i] - q[i])));
        mp = std::max(mp, double(p[i]));
        mq = std::max(mq, double(q[i]));
      }
      double zp = 0, zq = 0;
      for (int i = 0; i < V; ++i) zp += std::exp(p[i] - mp), zq += std::exp(q[i] - mq);
      const double lzp = mp + std::log(zp), lzq = mq + std::log(zq);
      double kl = 0;
      for (int i = 0; i < V; ++i) {
        const double lp = p[i] - lzp, lq = q[i] - lzq;
        kl += std::exp(lp) * (lp - lq);
      }
      kl = std::max(0.0, kl);
      kl_sum += kl;
      r.max_kl = std::max(r.max_kl, kl);
      agree += ap == aq;
      ++r.positions;
    }
  }
  r.mean_kl = r.positions ? kl_sum / r.positions : 0;
  r.top1_agree = r.positions ? double(agree) / r.positions : 0;
  return r;
}

std::vector<std::vector<int>> random_sequences(int count, int length, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> d(0, vocab - 1);
  std::vector<std::vector<int>> out(count, std::vector<int>(length));
  for (auto& s : out)
    for (auto& t : s) t = d(rng);
  return out;
}

double format_rel_rmse(QuantFormat f, int n, double* bpw) {
  std::mt19937 rng(12345);
  std::normal_distribution<float> nd;
  std::vector<float> w(static_cast<std::size_t>(n) * n), row(n);
  for (auto& v : w) v = nd(rng);
  std::vector<uint8_t> q(layout_of(f, n, n).total);
  quantize_matrix(f, w.data(), n, n, q.data());
  double num = 0, den = 0;
  for (int r = 0; r < n; ++r) {
    dequantize_row(f, q.data(), n, n, r, row.data());
    for (int c = 0; c < n; ++c) {
      const double d = row[c] - w[static_cast<std::size_t>(r) * n + c];
      num += d * d;
      den += double(w[static_cast<std::size_t>(r) * n + c]) * w[static_cast<std::size_t>(r) * n + c];
    }
  }
  if (bpw) *bpw = 8.0 * q.size() / (double(n) * n);
  return std::sqrt(num / den);
}

}  // namespace coli
