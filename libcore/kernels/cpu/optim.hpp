// Fused optimizer steps on the CPU: one call updates every parameter, with
// torch.optim semantics. Pure executors: the arguments are validated by the
// device-neutral front (kernels/optim_step.hpp), which is what callers use.
#pragma once

#include <span>

#include "base/tensor_view.hpp"
#include "kernels/optim_options.hpp"

namespace concord::cpu {

using concord::AdamWOptions;
using concord::SgdOptions;

// torch.optim.SGD with dampening 0. momentum_buffers is empty when
// momentum == 0 (and ignored then).
void sgd_step(const SgdOptions& options, std::span<const TensorView> params,
              std::span<const TensorView> grads, std::span<const TensorView> momentum_buffers);

// torch.optim.AdamW (decoupled weight decay, no amsgrad).
void adamw_step(const AdamWOptions& options, std::span<const TensorView> params,
                std::span<const TensorView> grads, std::span<const TensorView> exp_avg,
                std::span<const TensorView> exp_avg_sq);

}  // namespace concord::cpu
