// Comparing a model with a reference on the same token sequences: the
// measured cost of quantization (llama.cpp's KL-divergence report, for us).
#pragma once
#include <cstdint>
#include <vector>

#include "engine/engine.h"
#include "model/weights.h"

namespace coli {

struct CompareResult {
  double mean_kl = 0, max_kl = 0;  // KL(reference || model), nats per token
  double top1_agree = 0;           // fraction of positions with the same argmax
  double max_abs_logit = 0;        // largest |logit difference|
  double weights_rel_rmse = 0;     // ||W - W_ref|| / ||W_ref|| over all matrices
  int positions = 0;
};

// Runs both engines over `sequences` (logits of every position) and compares;
// weights_rel_rmse is left 0 (see weights_rel_rmse()).
CompareResult compare_outputs(Engine& reference, Engine& model, const std::vector<std::vector<int>>& sequences);
// ||W - W_ref|| / ||W_ref|| over every matrix of the tensor table (embed,
// lm_head unless tied, projections, router, shared expert and its gate,
// routed experts) of two models of one shape.
double weights_rel_rmse(const Model& reference, const Model& model);

// Deterministic random token sequences for comparisons.
std::vector<std::vector<int>> random_sequences(int count, int length, int vocab, uint64_t seed);

// Relative RMS reconstruction error of format f on n x n N(0, 1) weights
// (deterministic), and the format's bits per weight at that size.
double format_rel_rmse(QuantFormat f, int n, double* bits_per_weight);

}  // namespace coli
