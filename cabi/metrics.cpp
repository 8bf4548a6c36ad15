// The C ABI of the metric update kernels: turn DLTensors into shaped views
// named by the kernel's signature and hand them to libcore/metrics, which
// validates and runs the update (on CUDA tensors, enqueued on the calling
// thread's stream).
#include <initializer_list>

#include "abi_support.hpp"
#include "metrics/updates.hpp"

namespace {

using concord::TensorView;
using concord::cabi::current_stream;
using concord::metrics::MetricKernel;
using concord::metrics::MetricOptions;

// The kernel's name prefixes each role in messages ("confusion_matrix:
// preds tensor is NULL"), as the kernels' own messages are prefixed. A
// NULL input past the required ones is left out, with those after it.
void run(MetricKernel kernel, const DLTensor* state,
         std::initializer_list<const DLTensor*> inputs, const MetricOptions& options) {
  const char* op = concord::plugin::metric_kernel_name(kernel);
  const concord::metrics::KernelSignature s = concord::metrics::signature(kernel);
  auto shaped = [op](const DLTensor* tensor, const char* role) {
    return concord::cabi::view(tensor, concord::cabi::RoleName(op, role).c_str());
  };
  const TensorView state_view = shaped(state, s.state);
  TensorView views[concord::plugin::kMaxMetricInputs];
  std::size_t n = 0;
  for (const DLTensor* input : inputs) {
    if (input == nullptr && n >= s.required_inputs) break;
    views[n] = shaped(input, s.inputs[n]);
    ++n;
  }
  concord::metrics::update(kernel, state_view, {views, n}, options, current_stream());
}

}  // namespace

concord_status concord_metric_weighted_sum(DLTensor* state, const DLTensor* values,
                                           const DLTensor* weights) {
  CONCORD_API_BEGIN
  run(MetricKernel::kWeightedSum, state, {values, weights}, {});
  CONCORD_API_END
}

concord_status concord_metric_max(DLTensor* state, const DLTensor* values) {
  CONCORD_API_BEGIN
  run(MetricKernel::kMax, state, {values}, {});
  CONCORD_API_END
}

concord_status concord_metric_min(DLTensor* state, const DLTensor* values) {
  CONCORD_API_BEGIN
  run(MetricKernel::kMin, state, {values}, {});
  CONCORD_API_END
}

concord_status concord_metric_confusion_matrix(DLTensor* confusion, const DLTensor* preds,
                                               const DLTensor* target) {
  CONCORD_API_BEGIN
  run(MetricKernel::kConfusionMatrix, confusion, {preds, target}, {});
  CONCORD_API_END
}

concord_status concord_metric_binary_confusion(DLTensor* confusion, const DLTensor* preds,
                                               const DLTensor* target, double threshold) {
  CONCORD_API_BEGIN
  run(MetricKernel::kBinaryConfusion, confusion, {preds, target}, {threshold, 0});
  CONCORD_API_END
}

concord_status concord_metric_multilabel_counts(DLTensor* counts, const DLTensor* preds,
                                                const DLTensor* target, double threshold) {
  CONCORD_API_BEGIN
  run(MetricKernel::kMultilabelCounts, counts, {preds, target}, {threshold, 0});
  CONCORD_API_END
}

concord_status concord_metric_topk_correct(DLTensor* counts, const DLTensor* preds,
                                           const DLTensor* target, int64_t k) {
  CONCORD_API_BEGIN
  run(MetricKernel::kTopkCorrect, counts, {preds, target}, {0.0, k});
  CONCORD_API_END
}

concord_status concord_metric_binary_histogram(DLTensor* histogram, const DLTensor* scores,
                                               const DLTensor* target) {
  CONCORD_API_BEGIN
  run(MetricKernel::kBinaryHistogram, histogram, {scores, target}, {});
  CONCORD_API_END
}
