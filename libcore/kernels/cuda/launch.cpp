#include "kernels/cuda/launch.hpp"

#include <cstddef>
#include <utility>
#include <vector>

#include "base/format.hpp"
#include "plugin/cuda_plugin.hpp"

namespace concord::cuda {
namespace {

using plugin::DeviceTensor;

DeviceTensor device_tensor(const TensorView& t) {
  return {t.data, t.numel, t.dtype, static_cast<std::int32_t>(t.device.id)};
}

std::vector<DeviceTensor> device_tensors(std::span<const TensorView> tensors) {
  std::vector<DeviceTensor> out;
  out.reserve(tensors.size());
  for (const TensorView& t : tensors) out.push_back(device_tensor(t));
  return out;
}

// The plugin's table; a plugin that cannot be used (Error kUnavailable)
// fails the operation `what` with the reason.
const plugin::KernelsApi& kernels_for(const char* what) {
  try {
    return plugin::kernels();
  } catch (const Error& e) {
    fail(e.code(), what, ": ", e.what());
  }
}

// Runs entry(api, ...) and turns a failure into an Error naming `what`.
template <class Entry, class... Args>
void call(const char* what, Entry entry, Args&&... args) {
  const plugin::KernelsApi& api = kernels_for(what);
  plugin::check((api.*entry)(std::forward<Args>(args)...), api.last_error, what);
}

template <typename T>
T* data_of(const TensorView& t) {
  return static_cast<T*>(t.data);
}

// One float64 of device memory per thread and device, allocated on first use
// and kept for the thread's life (freeing it would synchronise the device):
// where the synchronous sum_of_squares puts its result before reading it.
double* scratch_double(std::int32_t device) {
  thread_local std::vector<std::pair<std::int32_t, void*>> scratch;
  for (const auto& [d, ptr] : scratch)
    if (d == device) return static_cast<double*>(ptr);
  void* ptr = nullptr;
  call("sum_of_squares", &plugin::KernelsApi::device_alloc, device, sizeof(double),
       &ptr);
  scratch.emplace_back(device, ptr);
  return static_cast<double*>(ptr);
}

}  // namespace

// ---- multi-tensor ---------------------------------------------------------------------

void pack(std::span<const TensorView> tensors, void* wire, DType wire_dtype, double factor,
          plugin::Stream stream) {
  const auto t = device_tensors(tensors);
  call("pack", &plugin::KernelsApi::pack, t.data(), t.size(), wire, wire_dtype, factor, stream);
}

void unpack(const void* wire, DType wire_dtype, std::span<const TensorView> tensors,
            double factor, plugin::Stream stream) {
  const auto t = device_tensors(tensors);
  call("unpack", &plugin::KernelsApi::unpack, wire, wire_dtype, t.data(), t.size(), factor,
       stream);
}

void scale(std::span<const TensorView> tensors, double factor, plugin::Stream stream) {
  const auto t = device_tensors(tensors);
  call("scale", &plugin::KernelsApi::scale, t.data(), t.size(), factor, stream);
}

double sum_of_squares(std::span<const TensorView> tensors, plugin::Stream stream) {
  if (tensors.empty()) return 0.0;
  const auto t = device_tensors(tensors);
  const std::int32_t device = t.front().device;
  double* result = scratch_double(device);
  call("sum_of_squares", &plugin::KernelsApi::sum_of_squares, t.data(), t.size(), result, stream);
  double value = 0.0;
  call("sum_of_squares", &plugin::KernelsApi::copy_to_host, device,
       static_cast<void*>(&value), static_cast<const void*>(result), sizeof value, stream);
  return value;
}

void sum_of_squares_into(std::span<const TensorView> tensors, const TensorView& result,
                         plugin::Stream stream) {
  const auto t = device_tensors(tensors);
  call("sum_of_squares_into", &plugin::KernelsApi::sum_of_squares, t.data(), t.size(),
       data_of<double>(result), stream);
}

void clip_by_sum_of_squares(std::span<const TensorView> tensors, const TensorView& sum_sq,
                            double max_norm, plugin::Stream stream) {
  const auto t = device_tensors(tensors);
  call("clip_by_sum_of_squares", &plugin::KernelsApi::clip_by_sum_of_squares, t.data(), t.size(),
       static_cast<const double*>(sum_sq.data), max_norm, stream);
}

// ---- optimizers -------------------------------------------------------------------------

void sgd_step(const SgdOptions& options, std::span<const TensorView> params,
              std::span<const TensorView> grads, std::span<const TensorView> momentum_buffers,
              plugin::Stream stream) {
  const plugin::SgdParams o{options.lr, options.momentum, options.weight_decay,
                            options.nesterov ? 1 : 0, options.step};
  const auto p = device_tensors(params), g = device_tensors(grads),
             b = device_tensors(momentum_buffers);
  call("sgd_step", &plugin::KernelsApi::sgd_step, &o, p.data(), g.data(),
       b.empty() ? nullptr : b.data(), p.size(), stream);
}

void adamw_step(const AdamWOptions& options, std::span<const TensorView> params,
                std::span<const TensorView> grads, std::span<const TensorView> exp_avg,
                std::span<const TensorView> exp_avg_sq, plugin::Stream stream) {
  const plugin::AdamWParams o{options.lr,  options.beta1,        options.beta2,
                              options.eps, options.weight_decay, options.step};
  const auto p = device_tensors(params), g = device_tensors(grads), m = device_tensors(exp_avg),
             v = device_tensors(exp_avg_sq);
  call("adamw_step", &plugin::KernelsApi::adamw_step, &o, p.data(), g.data(), m.data(), v.data(),
       p.size(), stream);
}

// ---- metric updates ---------------------------------------------------------------------

void metric_weighted_sum(const TensorView& state, const TensorView& values,
                         const TensorView* weights, plugin::Stream stream) {
  const DeviceTensor w = weights != nullptr ? device_tensor(*weights) : DeviceTensor{};
  call("weighted_sum", &plugin::KernelsApi::metric_weighted_sum, data_of<double>(state),
       device_tensor(values), weights != nullptr ? &w : nullptr, stream);
}

void metric_max(const TensorView& state, const TensorView& values, plugin::Stream stream) {
  call("max", &plugin::KernelsApi::metric_max, data_of<double>(state), device_tensor(values),
       stream);
}

void metric_min(const TensorView& state, const TensorView& values, plugin::Stream stream) {
  call("min", &plugin::KernelsApi::metric_min, data_of<double>(state), device_tensor(values),
       stream);
}

void metric_confusion_matrix(const TensorView& confusion, std::int64_t num_classes,
                             const TensorView& preds, const TensorView& target,
                             plugin::Stream stream) {
  call("confusion_matrix", &plugin::KernelsApi::metric_confusion_matrix,
       data_of<std::int64_t>(confusion), num_classes, device_tensor(preds), device_tensor(target),
       static_cast<std::int64_t*>(nullptr), stream);
}

void metric_binary_confusion(const TensorView& confusion, const TensorView& preds,
                             const TensorView& target, double threshold, plugin::Stream stream) {
  call("binary_confusion", &plugin::KernelsApi::metric_binary_confusion,
       data_of<std::int64_t>(confusion), device_tensor(preds), device_tensor(target), threshold,
       static_cast<std::int64_t*>(nullptr), stream);
}

void metric_multilabel_counts(const TensorView& counts, std::int64_t num_labels,
                              const TensorView& preds, const TensorView& target,
                              double threshold, plugin::Stream stream) {
  call("multilabel_counts", &plugin::KernelsApi::metric_multilabel_counts,
       data_of<std::int64_t>(counts), num_labels, device_tensor(preds), device_tensor(target),
       threshold, static_cast<std::int64_t*>(nullptr), stream);
}

void metric_topk_correct(const TensorView& counts, std::int64_t num_classes,
                         const TensorView& preds, const TensorView& target, std::int64_t k,
                         plugin::Stream stream) {
  call("topk_correct", &plugin::KernelsApi::metric_topk_correct, data_of<std::int64_t>(counts),
       num_classes, device_tensor(preds), device_tensor(target), k,
       static_cast<std::int64_t*>(nullptr), stream);
}

void metric_binary_histogram(const TensorView& histogram, std::int64_t num_bins,
                             const TensorView& scores, const TensorView& target,
                             plugin::Stream stream) {
  call("binary_histogram", &plugin::KernelsApi::metric_binary_histogram,
       data_of<std::int64_t>(histogram), num_bins, device_tensor(scores), device_tensor(target),
       static_cast<std::int64_t*>(nullptr), stream);
}

}  // namespace concord::cuda
