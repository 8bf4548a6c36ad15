// Options of the fused optimizer steps (torch.optim semantics), shared by the
// device-neutral front (kernels/optim_step), the CPU executors
// (kernels/cpu/optim) and the CUDA dispatch (kernels/cuda/launch).
#pragma once

#include <cstdint>

namespace concord {

struct SgdOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  std::int64_t step = 1;  // 1 on the first step: momentum buffers start as the gradient
};

struct AdamWOptions {
  double lr = 0.001;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  std::int64_t step = 1;  // 1-based, including this step, for the bias corrections
};

}  // namespace concord
