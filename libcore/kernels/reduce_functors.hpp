// Reduction operators as host/device functors, shared by the CPU executors
// (kernels/cpu) and the CUDA executors (kernels/cuda): the arithmetic is
// written once.
#pragma once

#include "base/host_device.hpp"

namespace concord::functors {

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

}  // namespace concord::functors
