#include "kernels/cuda/launch.hpp"

#include <cstddef>
#include <utility>
#include <vector>

#include "base/format.hpp"
#include "kernels/front.hpp"
#include "plugin/cuda_plugin.hpp"

namespace concord::cuda {
namespace {

using kernels::device_tensor;
using plugin::DeviceTensor;

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

void metric_update(plugin::MetricKernel kernel, const plugin::MetricArgs& args,
                   plugin::Stream stream) {
  call(plugin::metric_kernel_name(kernel), &plugin::KernelsApi::metric_update, kernel, &args,
       stream);
}

}  // namespace concord::cuda
