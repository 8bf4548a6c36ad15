// The representation partial reductions travel in between ranks, so that a
// reduction in several steps (a ring; shm on each host, then gloo across
// hosts) gives what the shm backend gives reducing every rank's values in
// one pass (kernels/cpu/reduce.hpp): float16 and bfloat16 sums, products
// and means run in float32 and round once at the end; means of 8- and
// 32-bit integers sum exactly in int64; everything else, and max/min
// (exact in any type), travels as it is. Means sum first and divide once,
// by the number of ranks, at the end.
#pragma once

#include <cstddef>

#include "base/dtype.hpp"
#include "base/reduce_op.hpp"

namespace concord::gloo {

// The dtype partial results of `op` over `dtype` travel in.
DType partial_dtype(DType dtype, ReduceOp op) noexcept;

// The op partial results combine with: sum for a mean.
ReduceOp partial_op(ReduceOp op) noexcept;

// dst[i] = src[i] converted from `from` to `to`: the same dtype, or a dtype
// and its partial dtype either way (values in range).
void convert(const void* src, DType from, void* dst, DType to, std::size_t count);

// A mean's partial result (the sum over `ranks` ranks, of dtype `carried`)
// divided, in place: integers truncate toward zero.
void divide_mean(void* partial, DType carried, int ranks, std::size_t count);

// The result of `op` from the reduction of `ranks` ranks' partial results
// in `partial` (of dtype partial_dtype(dtype, op)), into dst (of `dtype`):
// means divided, 16-bit floats rounded once. partial may be dst when the
// dtypes are equal; it is overwritten.
void finish(void* partial, void* dst, DType dtype, ReduceOp op, int ranks, std::size_t count);

}  // namespace concord::gloo
