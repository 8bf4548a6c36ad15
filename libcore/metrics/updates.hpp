// Metric update kernels: validate a state tensor and its inputs, then
// accumulate the inputs into the state where it lives, with no
// communication. Every failure is an Error, and a failed update leaves the
// state as it was.
//
// Label inputs (targets, label predictions) are int8, int32, int64, uint8 or
// bool; score and probability inputs are float16, bfloat16, float32 or
// float64. The state and its inputs sit on one device: CPU tensors run the
// CPU executors here, CUDA tensors the CUDA plugin's (kernels/cuda/launch),
// enqueued on `stream` (nullptr: the legacy default stream) with no host
// synchronisation. Everything checked from shapes, dtypes and devices is
// checked for both; checks of the input values themselves (labels in
// range, binary labels 0 or 1, histogram scores in [0, 1]) would need the
// data on the host, so on CUDA such samples are skipped, not rejected.
#pragma once

#include <cstdint>
#include <vector>

#include "base/tensor_view.hpp"
#include "plugin/cuda_plugin_abi.hpp"

namespace concord::metrics {

// state (float64 [2]) += [sum(values * weights), sum(weights)]; weights
// (same shape as values) may be null, meaning 1 for every value. values and
// weights take any dtype; bool counts as 0/1. NaN propagates, as in a sum.
void weighted_sum(const TensorView& state, const TensorView& values, const TensorView* weights,
                  plugin::Stream stream = nullptr);

// state (float64 [1]) = max / min of the state and every non-NaN value.
void max_value(const TensorView& state, const TensorView& values,
               plugin::Stream stream = nullptr);
void min_value(const TensorView& state, const TensorView& values,
               plugin::Stream stream = nullptr);

// confusion (int64 [C, C], row = target, column = prediction) += counts of
// preds, labels (N,) or scores (N, C) whose argmax is the prediction,
// against target labels (N,), all in [0, C). The argmax takes the first of
// tied scores and ranks NaN above every number, as torch and numpy do.
void confusion_matrix(const TensorView& confusion, const TensorView& preds,
                      const TensorView& target, plugin::Stream stream = nullptr);

// confusion (int64 [2, 2]) += counts of preds, probabilities (N,) that are
// positive when >= threshold (NaN is negative) or 0/1 labels, against 0/1
// target (N,). A NaN threshold is an error.
void binary_confusion(const TensorView& confusion, const TensorView& preds,
                      const TensorView& target, double threshold,
                      plugin::Stream stream = nullptr);

// counts (int64 [L, 4]) += per label [tp, fp, fn, tn] of preds (N, L),
// probabilities thresholded as in binary_confusion or 0/1 labels, against
// 0/1 target (N, L).
void multilabel_counts(const TensorView& counts, const TensorView& preds,
                       const TensorView& target, double threshold,
                       plugin::Stream stream = nullptr);

// counts (int64 [2]) += [samples whose target is among the top k of its
// scores, N]; preds (N, C) scores, target (N,) labels, 1 <= k <= C. A
// target is among the top k when fewer than k classes rank strictly above
// its score (NaN ranking above numbers), so ties go in its favour.
void topk_correct(const TensorView& counts, const TensorView& preds, const TensorView& target,
                  std::int64_t k, plugin::Stream stream = nullptr);

// histogram (int64 [2, B]) row target[i] += 1 at bin
// min(floor(scores[i] * B), B - 1); scores (N,) in [0, 1] (NaN or any score
// outside is an error on the CPU, skipped on CUDA), target (N,) 0/1.
void binary_histogram(const TensorView& histogram, const TensorView& scores,
                      const TensorView& target, plugin::Stream stream = nullptr);

}  // namespace concord::metrics
