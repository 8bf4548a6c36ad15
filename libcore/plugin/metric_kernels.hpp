// The metric update kernels as their executors see them: which kernel, and
// its arguments as plain data, already validated by metrics/updates. The CPU
// executor (kernels/cpu/metrics) and, across the plugin boundary, the CUDA
// executor (kernels/cuda/metrics.cu) read the same MetricArgs.
//
// A kernel is added with: its enumerator and name here; its per-sample
// arithmetic in kernels/metric_functors.hpp; its executors in
// kernels/cpu/metrics.cpp and kernels/cuda/metrics.cu; its signature and
// validation in metrics/updates.cpp. MetricArgs crosses the plugin
// boundary: a change of its layout is a change of the plugin's ABI (bump
// kAbiVersion in plugin/cuda_plugin_abi.hpp).
#pragma once

#include <cstdint>

#include "plugin/cuda_plugin_abi.hpp"

namespace concord::plugin {

// What each kernel adds to its state (the state's dtype and shape, then
// the inputs, in their order in MetricArgs::inputs). Label inputs are int8,
// int32, int64, uint8 or bool; score and probability inputs float16,
// bfloat16, float32 or float64.
enum class MetricKernel : std::int32_t {
  // state (float64 [2]) += [sum(values * weights), sum(weights)]; inputs
  // values and, optionally, weights of the same shape (absent: 1 for every
  // value), any dtype, bool counting as 0/1. NaN propagates, as in a sum.
  kWeightedSum = 0,
  // state (float64 [1]) = max / min of the state and every non-NaN value;
  // input values, any dtype.
  kMax = 1,
  kMin = 2,
  // confusion (int64 [C, C], row = target, column = prediction) += counts
  // of preds, labels (N,) or scores (N, C) whose argmax is the prediction,
  // against target labels (N,), all in [0, C). The argmax takes the first
  // of tied scores and ranks NaN above every number, as torch and numpy do.
  kConfusionMatrix = 3,
  // confusion (int64 [2, 2]) += counts of preds, probabilities (N,) that
  // are positive when >= threshold (NaN is negative) or 0/1 labels, against
  // 0/1 target (N,). A NaN threshold is an error.
  kBinaryConfusion = 4,
  // counts (int64 [L, 4]) += per label [tp, fp, fn, tn] of preds (N, L),
  // probabilities thresholded as in kBinaryConfusion or 0/1 labels, against
  // 0/1 target (N, L).
  kMultilabelCounts = 5,
  // counts (int64 [2]) += [samples whose target is among the top k of its
  // scores, N]; preds (N, C) scores, target (N,) labels, 1 <= k <= C. A
  // target is among the top k when fewer than k classes rank strictly above
  // its score (NaN ranking above numbers), so ties go in its favour.
  kTopkCorrect = 6,
  // histogram (int64 [2, B]) row target[i] += 1 at bin
  // min(floor(scores[i] * B), B - 1); scores (N,) in [0, 1], target (N,) 0/1.
  kBinaryHistogram = 7,
};

inline constexpr int kNumMetricKernels = 8;

// The name a kernel goes by in messages and lookups ("binary_histogram");
// nullptr for a value that is no kernel.
constexpr const char* metric_kernel_name(MetricKernel kernel) {
  switch (kernel) {
    case MetricKernel::kWeightedSum: return "weighted_sum";
    case MetricKernel::kMax: return "max";
    case MetricKernel::kMin: return "min";
    case MetricKernel::kConfusionMatrix: return "confusion_matrix";
    case MetricKernel::kBinaryConfusion: return "binary_confusion";
    case MetricKernel::kMultilabelCounts: return "multilabel_counts";
    case MetricKernel::kTopkCorrect: return "topk_correct";
    case MetricKernel::kBinaryHistogram: return "binary_histogram";
  }
  return nullptr;
}

static_assert(metric_kernel_name(static_cast<MetricKernel>(kNumMetricKernels - 1)) != nullptr &&
                  metric_kernel_name(static_cast<MetricKernel>(kNumMetricKernels)) == nullptr,
              "kNumMetricKernels counts the named kernels");

inline constexpr int kMaxMetricInputs = 2;

// One update: the state and inputs, with the dtypes and shapes the kernel
// needs, and the scalars it reads (the others are left 0). The CPU
// executor gets host tensors here (DeviceTensor::device unused).
struct MetricArgs {
  DeviceTensor state;
  DeviceTensor inputs[kMaxMetricInputs];
  std::int32_t num_inputs;
  double threshold;          // kBinaryConfusion, kMultilabelCounts
  std::int64_t k;            // kTopkCorrect
  std::int64_t num_classes;  // kConfusionMatrix, kTopkCorrect: C
  std::int64_t num_labels;   // kMultilabelCounts: L
  std::int64_t num_bins;     // kBinaryHistogram: B
  // CUDA only: an int64 in device memory counting the samples skipped for
  // their values (see KernelsApi::metric_update), or null.
  std::int64_t* invalid;
};

}  // namespace concord::plugin
