// Fused multi-tensor CPU executors: one call makes one pass over many
// tensors, so packing a bucket or scaling every gradient is one call rather
// than one per tensor. Pure executors: the arguments are validated by the
// device-neutral front (kernels/multi_tensor.hpp), which is what callers use.
#pragma once

#include <span>

#include "base/dtype.hpp"
#include "base/tensor_view.hpp"

namespace concord::cpu {

// Writes every tensor's elements times `factor`, converted to `wire_dtype`,
// one tensor after another into `wire`, which holds the sum of their
// element counts. Floating tensors convert to any floating wire dtype;
// other dtypes only copy into their own dtype with factor 1.
void pack(std::span<const TensorView> tensors, void* wire, DType wire_dtype, double factor);

// The inverse of pack: consecutive runs of `wire`, times `factor` and
// converted to each tensor's dtype, into the tensors.
void unpack(const void* wire, DType wire_dtype, std::span<const TensorView> tensors,
            double factor);

// tensors[i] *= factor, for floating tensors of any mix of dtypes.
void scale(std::span<const TensorView> tensors, double factor);

// Sum of the squares of every element of every floating tensor, accumulated
// in float64: the squared global L2 norm of gradient clipping.
double sum_of_squares(std::span<const TensorView> tensors);

}  // namespace concord::cpu
