// The plugin's kernel table (plugin/cuda_plugin_abi.hpp): device memory,
// stream helpers, and the executors of multi_tensor.cu, optim.cu and
// metrics.cu behind C function pointers. libconcord finds the table through
// the exported concord_plugin_kernels().
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/entry_points.hpp"

namespace concord::cuda_exec {
namespace {

int device_alloc(std::int32_t device, std::size_t bytes, void** out) noexcept {
  return plugin::guarded([&] {
    *out = nullptr;
    DeviceGuard guard(device);
    check_cuda(cudaMalloc(out, bytes), "cudaMalloc");
  });
}

int device_free(std::int32_t device, void* ptr) noexcept {
  return plugin::guarded([&] {
    if (ptr == nullptr) return;
    DeviceGuard guard(device);
    check_cuda(cudaFree(ptr), "cudaFree");
  });
}

int stream_synchronize(std::int32_t device, Stream stream) noexcept {
  return plugin::guarded([&] {
    DeviceGuard guard(device);
    check_cuda(cudaStreamSynchronize(to_cuda(stream)), "cudaStreamSynchronize");
  });
}

int copy_to_host(std::int32_t device, void* host, const void* src, std::size_t bytes,
                 Stream stream) noexcept {
  return plugin::guarded([&] {
    if (bytes == 0) return;
    DeviceGuard guard(device);
    const cudaStream_t s = to_cuda(stream);
    check_cuda(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
    check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  });
}

const plugin::KernelsApi kTable = {
    .abi_version = plugin::kAbiVersion,
    .last_error = &plugin::last_error,
    .device_alloc = &device_alloc,
    .device_free = &device_free,
    .stream_synchronize = &stream_synchronize,
    .copy_to_host = &copy_to_host,
    .scale = &scale,
    .pack = &pack,
    .unpack = &unpack,
    .sum_of_squares = &sum_of_squares,
    .clip_by_sum_of_squares = &clip_by_sum_of_squares,
    .sgd_step = &sgd_step,
    .adamw_step = &adamw_step,
    .metric_update = &metric_update,
};

}  // namespace
}  // namespace concord::cuda_exec

extern "C" __attribute__((visibility("default"))) const concord::plugin::KernelsApi*
concord_plugin_kernels(void) {
  return &concord::cuda_exec::kTable;
}
