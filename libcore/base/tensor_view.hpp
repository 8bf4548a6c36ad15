// A validated, borrowed view of a DLTensor: everything below the C ABI works
// on views, never on raw DLTensors.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/dtype.hpp"
#include "concord/dlpack.h"

namespace concord {

enum class DeviceKind : int { kCPU = 0, kCUDA = 1 };

struct Device {
  DeviceKind kind = DeviceKind::kCPU;
  int id = 0;
  bool operator==(const Device&) const = default;
};

const char* device_kind_name(DeviceKind kind) noexcept;

struct TensorView {
  void* data = nullptr;  // byte_offset already applied
  std::int64_t numel = 0;
  DType dtype = DType::kFloat32;
  Device device;

  std::size_t nbytes() const noexcept {
    return static_cast<std::size_t>(numel) * dtype_size(dtype);
  }

  // Validates `tensor` (non-null, supported dtype and device, C-contiguous,
  // data present unless empty) and applies byte_offset. `role` names the
  // argument in error messages ("send", "recv").
  static TensorView from_dlpack(const DLTensor* tensor, const char* role);
};

}  // namespace concord
