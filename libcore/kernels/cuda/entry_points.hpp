// The CUDA executors behind the plugin's KernelsApi table (api.cu), one
// definition per .cu file. Each returns a StatusCode value and never throws
// (plugin/plugin_errors.hpp); the meaning of every entry point is documented
// in plugin/cuda_plugin_abi.hpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include "plugin/cuda_plugin_abi.hpp"

namespace concord::cuda_exec {

using plugin::AdamWParams;
using plugin::DeviceTensor;
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
int metric_weighted_sum(double* state, DeviceTensor values, const DeviceTensor* weights,
                        Stream stream) noexcept;
int metric_max(double* state, DeviceTensor values, Stream stream) noexcept;
int metric_min(double* state, DeviceTensor values, Stream stream) noexcept;
int metric_confusion_matrix(std::int64_t* confusion, std::int64_t num_classes, DeviceTensor preds,
                            DeviceTensor target, std::int64_t* invalid, Stream stream) noexcept;
int metric_binary_confusion(std::int64_t* confusion, DeviceTensor preds, DeviceTensor target,
                            double threshold, std::int64_t* invalid, Stream stream) noexcept;
int metric_multilabel_counts(std::int64_t* counts, std::int64_t num_labels, DeviceTensor preds,
                             DeviceTensor target, double threshold, std::int64_t* invalid,
                             Stream stream) noexcept;
int metric_topk_correct(std::int64_t* counts, std::int64_t num_classes, DeviceTensor preds,
                        DeviceTensor target, std::int64_t k, std::int64_t* invalid,
                        Stream stream) noexcept;
int metric_binary_histogram(std::int64_t* histogram, std::int64_t num_bins, DeviceTensor scores,
                            DeviceTensor target, std::int64_t* invalid, Stream stream) noexcept;

}  // namespace concord::cuda_exec
