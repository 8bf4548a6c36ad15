// libconcord's side of the CUDA executors: the same operations as the CPU
// executors, on CUDA tensors, run by the CUDA plugin (plugin/cuda_plugin.hpp)
// and enqueued on `stream`. Arguments are validated by the device-neutral
// fronts (kernels/multi_tensor, kernels/optim_step, metrics/updates), which
// are what callers use; every tensor of a call is on one CUDA device.
// Without a usable plugin (a CPU-only build, no driver, no GPU) every
// function throws Error(kUnavailable).
#pragma once

#include <span>

#include "base/dtype.hpp"
#include "base/tensor_view.hpp"
#include "kernels/optim_options.hpp"
#include "plugin/cuda_plugin_abi.hpp"
#include "plugin/metric_kernels.hpp"

namespace concord::cuda {

// ---- multi-tensor (kernels/multi_tensor.hpp) ----------------------------------------

void pack(std::span<const TensorView> tensors, void* wire, DType wire_dtype, double factor,
          plugin::Stream stream);
void unpack(const void* wire, DType wire_dtype, std::span<const TensorView> tensors,
            double factor, plugin::Stream stream);
void scale(std::span<const TensorView> tensors, double factor, plugin::Stream stream);
// The one path that waits for `stream`: the value is returned on the host.
// Reads it through a float64 of device memory kept per thread and device.
double sum_of_squares(std::span<const TensorView> tensors, plugin::Stream stream);
// result: one float64 element on the tensors' device; written, not added to.
void sum_of_squares_into(std::span<const TensorView> tensors, const TensorView& result,
                         plugin::Stream stream);
void clip_by_sum_of_squares(std::span<const TensorView> tensors, const TensorView& sum_sq,
                            double max_norm, plugin::Stream stream);

// ---- optimizers (kernels/optim_step.hpp) ---------------------------------------------

// momentum_buffers is empty when momentum == 0.
void sgd_step(const SgdOptions& options, std::span<const TensorView> params,
              std::span<const TensorView> grads, std::span<const TensorView> momentum_buffers,
              plugin::Stream stream);
void adamw_step(const AdamWOptions& options, std::span<const TensorView> params,
                std::span<const TensorView> grads, std::span<const TensorView> exp_avg,
                std::span<const TensorView> exp_avg_sq, plugin::Stream stream);

// ---- metric updates (metrics/updates.hpp) ---------------------------------------------
// Samples the CPU would reject for their values (labels out of range,
// histogram scores outside [0, 1]) are skipped: rejecting them would need
// the data on the host.

void metric_update(plugin::MetricKernel kernel, const plugin::MetricArgs& args,
                   plugin::Stream stream);

}  // namespace concord::cuda
