// The CUDA executors behind the plugin's KernelsApi table (api.cu), one
// definition per .cu file. Each returns a StatusCode value and never throws
// (plugin/plugin_errors.hpp); the meaning of every entry point is documented
// in plugin/cuda_plugin_abi.hpp.
#pragma once

#include <cstddef>

#include "plugin/cuda_plugin_abi.hpp"

namespace concord::cuda_exec {

using plugin::AdamWParams;
using plugin::DeviceTensor;
using plugin::MetricArgs;
using plugin::MetricKernel;
using plugin::SgdParams;
using plugin::Stream;

// multi_tensor.cu
int scale(const DeviceTensor* tensors, std::size_t n, double factor, Stream stream) noexcept;
int pack(const DeviceTensor* tensors, std::size_t n, void* wire, DType wire_dtype, double factor,
         Stream stream) noexcept;
int unpack(const void* wire, DType wire_dtype, const DeviceTensor* tensors, std::size_t n,
           double factor, Stream stream) noexcept;
int sum_of_squares(const DeviceTensor* tensors, std::size_t n, double* result,
                   Stream stream) noexcept;
int clip_by_sum_of_squares(const DeviceTensor* tensors, std::size_t n, const double* sum_sq,
                           double max_norm, Stream stream) noexcept;

// optim.cu
int sgd_step(const SgdParams* options, const DeviceTensor* params, const DeviceTensor* grads,
             const DeviceTensor* momentum_buffers, std::size_t n, Stream stream) noexcept;
int adamw_step(const AdamWParams* options, const DeviceTensor* params, const DeviceTensor* grads,
               const DeviceTensor* exp_avg, const DeviceTensor* exp_avg_sq, std::size_t n,
               Stream stream) noexcept;

// metrics.cu
int metric_update(MetricKernel kernel, const MetricArgs* args, Stream stream) noexcept;

}  // namespace concord::cuda_exec
