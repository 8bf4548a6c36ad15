// Per-element optimizer updates as host/device functors, shared by the CPU
// executors (kernels/cpu/optim) and the CUDA executors, so both run the same
// arithmetic in the same order as torch.optim.
#pragma once

#include <cmath>
#include <cstdint>

#include "base/dtype.hpp"
#include "base/host_device.hpp"
#include "kernels/dispatch.hpp"

namespace concord {

// The dtypes of parameters (and their gradients and states) the optimizers
// update; each runs in its own precision.
using OptimizerDTypes = DTypeSet<DType::kFloat32, DType::kFloat64>;

}  // namespace concord

namespace concord::functors {

// torch.optim.SGD without momentum: p -= lr * (g + weight_decay * p).
template <typename T>
struct SgdPlain {
  T lr;
  T weight_decay;

  CONCORD_HD void operator()(T& p, T g) const { p -= lr * (g + weight_decay * p); }
};

// torch.optim.SGD with momentum (dampening 0). On the first step the buffer
// starts as the gradient itself; its previous content is never read, so an
// uninitialised buffer is fine there. Nesterov steps along g + momentum * buf.
// Both choices are template parameters so each loop is branch-free.
template <typename T, bool kNesterov, bool kFirstStep>
struct SgdMomentum {
  T lr;
  T weight_decay;
  T momentum;

  CONCORD_HD void operator()(T& p, T g, T& buf) const {
    const T d = g + weight_decay * p;
    const T b = kFirstStep ? d : momentum * buf + d;
    buf = b;
    p -= lr * (kNesterov ? d + momentum * b : b);
  }
};

// torch.optim.AdamW (decoupled weight decay, no amsgrad):
//   p *= 1 - lr * wd
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)
// with bias corrections bc_i = 1 - b_i^step.
template <typename T>
struct AdamW {
  T beta1;
  T beta2;
  T one_minus_beta1;
  T one_minus_beta2;
  T eps;
  T decay;          // 1 - lr * weight_decay
  T step_size;      // lr / bc1
  T sqrt_bc2;       // sqrt(bc2)

  // Coefficients in float64, rounded once to T, as torch computes its
  // Python-float scalars.
  static AdamW make(double lr, double beta1, double beta2, double eps, double weight_decay,
                    std::int64_t step) {
    const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
    const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(step));
    return {T(beta1),      T(beta2), T(1.0 - beta1),   T(1.0 - beta2),
            T(eps),        T(1.0 - lr * weight_decay), T(lr / bc1), T(std::sqrt(bc2))};
  }

  CONCORD_HD void operator()(T& p, T g, T& m, T& v) const {
    m = beta1 * m + one_minus_beta1 * g;
    v = beta2 * v + one_minus_beta2 * (g * g);
    p *= decay;
    p -= step_size * (m / (std::sqrt(v) / sqrt_bc2 + eps));
  }
};

}  // namespace concord::functors
