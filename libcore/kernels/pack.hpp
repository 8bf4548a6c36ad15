// Element conversions of fusion buffers (gradient buckets, multi-tensor
// collectives) as host/device functors: a tensor element is packed into the
// buffer's wire type times a scale, and unpacked back the same way. The CPU
// executors (kernels/cpu/multi_tensor) and the CUDA executors share them.
#pragma once

#include <cstdint>
#include <type_traits>

#include "base/dtype.hpp"
#include "kernels/half.hpp"
#include "base/host_device.hpp"

namespace concord {

// How a floating dtype's storage maps to the type its arithmetic runs in;
// float16 and bfloat16 compute in float32, as the reductions do.
template <DType D>
struct FloatCodec;

template <>
struct FloatCodec<DType::kFloat32> {
  using Storage = float;
  using Compute = float;
  static CONCORD_HD float load(float v) { return v; }
  static CONCORD_HD float store(float v) { return v; }
};

template <>
struct FloatCodec<DType::kFloat64> {
  using Storage = double;
  using Compute = double;
  static CONCORD_HD double load(double v) { return v; }
  static CONCORD_HD double store(double v) { return v; }
};

template <>
struct FloatCodec<DType::kBFloat16> {
  using Storage = std::uint16_t;
  using Compute = float;
  static CONCORD_HD float load(std::uint16_t v) { return bf16_to_float(v); }
  static CONCORD_HD std::uint16_t store(float v) { return float_to_bf16(v); }
};

template <>
struct FloatCodec<DType::kFloat16> {
  using Storage = std::uint16_t;
  using Compute = float;
  static CONCORD_HD float load(std::uint16_t v) { return fp16_to_float(v); }
  static CONCORD_HD std::uint16_t store(float v) { return float_to_fp16(v); }
};

// A conversion that is a copy of the bytes: the same dtype, unscaled. The
// only conversion non-floating dtypes support.
CONCORD_HD bool is_plain_copy(DType from, DType to, double factor) {
  return from == to && factor == 1.0;
}

namespace functors {

// to = from * scale. The product is taken in the wider compute type of the
// two, so a float64 gradient keeps its precision until the final rounding
// (float64 to a 16-bit type rounds through float32; the double rounding is
// below the 16-bit type's own resolution for all but exact ties).
template <DType From, DType To>
struct ScaledCast {
  using In = typename FloatCodec<From>::Storage;
  using Out = typename FloatCodec<To>::Storage;
  using Compute = std::conditional_t<(sizeof(typename FloatCodec<From>::Compute) >
                                      sizeof(typename FloatCodec<To>::Compute)),
                                     typename FloatCodec<From>::Compute,
                                     typename FloatCodec<To>::Compute>;

  Compute scale;

  CONCORD_HD Out operator()(In x) const {
    const Compute scaled = static_cast<Compute>(FloatCodec<From>::load(x)) * scale;
    return FloatCodec<To>::store(static_cast<typename FloatCodec<To>::Compute>(scaled));
  }
};

// A tensor element into a bucket's wire type, and a wire element back into a
// tensor. Named apart so call sites say which direction they run.
template <DType Src, DType Wire>
using PackElement = ScaledCast<Src, Wire>;
template <DType Wire, DType Dst>
using UnpackElement = ScaledCast<Wire, Dst>;

// x * x in float64, the accumulation type of gradient norms: float32 squares
// summed in float32 lose digits over millions of elements.
template <DType D>
struct SquareF64 {
  CONCORD_HD double operator()(typename FloatCodec<D>::Storage x) const {
    const double v = static_cast<double>(FloatCodec<D>::load(x));
    return v * v;
  }
};

}  // namespace functors
}  // namespace concord
