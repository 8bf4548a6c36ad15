// A validated, borrowed view of a DLTensor: everything below the C ABI works
// on views, never on raw DLTensors.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/dlpack.h"
#include "base/dtype.hpp"
#include "base/shape.hpp"

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
  Shape shape;  // as the caller gave it; numel is its product

  std::size_t nbytes() const noexcept {
    return static_cast<std::size_t>(numel) * dtype_size(dtype);
  }

  // Validates `tensor` (non-null, supported dtype and device, extents >= 0
  // whose product and byte size fit an int64, C-contiguous, data present
  // unless empty) and applies byte_offset. `role` names the argument in
  // error messages ("send", "recv").
  static TensorView from_dlpack(const DLTensor* tensor, const char* role);

  // A flat view of `numel` elements at `data` (shape (numel,)): buffers
  // libcore makes itself, and tests.
  static TensorView flat(void* data, std::int64_t numel, DType dtype, Device device = {});
};

}  // namespace concord
