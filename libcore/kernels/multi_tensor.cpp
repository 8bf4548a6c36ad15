#include "kernels/multi_tensor.hpp"

#include <cstddef>

#include "base/format.hpp"
#include "kernels/clip.hpp"
#include "kernels/cpu/multi_tensor.hpp"
#include "kernels/cuda/launch.hpp"
#include "kernels/front.hpp"
#include "kernels/pack.hpp"

namespace concord::kernels {
namespace {

// ---- validation: everything is checked before anything is written ----------

void check_same_device(const char* op, std::size_t index, const TensorView& t,
                       std::span<const TensorView> tensors) {
  if (!(t.device == tensors.front().device))
    invalid_argument(op, ": tensor ", index, " is on ", device_str(t.device),
                     " but tensor 0 is on ", device_str(tensors.front().device),
                     "; pass tensors on one device");
}

void check_floating(const char* op, std::span<const TensorView> tensors) {
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorView& t = tensors[i];
    check_same_device(op, i, t, tensors);
    if (!dtype_is_floating(t.dtype))
      invalid_argument(op, ": tensor ", i, " is ", dtype_name(t.dtype),
                       "; only floating dtypes (float16, bfloat16, float32, float64) are "
                       "supported");
  }
}

void check_conversions(const char* op, std::span<const TensorView> tensors, DType wire_dtype,
                       double factor) {
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorView& t = tensors[i];
    check_same_device(op, i, t, tensors);
    if (is_plain_copy(t.dtype, wire_dtype, factor)) continue;
    if (!dtype_is_floating(t.dtype) || !dtype_is_floating(wire_dtype))
      invalid_argument(op, ": tensor ", i, " is ", dtype_name(t.dtype), " and the buffer is ",
                       dtype_name(wire_dtype), " with factor ", factor,
                       ": only floating dtypes convert or scale; other dtypes copy into their "
                       "own dtype with factor 1");
  }
}

// A one-element float64 tensor (`role`) beside `tensors`: on their device
// and sharing no memory with them (it is written, or read while they are).
void check_scalar(const char* op, const char* role, const TensorView& scalar,
                  std::span<const TensorView> tensors) {
  if (scalar.dtype != DType::kFloat64 || scalar.numel != 1)
    invalid_argument(op, ": ", role, " is ", dtype_name(scalar.dtype), " with ", scalar.numel,
                     scalar.numel == 1 ? " element" : " elements",
                     "; expected one float64 element");
  if (!tensors.empty() && !(scalar.device == tensors.front().device))
    invalid_argument(op, ": ", role, " is on ", device_str(scalar.device), " but tensor 0 is on ",
                     device_str(tensors.front().device), "; pass tensors on one device");
  for (std::size_t i = 0; i < tensors.size(); ++i)
    if (overlap(scalar, tensors[i]))
      invalid_argument(op, ": ", role, " shares memory with tensor ", i);
}

}  // namespace

void pack(std::span<const TensorView> tensors, void* wire, DType wire_dtype, double factor,
          plugin::Stream stream) {
  check_conversions("pack", tensors, wire_dtype, factor);
  if (on_cuda(tensors))
    cuda::pack(tensors, wire, wire_dtype, factor, stream);
  else
    cpu::pack(tensors, wire, wire_dtype, factor);
}

void unpack(const void* wire, DType wire_dtype, std::span<const TensorView> tensors,
            double factor, plugin::Stream stream) {
  check_conversions("unpack", tensors, wire_dtype, factor);
  if (on_cuda(tensors))
    cuda::unpack(wire, wire_dtype, tensors, factor, stream);
  else
    cpu::unpack(wire, wire_dtype, tensors, factor);
}

void scale(std::span<const TensorView> tensors, double factor, plugin::Stream stream) {
  check_floating("scale", tensors);
  if (on_cuda(tensors))
    cuda::scale(tensors, factor, stream);
  else
    cpu::scale(tensors, factor);
}

double sum_of_squares(std::span<const TensorView> tensors, plugin::Stream stream) {
  check_floating("sum_of_squares", tensors);
  return on_cuda(tensors) ? cuda::sum_of_squares(tensors, stream) : cpu::sum_of_squares(tensors);
}

void sum_of_squares_into(std::span<const TensorView> tensors, const TensorView& result,
                         plugin::Stream stream) {
  constexpr const char* op = "sum_of_squares_into";
  check_floating(op, tensors);
  check_scalar(op, "result", result, tensors);
  if (result.device.kind == DeviceKind::kCUDA)
    cuda::sum_of_squares_into(tensors, result, stream);
  else
    *static_cast<double*>(result.data) = cpu::sum_of_squares(tensors);
}

void clip_by_sum_of_squares(std::span<const TensorView> tensors, const TensorView& sum_sq,
                            double max_norm, plugin::Stream stream) {
  constexpr const char* op = "clip_by_sum_of_squares";
  if (!(max_norm >= 0.0)) invalid_argument(op, ": max_norm must be >= 0, got ", max_norm);
  check_floating(op, tensors);
  check_scalar(op, "sum_of_squares", sum_sq, tensors);
  if (tensors.empty()) return;
  if (sum_sq.device.kind == DeviceKind::kCUDA)
    cuda::clip_by_sum_of_squares(tensors, sum_sq, max_norm, stream);
  else
    cpu::scale(tensors,
               functors::clip_coefficient(*static_cast<const double*>(sum_sq.data), max_norm));
}

}  // namespace concord::kernels
