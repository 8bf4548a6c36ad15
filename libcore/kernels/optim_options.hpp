// Options of the fused optimizer steps (torch.optim semantics), shared by the
// device-neutral front (kernels/optim_step), the CPU executors
// (kernels/cpu/optim) and the CUDA dispatch (kernels/cuda/launch). They
// have no defaults here: those belong to the public signatures (Python, and
// the C ABI's _INIT macros), and every caller passes every field.
#pragma once

#include <cstdint>

namespace concord {

struct SgdOptions {
  double lr;
  double momentum;
  double weight_decay;
  bool nesterov;
  std::int64_t step;  // 1 on the first step: momentum buffers start as the gradient
};

struct AdamWOptions {
  double lr;
  double beta1;
  double beta2;
  double eps;
  double weight_decay;
  std::int64_t step;  // 1-based, including this step, for the bias corrections
};

}  // namespace concord
