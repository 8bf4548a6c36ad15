// Fused optimizer steps on the CPU: one call updates every parameter, with
// torch.optim semantics. Parameters, gradients and states share one dtype,
// float32 or float64, and match pairwise in element count. Options and
// tensors are validated before any tensor is written.
#pragma once

#include <cstdint>
#include <span>

#include "base/tensor_view.hpp"

namespace concord::cpu {

struct SgdOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  std::int64_t step = 1;  // 1 on the first step: momentum buffers start as the gradient
};

// torch.optim.SGD with dampening 0. momentum_buffers is empty when
// momentum == 0 (and ignored then).
void sgd_step(const SgdOptions& options, std::span<const TensorView> params,
              std::span<const TensorView> grads, std::span<const TensorView> momentum_buffers);

struct AdamWOptions {
  double lr = 0.001;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  std::int64_t step = 1;  // 1-based, including this step, for the bias corrections
};

// torch.optim.AdamW (decoupled weight decay, no amsgrad).
void adamw_step(const AdamWOptions& options, std::span<const TensorView> params,
                std::span<const TensorView> grads, std::span<const TensorView> exp_avg,
                std::span<const TensorView> exp_avg_sq);

}  // namespace concord::cpu
