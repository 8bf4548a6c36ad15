// Per-sample arithmetic of the metric update kernels, as host/device
// functions: the CPU executor (kernels/cpu/metrics.cpp) and the CUDA executor
// call the same code, so CPU tests check the arithmetic the GPU runs.
// Inputs arrive already decoded (float16/bfloat16 widened to float); the
// executors own loading, validation and where the counts go.
#pragma once

#include <cstdint>

#include "base/host_device.hpp"

namespace concord::metrics {

// Score order of argmax and top-k: NaN ranks above every number, as in
// torch.argmax, torch.topk and numpy.argmax, so a NaN score is never hidden
// behind a finite one.
template <typename T>
CONCORD_HD bool ranks_above(T a, T b) {
  return (a > b) | ((a != a) & (b == b));
}

// One step of a running argmax over classes seen in increasing order: the
// first of tied maxima wins (numpy and torch agree), because only a strictly
// higher-ranked score replaces the best. Branch-free, so loops vectorise.
template <typename T>
CONCORD_HD void argmax_step(T score, std::int32_t cls, T& best, std::int32_t& best_cls) {
  const bool above = ranks_above(score, best);
  best = above ? score : best;
  best_cls = above ? cls : best_cls;
}

// Argmax of one row of `num_classes` scores (>= 1); score(c) returns class
// c's decoded score. For executors that give each row a thread; the CPU
// executor steps many rows at once with argmax_step, which vectorises across
// rows, and the tests hold both to the same results.
template <typename Score>
CONCORD_HD std::int32_t argmax_row(Score score, std::int32_t num_classes) {
  auto best = score(0);
  std::int32_t best_cls = 0;
  for (std::int32_t c = 1; c < num_classes; ++c) argmax_step(score(c), c, best, best_cls);
  return best_cls;
}

// Top-k membership, torchmetrics' rule: the target is correct when fewer
// than k classes rank strictly above its score, so ties with the target's
// score count in its favour.
template <typename Score>
CONCORD_HD bool topk_hit(Score score, std::int32_t num_classes, std::int64_t target,
                         std::int64_t k) {
  const auto target_score = score(static_cast<std::int32_t>(target));
  // 32-bit counts keep the compare and the count the same width, which
  // vectorises; num_classes fits an int32.
  std::int32_t above = 0;
  for (std::int32_t c = 0; c < num_classes; ++c) above += ranks_above(score(c), target_score);
  return above < k;
}

// A label is valid in [0, num_classes); one unsigned compare also rejects
// negatives.
CONCORD_HD bool label_in_range(std::int64_t label, std::int64_t num_classes) {
  return static_cast<std::uint64_t>(label) < static_cast<std::uint64_t>(num_classes);
}

// Cell of (target, prediction) in a row-major [C, C] confusion matrix.
CONCORD_HD std::int64_t confusion_cell(std::int64_t target, std::int64_t pred,
                                       std::int64_t num_classes) {
  return target * num_classes + pred;
}

// A probability is a positive prediction at or above the threshold; NaN
// compares false and so predicts negative.
template <typename T>
CONCORD_HD bool at_threshold(T score, double threshold) {
  return static_cast<double>(score) >= threshold;
}

// Histogram scores must lie in [0, 1]; NaN does not.
CONCORD_HD bool in_unit_interval(double score) { return score >= 0.0 && score <= 1.0; }

// Bin of a score in [0, 1] among num_bins equal bins; 1.0 goes to the last
// bin, so every bin is closed on the left and only the last on the right.
CONCORD_HD std::int64_t histogram_bin(double score, std::int64_t num_bins) {
  const auto bin = static_cast<std::int64_t>(score * static_cast<double>(num_bins));
  return bin < num_bins - 1 ? bin : num_bins - 1;
}

// Running [sum(value * weight), sum(weight)], accumulated in double so that
// float16 inputs and long runs keep their precision.
struct WeightedAccumulator {
  double weighted = 0.0;
  double weight = 0.0;

  CONCORD_HD void add(double value, double w) {
    weighted += value * w;
    weight += w;
  }
  CONCORD_HD void merge(const WeightedAccumulator& other) {
    weighted += other.weighted;
    weight += other.weight;
  }
};

// Max and min states skip NaN: a NaN sample carries no extremum, and the
// state would otherwise stay NaN forever. `value` is the new sample.
struct MaxSkippingNaN {
  CONCORD_HD double operator()(double value, double state) const {
    return (value > state || state != state) ? value : state;
  }
};
struct MinSkippingNaN {
  CONCORD_HD double operator()(double value, double state) const {
    return (value < state || state != state) ? value : state;
  }
};

}  // namespace concord::metrics
