// The C ABI of the metric update kernels: turn DLTensors into shaped views
// and hand them to libcore/metrics, which validates and runs the update
// (on CUDA tensors, enqueued on the calling thread's stream).
#include "abi_support.hpp"
#include "metrics/updates.hpp"

namespace {

using concord::cabi::current_stream;
using concord::TensorView;

// `op` prefixes the role in messages ("confusion_matrix: preds tensor is
// NULL"), as the kernels' own messages are prefixed.
TensorView shaped(const DLTensor* tensor, const char* op, const char* role) {
  return concord::cabi::view(tensor, concord::cabi::RoleName(op, role).c_str());
}

}  // namespace

concord_status concord_metric_weighted_sum(DLTensor* state, const DLTensor* values,
                                           const DLTensor* weights) {
  CONCORD_API_BEGIN
  constexpr const char* op = "weighted_sum";
  const TensorView s = shaped(state, op, "state");
  const TensorView v = shaped(values, op, "values");
  if (weights == nullptr) {
    concord::metrics::weighted_sum(s, v, nullptr, current_stream());
  } else {
    const TensorView w = shaped(weights, op, "weights");
    concord::metrics::weighted_sum(s, v, &w, current_stream());
  }
  CONCORD_API_END
}

concord_status concord_metric_max(DLTensor* state, const DLTensor* values) {
  CONCORD_API_BEGIN
  const TensorView s = shaped(state, "max", "state");
  concord::metrics::max_value(s, shaped(values, "max", "values"), current_stream());
  CONCORD_API_END
}

concord_status concord_metric_min(DLTensor* state, const DLTensor* values) {
  CONCORD_API_BEGIN
  const TensorView s = shaped(state, "min", "state");
  concord::metrics::min_value(s, shaped(values, "min", "values"), current_stream());
  CONCORD_API_END
}

concord_status concord_metric_confusion_matrix(DLTensor* confusion, const DLTensor* preds,
                                               const DLTensor* target) {
  CONCORD_API_BEGIN
  constexpr const char* op = "confusion_matrix";
  const TensorView c = shaped(confusion, op, "confusion");
  const TensorView p = shaped(preds, op, "preds");
  concord::metrics::confusion_matrix(c, p, shaped(target, op, "target"), current_stream());
  CONCORD_API_END
}

concord_status concord_metric_binary_confusion(DLTensor* confusion, const DLTensor* preds,
                                               const DLTensor* target, double threshold) {
  CONCORD_API_BEGIN
  constexpr const char* op = "binary_confusion";
  const TensorView c = shaped(confusion, op, "confusion");
  const TensorView p = shaped(preds, op, "preds");
  concord::metrics::binary_confusion(c, p, shaped(target, op, "target"), threshold,
                                     current_stream());
  CONCORD_API_END
}

concord_status concord_metric_multilabel_counts(DLTensor* counts, const DLTensor* preds,
                                                const DLTensor* target, double threshold) {
  CONCORD_API_BEGIN
  constexpr const char* op = "multilabel_counts";
  const TensorView c = shaped(counts, op, "counts");
  const TensorView p = shaped(preds, op, "preds");
  concord::metrics::multilabel_counts(c, p, shaped(target, op, "target"), threshold,
                                      current_stream());
  CONCORD_API_END
}

concord_status concord_metric_topk_correct(DLTensor* counts, const DLTensor* preds,
                                           const DLTensor* target, int64_t k) {
  CONCORD_API_BEGIN
  constexpr const char* op = "topk_correct";
  const TensorView c = shaped(counts, op, "counts");
  const TensorView p = shaped(preds, op, "preds");
  concord::metrics::topk_correct(c, p, shaped(target, op, "target"), k, current_stream());
  CONCORD_API_END
}

concord_status concord_metric_binary_histogram(DLTensor* histogram, const DLTensor* scores,
                                               const DLTensor* target) {
  CONCORD_API_BEGIN
  constexpr const char* op = "binary_histogram";
  const TensorView h = shaped(histogram, op, "histogram");
  const TensorView s = shaped(scores, op, "scores");
  concord::metrics::binary_histogram(h, s, shaped(target, op, "target"), current_stream());
  CONCORD_API_END
}
