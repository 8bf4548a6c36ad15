// Small helpers of the device-neutral kernel fronts (kernels/multi_tensor,
// kernels/optim_step, metrics/updates): naming devices in messages, checks
// shared by their validation, and handing views to the executors.
#pragma once

#include <span>
#include <string>

#include "base/format.hpp"
#include "base/tensor_view.hpp"
#include "plugin/cuda_plugin_abi.hpp"

namespace concord::kernels {

// "cpu" or "cuda:<id>", as users name devices.
inline std::string device_str(Device device) {
  if (device.kind == DeviceKind::kCPU) return "cpu";
  return concat(device_kind_name(device.kind), ":", device.id);
}

// Whether the bytes of two views overlap; empty views overlap nothing.
inline bool overlap(const TensorView& a, const TensorView& b) {
  const auto* a0 = static_cast<const unsigned char*>(a.data);
  const auto* b0 = static_cast<const unsigned char*>(b.data);
  return a.numel != 0 && b.numel != 0 && a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

// A view as the executors' plain tensor (plugin/cuda_plugin_abi.hpp), which
// the CPU metric executor takes as well.
inline plugin::DeviceTensor device_tensor(const TensorView& t) {
  return {t.data, t.numel, t.dtype, static_cast<std::int32_t>(t.device.id)};
}

// The device a call on `tensors` runs on: that of the first tensor (the
// fronts check that the others share it); the CPU for an empty list.
inline bool on_cuda(std::span<const TensorView> tensors) {
  return !tensors.empty() && tensors.front().device.kind == DeviceKind::kCUDA;
}

}  // namespace concord::kernels
