// CPU reduction executors.
#pragma once

#include <cstddef>

#include "base/dtype.hpp"
#include "base/reduce_op.hpp"

namespace concord::cpu {

// dst[i] = op(srcs[0][i], ..., srcs[nsrc-1][i]) for i < count.
// kMean divides the sum by `mean_divisor` (the world size); integer means
// truncate toward zero (as NCCL's avg). float16/bfloat16 accumulate in
// float32 and round once. dst may alias any source. nsrc >= 1.
void reduce_sources(void* dst, const void* const* srcs, int nsrc, std::size_t count,
                    DType dtype, ReduceOp op, int mean_divisor);

}  // namespace concord::cpu
