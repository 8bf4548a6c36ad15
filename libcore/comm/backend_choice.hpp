// Which backend a communicator's collectives use, as `init(backend=...)`
// names it.
#pragma once

#include <string_view>

namespace concord {

enum class BackendChoice {
  kAuto,  // CPU tensors: shm on one host; CUDA tensors: nccl
  kShm,   // CPU tensors only, through shared memory (every rank on one host)
  kGloo,  // CPU tensors only, through Gloo
  kNccl,  // CUDA tensors only, through NCCL
};

// Throws InvalidArgument naming the valid choices.
BackendChoice backend_choice_from_name(std::string_view name);
const char* backend_choice_name(BackendChoice choice) noexcept;

}  // namespace concord
