#include "comm/gloo/partial.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "base/format.hpp"
#include "base/tensor_view.hpp"
#include "kernels/cpu/multi_tensor.hpp"
#include "kernels/cpu/reduce.hpp"

namespace concord::gloo {
namespace {

bool is_16bit_float(DType dtype) { return dtype == DType::kFloat16 || dtype == DType::kBFloat16; }

template <typename From>
void copy_into(const From* src, void* dst, DType to, std::size_t count) {
  switch (to) {
    case DType::kInt8: std::copy_n(src, count, static_cast<std::int8_t*>(dst)); return;
    case DType::kUInt8: std::copy_n(src, count, static_cast<std::uint8_t*>(dst)); return;
    case DType::kInt32: std::copy_n(src, count, static_cast<std::int32_t*>(dst)); return;
    case DType::kInt64: std::copy_n(src, count, static_cast<std::int64_t*>(dst)); return;
    default: invalid_argument("no integer conversion to ", dtype_name(to));
  }
}

}  // namespace

DType partial_dtype(DType dtype, ReduceOp op) noexcept {
  if (op == ReduceOp::kMax || op == ReduceOp::kMin) return dtype;
  if (is_16bit_float(dtype)) return DType::kFloat32;
  if (op == ReduceOp::kMean &&
      (dtype == DType::kInt8 || dtype == DType::kUInt8 || dtype == DType::kInt32))
    return DType::kInt64;
  return dtype;
}

ReduceOp partial_op(ReduceOp op) noexcept { return op == ReduceOp::kMean ? ReduceOp::kSum : op; }

void convert(const void* src, DType from, void* dst, DType to, std::size_t count) {
  if (from == to) {
    if (count != 0 && src != dst) std::memcpy(dst, src, count * dtype_size(from));
    return;
  }
  if (dtype_is_floating(from)) {
    // pack/unpack convert between floating dtypes (and round to nearest even).
    const TensorView view = TensorView::flat(const_cast<void*>(src), std::int64_t(count), from);
    cpu::pack({&view, 1}, dst, to, 1.0);
    return;
  }
  switch (from) {
    case DType::kInt8: return copy_into(static_cast<const std::int8_t*>(src), dst, to, count);
    case DType::kUInt8: return copy_into(static_cast<const std::uint8_t*>(src), dst, to, count);
    case DType::kInt32: return copy_into(static_cast<const std::int32_t*>(src), dst, to, count);
    case DType::kInt64: return copy_into(static_cast<const std::int64_t*>(src), dst, to, count);
    default: invalid_argument("no conversion from ", dtype_name(from));
  }
}

void divide_mean(void* partial, DType carried, int ranks, std::size_t count) {
  const void* sources[1] = {partial};
  cpu::reduce_sources(partial, sources, 1, count, carried, ReduceOp::kMean, ranks);
}

void finish(void* partial, void* dst, DType dtype, ReduceOp op, int ranks, std::size_t count) {
  const DType carried = partial_dtype(dtype, op);
  if (op == ReduceOp::kMean) divide_mean(partial, carried, ranks, count);
  convert(partial, carried, dst, dtype, count);
}

}  // namespace concord::gloo
