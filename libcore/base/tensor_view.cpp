#include "base/tensor_view.hpp"

#include <algorithm>
#include <cstdint>

#include "base/format.hpp"

namespace concord {

const char* device_kind_name(DeviceKind kind) noexcept {
  return kind == DeviceKind::kCUDA ? "cuda" : "cpu";
}

namespace {

Device device_from_dlpack(DLDevice dev, const char* role) {
  switch (dev.device_type) {
    case kDLCPU:
    case kDLCUDAHost:
      return {DeviceKind::kCPU, 0};
    case kDLCUDA:
    case kDLCUDAManaged:
      return {DeviceKind::kCUDA, dev.device_id};
    default:
      invalid_argument(role, " tensor is on an unsupported device (DLPack device type ",
                       int(dev.device_type), "); supported: cpu, cuda");
  }
}

}  // namespace

TensorView TensorView::from_dlpack(const DLTensor* tensor, const char* role) {
  if (tensor == nullptr) invalid_argument(role, " tensor is NULL");
  if (tensor->ndim < 0) invalid_argument(role, " tensor has negative ndim ", tensor->ndim);
  if (tensor->ndim > 0 && tensor->shape == nullptr)
    invalid_argument(role, " tensor has ndim ", tensor->ndim, " but no shape");

  TensorView view;
  view.dtype = dtype_from_dlpack(tensor->dtype);
  view.device = device_from_dlpack(tensor->device, role);

  view.shape = Shape(tensor->shape, static_cast<std::size_t>(tensor->ndim));
  for (int d = 0; d < tensor->ndim; ++d)
    if (view.shape[d] < 0)
      invalid_argument(role, " tensor has negative extent ", view.shape[d], " in dim ", d);
  // The byte count must fit an int64: a product that wrapped around would
  // describe a small tensor over a huge one. (An empty tensor has none.)
  const bool empty = std::find(view.shape.begin(), view.shape.end(), 0) != view.shape.end();
  const std::int64_t max_numel = INT64_MAX / static_cast<std::int64_t>(dtype_size(view.dtype));
  std::int64_t numel = 1;
  for (int d = 0; d < tensor->ndim && !empty; ++d) {
    if (numel > max_numel / view.shape[d])
      invalid_argument(role, " tensor of shape ", view.shape.str(), " holds more bytes than ",
                       "fit in an int64");
    numel *= view.shape[d];
  }
  view.numel = empty ? 0 : numel;

  // C-contiguous check; extents of 1 may carry any stride (DLPack allows it).
  if (tensor->strides != nullptr && view.numel > 0) {
    std::int64_t expected = 1;
    for (int d = tensor->ndim - 1; d >= 0; --d) {
      if (tensor->shape[d] != 1 && tensor->strides[d] != expected)
        invalid_argument(role, " tensor is not contiguous (dim ", d, " has stride ",
                         tensor->strides[d], ", expected ", expected,
                         "); pass a C-contiguous array");
      expected *= tensor->shape[d];
    }
  }
  if (view.numel > 0 && tensor->data == nullptr) invalid_argument(role, " tensor has no data pointer");
  view.data = tensor->data == nullptr
                  ? nullptr
                  : static_cast<char*>(tensor->data) + tensor->byte_offset;
  return view;
}

TensorView TensorView::flat(void* data, std::int64_t numel, DType dtype, Device device) {
  TensorView view;
  view.data = data;
  view.numel = numel;
  view.dtype = dtype;
  view.device = device;
  view.shape = Shape{numel};
  return view;
}

}  // namespace concord
