// Fused multi-tensor operations on CPU or CUDA tensors: one call covers many
// tensors, so packing a bucket or scaling every gradient is one call rather
// than one per tensor. Every tensor is validated before any is touched; all
// tensors of a call (and its result or scalar tensor) sit on one device.
// Then the CPU executor (kernels/cpu/multi_tensor) runs, or, for CUDA
// tensors, the CUDA plugin's, enqueued on `stream` (nullptr: the legacy
// default stream); only the sum_of_squares that returns a host double waits
// for the stream.
#pragma once

#include <span>

#include "base/dtype.hpp"
#include "base/tensor_view.hpp"
#include "plugin/cuda_plugin_abi.hpp"

namespace concord::kernels {

// Writes every tensor's elements times `factor`, converted to `wire_dtype`,
// one tensor after another into `wire` (memory on the tensors' device),
// which holds the sum of their element counts. Floating tensors convert to
// any floating wire dtype; other dtypes only copy into their own dtype with
// factor 1.
void pack(std::span<const TensorView> tensors, void* wire, DType wire_dtype, double factor,
          plugin::Stream stream = nullptr);

// The inverse of pack: consecutive runs of `wire`, times `factor` and
// converted to each tensor's dtype, into the tensors.
void unpack(const void* wire, DType wire_dtype, std::span<const TensorView> tensors,
            double factor, plugin::Stream stream = nullptr);

// tensors[i] *= factor, for floating tensors of any mix of dtypes.
void scale(std::span<const TensorView> tensors, double factor, plugin::Stream stream = nullptr);

// Sum of the squares of every element of every floating tensor, accumulated
// in float64: the squared global L2 norm of gradient clipping. On CUDA
// tensors this waits for `stream`, to return the value on the host.
double sum_of_squares(std::span<const TensorView> tensors, plugin::Stream stream = nullptr);

// The same sum written into `result` (one float64 element, on the tensors'
// device, sharing no memory with them); on CUDA tensors with no host sync.
void sum_of_squares_into(std::span<const TensorView> tensors, const TensorView& result,
                         plugin::Stream stream = nullptr);

// tensors[i] *= min(1, max_norm / (sqrt(sum_sq) + 1e-6)) (torch's
// clip_grad_norm_ factor, functors::clip_coefficient), with `sum_sq` one
// float64 element on the tensors' device, read there: on CUDA the factor is
// taken on the device, with no host sync. max_norm >= 0 (inf: no clipping).
void clip_by_sum_of_squares(std::span<const TensorView> tensors, const TensorView& sum_sq,
                            double max_norm, plugin::Stream stream = nullptr);

}  // namespace concord::kernels
