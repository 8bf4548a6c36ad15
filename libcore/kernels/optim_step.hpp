// Fused optimizer steps on CPU or CUDA tensors: one call updates every
// parameter, with torch.optim semantics. Parameters, gradients and states
// match pairwise in dtype (float32 or float64; it may differ between
// parameters) and shape, share no memory, and all sit on one device.
// Options and tensors are validated before any tensor is written;
// then the CPU executor (kernels/cpu/optim) runs, or, for CUDA tensors, the
// CUDA plugin's, enqueued on `stream` (nullptr: the legacy default stream)
// without waiting for it.
#pragma once

#include <span>

#include "base/tensor_view.hpp"
#include "kernels/optim_options.hpp"
#include "plugin/cuda_plugin_abi.hpp"

namespace concord::kernels {

// torch.optim.SGD with dampening 0. momentum_buffers is empty when
// momentum == 0 (and ignored then).
void sgd_step(const SgdOptions& options, std::span<const TensorView> params,
              std::span<const TensorView> grads, std::span<const TensorView> momentum_buffers,
              plugin::Stream stream = nullptr);

// torch.optim.AdamW (decoupled weight decay, no amsgrad).
void adamw_step(const AdamWOptions& options, std::span<const TensorView> params,
                std::span<const TensorView> grads, std::span<const TensorView> exp_avg,
                std::span<const TensorView> exp_avg_sq, plugin::Stream stream = nullptr);

}  // namespace concord::kernels
