// The C ABI of the metric update kernels: turn DLTensors into shaped views
// and hand them to libcore/metrics, which validates and runs the update
// (on CUDA tensors, enqueued on the calling thread's stream).
#include "abi_support.hpp"
#include "metrics/updates.hpp"

namespace {

using concord::cabi::current_stream;
using concord::metrics::ShapedView;

// `op` prefixes the role in messages ("confusion_matrix: preds tensor is
// NULL"), as the kernels' own messages are prefixed.
ShapedView shaped(const DLTensor* tensor, const char* op, const char* role) {
  ShapedView result{concord::cabi::view(tensor, concord::cabi::RoleName(op, role).c_str()), {}};
  result.shape.assign(tensor->shape, tensor->shape + tensor->ndim);
  return result;
}

}  // namespace

concord_status concord_metric_weighted_sum(DLTensor* state, const DLTensor* values,
                                           const DLTensor* weights) {
  CONCORD_API_BEGIN
  constexpr const char* op = "weighted_sum";
  const ShapedView s = shaped(state, op, "state");
  const ShapedView v = shaped(values, op, "values");
  if (weights == nullptr) {
    concord::metrics::weighted_sum(s, v, nullptr, current_stream());
  } else {
    const ShapedView w = shaped(weights, op, "weights");
    concord::metrics::weighted_sum(s, v, &w, current_stream());
  }
  CONCORD_API_END
}

concord_status concord_metric_max(DLTensor* state, const DLTensor* values) {
  CONCORD_API_BEGIN
  const ShapedView s = shaped(state, "max", "state");
  concord::metrics::max_value(s, shaped(values, "max", "values"), current_stream());
  CONCORD_API_END
}

concord_status concord_metric_min(DLTensor* state, const DLTensor* values) {
  CONCORD_API_BEGIN
  const ShapedView s = shaped(state, "min", "state");
  concord::metrics::min_value(s, shaped(values, "min", "values"), current_stream());
  CONCORD_API_END
}

concord_status concord_metric_confusion_matrix(DLTensor* confusion, const DLTensor* preds,
                                               const DLTensor* target) {
  CONCORD_API_BEGIN
  constexpr const char* op = "confusion_matrix";
  const ShapedView c = shaped(confusion, op, "confusion");
  const ShapedView p = shaped(preds, op, "preds");
  concord::metrics::confusion_matrix(c, p, shaped(target, op, "target"), current_stream());
  CONCORD_API_END
}

concord_status concord_metric_binary_confusion(DLTensor* confusion, const DLTensor* preds,
                                               const DLTensor* target, double threshold) {
  CONCORD_API_BEGIN
  constexpr const char* op = "binary_confusion";
  const ShapedView c = shaped(confusion, op, "confusion");
  const ShapedView p = shaped(preds, op, "preds");
  concord::metrics::binary_confusion(c, p, shaped(target, op, "target"), threshold,
                                     current_stream());
  CONCORD_API_END
}

concord_status concord_metric_multilabel_counts(DLTensor* counts, const DLTensor* preds,
                                                const DLTensor* target, double threshold) {
  CONCORD_API_BEGIN
  constexpr const char* op = "multilabel_counts";
  const ShapedView c = shaped(counts, op, "counts");
  const ShapedView p = shaped(preds, op, "preds");
  concord::metrics::multilabel_counts(c, p, shaped(target, op, "target"), threshold,
                                      current_stream());
  CONCORD_API_END
}

concord_status concord_metric_topk_correct(DLTensor* counts, const DLTensor* preds,
                                           const DLTensor* target, int64_t k) {
  CONCORD_API_BEGIN
  constexpr const char* op = "topk_correct";
  const ShapedView c = shaped(counts, op, "counts");
  const ShapedView p = shaped(preds, op, "preds");
  concord::metrics::topk_correct(c, p, shaped(target, op, "target"), k, current_stream());
  CONCORD_API_END
}

concord_status concord_metric_binary_histogram(DLTensor* histogram, const DLTensor* scores,
                                               const DLTensor* target) {
  CONCORD_API_BEGIN
  constexpr const char* op = "binary_histogram";
  const ShapedView h = shaped(histogram, op, "histogram");
  const ShapedView s = shaped(scores, op, "scores");
  concord::metrics::binary_histogram(h, s, shaped(target, op, "target"), current_stream());
  CONCORD_API_END
}
