// The reduction operators of the collectives and their names: vocabulary
// shared by every layer (the C ABI maps its enum onto this one, the
// backends and the CUDA plugin take it as it is).
#pragma once

#include "base/dtype.hpp"

namespace concord {

enum class ReduceOp : int { kSum = 0, kProd = 1, kMax = 2, kMin = 3, kMean = 4 };

inline constexpr int kNumReduceOps = 5;

const char* reduce_op_name(ReduceOp op) noexcept;

// bool supports only max and min; every other dtype supports every op.
bool reduce_op_supported(ReduceOp op, DType dtype) noexcept;

// Throws InvalidArgument naming op and dtype when unsupported.
void check_reduce_op(ReduceOp op, DType dtype);

}  // namespace concord
