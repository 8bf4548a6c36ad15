// Gradient clipping by global norm as a host/device function, shared by the
// CPU path (kernels/multi_tensor.cpp) and the CUDA executor, which computes
// it on the device from a sum of squares that never leaves the device.
#pragma once

#include <cmath>

#include "base/host_device.hpp"

namespace concord::functors {

// torch.nn.utils.clip_grad_norm_'s factor:
//   min(1, max_norm / (sqrt(sum_of_squares) + 1e-6)).
// As torch.clamp, a NaN norm gives NaN (so the gradients become NaN, as
// torch's do), and an infinite norm gives 0.
CONCORD_HD double clip_coefficient(double sum_of_squares, double max_norm) {
  const double coefficient = max_norm / (std::sqrt(sum_of_squares) + 1e-6);
  return coefficient > 1.0 ? 1.0 : coefficient;
}

}  // namespace concord::functors
