// Reduction operators as host/device functors, shared by the CPU executors
// (kernels/cpu) and the CUDA executors (kernels/cuda): the arithmetic is
// written once.
#pragma once

#include "base/dtype.hpp"

#if defined(__CUDACC__)
#define CONCORD_HD __host__ __device__ __forceinline__
#else
#define CONCORD_HD inline
#endif

namespace concord {

enum class ReduceOp : int { kSum = 0, kProd = 1, kMax = 2, kMin = 3, kMean = 4 };

const char* reduce_op_name(ReduceOp op) noexcept;

// bool supports only max and min; every other dtype supports every op.
bool reduce_op_supported(ReduceOp op, DType dtype) noexcept;

// Throws InvalidArgument naming op and dtype when unsupported.
void check_reduce_op(ReduceOp op, DType dtype);

namespace functors {

struct Sum {
  template <typename T>
  CONCORD_HD T operator()(T a, T b) const { return a + b; }
};
struct Prod {
  template <typename T>
  CONCORD_HD T operator()(T a, T b) const { return a * b; }
};
// NaN propagates, as in torch.maximum. (NCCL, which reduces CUDA tensors,
// takes fmax / fmin and drops NaN instead; docs/gpu.md says so.)
struct Max {
  template <typename T>
  CONCORD_HD T operator()(T a, T b) const { return (a != a || a > b) ? a : b; }
};
struct Min {
  template <typename T>
  CONCORD_HD T operator()(T a, T b) const { return (a != a || a < b) ? a : b; }
};

}  // namespace functors
}  // namespace concord
