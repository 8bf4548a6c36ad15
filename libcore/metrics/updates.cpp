#include "metrics/updates.hpp"

#include <cmath>
#include <string>

#include "base/format.hpp"
#include "kernels/cpu/metrics.hpp"
#include "kernels/cuda/launch.hpp"
#include "kernels/front.hpp"

namespace concord::metrics {
namespace {

using kernels::device_str;
using plugin::MetricArgs;
using Inputs = std::span<const TensorView>;

// ---- checks ----------------------------------------------------------------

constexpr const char* kLabelDTypes = "int8, int32, int64, uint8 or bool";
constexpr const char* kScoreDTypes = "float16, bfloat16, float32 or float64";

void check_label_dtype(const char* op, const char* role, const TensorView& t) {
  if (dtype_is_floating(t.dtype))
    invalid_argument(op, ": ", role, " has dtype ", dtype_name(t.dtype),
                     ", expected integer labels (", kLabelDTypes, ")");
}

void check_score_dtype(const char* op, const char* role, const TensorView& t) {
  if (!dtype_is_floating(t.dtype))
    invalid_argument(op, ": ", role, " has dtype ", dtype_name(t.dtype),
                     ", expected scores (", kScoreDTypes, ")");
}

void check_dtype(const char* op, const char* role, const TensorView& t, DType expected) {
  if (t.dtype != expected)
    invalid_argument(op, ": ", role, " has dtype ", dtype_name(t.dtype), ", expected ",
                     dtype_name(expected));
}

void check_shape(const char* op, const char* role, const TensorView& t,
                 const Shape& expected, const char* why = "") {
  if (t.shape != expected)
    invalid_argument(op, ": ", role, " has shape ", t.shape.str(), ", expected ",
                     expected.str(), why);
}

void check_threshold(const char* op, double threshold) {
  if (std::isnan(threshold)) invalid_argument(op, ": threshold is nan, expected a number");
}

// ---- the kernels' own checks -------------------------------------------------
// What shapes, dtypes and options say, in each kernel's order; the scalars
// the executors read go into `args`. Devices are checked after them, for
// every kernel alike (update()).

void validate_weighted_sum(const char* op, const TensorView& state, Inputs in,
                           const MetricOptions&, MetricArgs&) {
  check_dtype(op, "state", state, DType::kFloat64);
  check_shape(op, "state", state, {2});
  if (in.size() == 2) check_shape(op, "weights", in[1], in[0].shape, " to match values");
}

void validate_extremum(const char* op, const TensorView& state, Inputs, const MetricOptions&,
                       MetricArgs&) {
  check_dtype(op, "state", state, DType::kFloat64);
  check_shape(op, "state", state, {1});
}

void validate_confusion_matrix(const char* op, const TensorView& confusion, Inputs in,
                               const MetricOptions&, MetricArgs& args) {
  const TensorView &preds = in[0], &target = in[1];
  check_dtype(op, "confusion", confusion, DType::kInt64);
  const auto& cm = confusion.shape;
  if (cm.ndim() != 2 || cm[0] != cm[1] || cm[0] < 1)
    invalid_argument(op, ": confusion has shape ", cm.str(),
                     ", expected (C, C) with C >= 1 classes");
  const std::int64_t num_classes = cm[0];
  const auto& ps = preds.shape;
  const bool labels = ps.ndim() == 1, scores = ps.ndim() == 2 && ps[1] == num_classes;
  if (!labels && !scores)
    invalid_argument(op, ": preds has shape ", ps.str(), " but the confusion matrix is ",
                     num_classes, " x ", num_classes, ": expected (N, ", num_classes,
                     ") scores or (N,) labels");
  // The executors tell scores from labels by the dtype.
  if (labels && dtype_is_floating(preds.dtype))
    invalid_argument(op, ": preds (N,) are labels and need an integer dtype (", kLabelDTypes,
                     "), got ", dtype_name(preds.dtype), "; pass (N, ", num_classes,
                     ") scores for an argmax");
  if (scores) check_score_dtype(op, "preds", preds);
  check_shape(op, "target", target, {ps[0]}, " to match preds");
  check_label_dtype(op, "target", target);
  args.num_classes = num_classes;
}

void validate_binary_confusion(const char* op, const TensorView& confusion, Inputs in,
                               const MetricOptions& options, MetricArgs& args) {
  const TensorView &preds = in[0], &target = in[1];
  check_dtype(op, "confusion", confusion, DType::kInt64);
  check_shape(op, "confusion", confusion, {2, 2});
  if (preds.shape.ndim() != 1)
    invalid_argument(op, ": preds has shape ", preds.shape.str(),
                     ", expected (N,) probabilities or labels");
  check_shape(op, "target", target, preds.shape, " to match preds");
  check_label_dtype(op, "target", target);
  check_threshold(op, options.threshold);
  args.threshold = options.threshold;
}

void validate_multilabel_counts(const char* op, const TensorView& counts, Inputs in,
                                const MetricOptions& options, MetricArgs& args) {
  const TensorView &preds = in[0], &target = in[1];
  check_dtype(op, "counts", counts, DType::kInt64);
  if (counts.shape.ndim() != 2 || counts.shape[1] != 4)
    invalid_argument(op, ": counts has shape ", counts.shape.str(),
                     ", expected (L, 4): tp, fp, fn, tn per label");
  const std::int64_t labels = counts.shape[0];
  if (preds.shape.ndim() != 2 || preds.shape[1] != labels)
    invalid_argument(op, ": preds has shape ", preds.shape.str(), ", expected (N, ", labels,
                     ") to match counts ", counts.shape.str());
  check_shape(op, "target", target, preds.shape, " to match preds");
  check_label_dtype(op, "target", target);
  check_threshold(op, options.threshold);
  args.num_labels = labels;
  args.threshold = options.threshold;
}

void validate_topk_correct(const char* op, const TensorView& counts, Inputs in,
                           const MetricOptions& options, MetricArgs& args) {
  const TensorView &preds = in[0], &target = in[1];
  check_dtype(op, "counts", counts, DType::kInt64);
  check_shape(op, "counts", counts, {2});
  if (preds.shape.ndim() != 2 || preds.shape[1] < 1)
    invalid_argument(op, ": preds has shape ", preds.shape.str(),
                     ", expected (N, C) scores with C >= 1");
  check_score_dtype(op, "preds", preds);
  const std::int64_t num_classes = preds.shape[1];
  if (options.k < 1 || options.k > num_classes)
    invalid_argument(op, ": k is ", options.k, ", expected 1 <= k <= ", num_classes,
                     " (the number of classes)");
  check_shape(op, "target", target, {preds.shape[0]}, " to match preds");
  check_label_dtype(op, "target", target);
  args.num_classes = num_classes;
  args.k = options.k;
}

void validate_binary_histogram(const char* op, const TensorView& histogram, Inputs in,
                               const MetricOptions&, MetricArgs& args) {
  const TensorView &scores = in[0], &target = in[1];
  check_dtype(op, "histogram", histogram, DType::kInt64);
  const auto& hs = histogram.shape;
  if (hs.ndim() != 2 || hs[0] != 2 || hs[1] < 1)
    invalid_argument(op, ": histogram has shape ", hs.str(),
                     ", expected (2, B) with B >= 1 bins");
  if (scores.shape.ndim() != 1)
    invalid_argument(op, ": scores has shape ", scores.shape.str(), ", expected (N,)");
  check_score_dtype(op, "scores", scores);
  check_shape(op, "target", target, scores.shape, " to match scores");
  check_label_dtype(op, "target", target);
  args.num_bins = hs[1];
}

// ---- the kernel table ----------------------------------------------------------

using Validate = void (*)(const char* op, const TensorView& state, Inputs inputs,
                          const MetricOptions& options, MetricArgs& args);

struct Kernel {
  KernelSignature signature;
  Validate validate;
};

Kernel kernel_of(MetricKernel kernel) {
  switch (kernel) {
    case MetricKernel::kWeightedSum:
      return {{"state", {"values", "weights"}, 1, 2}, &validate_weighted_sum};
    case MetricKernel::kMax:
    case MetricKernel::kMin: return {{"state", {"values"}, 1, 1}, &validate_extremum};
    case MetricKernel::kConfusionMatrix:
      return {{"confusion", {"preds", "target"}, 2, 2}, &validate_confusion_matrix};
    case MetricKernel::kBinaryConfusion:
      return {{"confusion", {"preds", "target"}, 2, 2}, &validate_binary_confusion};
    case MetricKernel::kMultilabelCounts:
      return {{"counts", {"preds", "target"}, 2, 2}, &validate_multilabel_counts};
    case MetricKernel::kTopkCorrect:
      return {{"counts", {"preds", "target"}, 2, 2}, &validate_topk_correct};
    case MetricKernel::kBinaryHistogram:
      return {{"histogram", {"scores", "target"}, 2, 2}, &validate_binary_histogram};
  }
  invalid_argument("unknown metric kernel ", static_cast<int>(kernel));
}

std::string role_list(const KernelSignature& s) {
  std::string roles;
  for (std::size_t i = 0; i < s.max_inputs; ++i)
    roles += concat(i ? ", " : "", s.inputs[i], i < s.required_inputs ? "" : " (optional)");
  return roles;
}

}  // namespace

KernelSignature signature(MetricKernel kernel) { return kernel_of(kernel).signature; }

MetricKernel kernel_from_name(std::string_view name) {
  std::string valid;
  for (int k = 0; k < plugin::kNumMetricKernels; ++k) {
    const char* known = plugin::metric_kernel_name(static_cast<MetricKernel>(k));
    if (name == known) return static_cast<MetricKernel>(k);
    valid += concat(k ? ", " : "", known);
  }
  invalid_argument("unknown metric kernel '", name, "'; valid: ", valid);
}

void update(MetricKernel kernel, const TensorView& state, Inputs inputs,
            const MetricOptions& options, plugin::Stream stream) {
  const Kernel k = kernel_of(kernel);
  const KernelSignature& s = k.signature;
  const char* op = plugin::metric_kernel_name(kernel);
  if (inputs.size() < s.required_inputs || inputs.size() > s.max_inputs)
    invalid_argument(op, ": got ", inputs.size(), inputs.size() == 1 ? " input" : " inputs",
                     "; it takes ", role_list(s));
  MetricArgs args{};
  k.validate(op, state, inputs, options, args);
  // Every input must sit with the state, whose device picks the executor.
  for (std::size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].device != state.device)
      invalid_argument(op, ": ", s.inputs[i], " is on ", device_str(inputs[i].device), " but ",
                       s.state, " is on ", device_str(state.device),
                       "; pass tensors on one device");
  args.state = kernels::device_tensor(state);
  for (std::size_t i = 0; i < inputs.size(); ++i)
    args.inputs[i] = kernels::device_tensor(inputs[i]);
  args.num_inputs = static_cast<std::int32_t>(inputs.size());
  if (state.device.kind == DeviceKind::kCUDA)
    cuda::metric_update(kernel, args, stream);
  else
    cpu::metric_update(kernel, args);
}

}  // namespace concord::metrics
