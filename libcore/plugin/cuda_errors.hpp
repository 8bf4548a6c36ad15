// CUDA runtime errors and the current device, for the plugin's code that
// calls the CUDA runtime: the executors (kernels/cuda) and the NCCL
// communicator (comm/nccl). Plain C++ over cuda_runtime_api.h, so it serves
// .cu and .cpp files alike.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "base/format.hpp"
#include "base/status.hpp"

namespace concord::plugin {

// The status of a CUDA error: out of memory for failed allocations,
// unavailable when there is no usable device (none, an old driver, a GPU
// this build has no code for), an internal error otherwise.
inline StatusCode status_of(cudaError_t err) {
  switch (err) {
    case cudaErrorMemoryAllocation: return StatusCode::kOutOfMemory;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorNoKernelImageForDevice: return StatusCode::kUnavailable;
    default: return StatusCode::kInternal;
  }
}

// Throws Error when `err` is not cudaSuccess, with CUDA's own name and text
// for it.
inline void check_cuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  cudaGetLastError();  // the runtime keeps it too: clear it, or a later check sees it
  fail(status_of(err), what, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
}

// Makes `device` current for the guard's lifetime and restores the device
// that was current before.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) {
      check_cuda(cudaSetDevice(device), "cudaSetDevice");
      switched_ = true;
    }
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

}  // namespace concord::plugin
