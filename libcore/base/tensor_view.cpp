#include "base/tensor_view.hpp"

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

  std::int64_t numel = 1;
  for (int d = 0; d < tensor->ndim; ++d) {
    if (tensor->shape[d] < 0)
      invalid_argument(role, " tensor has negative extent ", tensor->shape[d], " in dim ", d);
    numel *= tensor->shape[d];
  }
  view.numel = numel;

  // C-contiguous check; extents of 1 may carry any stride (DLPack allows it).
  if (tensor->strides != nullptr && numel > 0) {
    std::int64_t expected = 1;
    for (int d = tensor->ndim - 1; d >= 0; --d) {
      if (tensor->shape[d] != 1 && tensor->strides[d] != expected)
        invalid_argument(role, " tensor is not contiguous (dim ", d, " has stride ",
                         tensor->strides[d], ", expected ", expected,
                         "); pass a C-contiguous array");
      expected *= tensor->shape[d];
    }
  }
  if (numel > 0 && tensor->data == nullptr) invalid_argument(role, " tensor has no data pointer");
  view.data = tensor->data == nullptr
                  ? nullptr
                  : static_cast<char*>(tensor->data) + tensor->byte_offset;
  return view;
}

}  // namespace concord
