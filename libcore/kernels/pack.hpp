// Element conversions of fusion buffers (gradient buckets, multi-tensor
// collectives) as host/device functors: a tensor element is packed into the
// buffer's wire type times a scale, and unpacked back the same way. The CPU
// executors (kernels/cpu/multi_tensor) and the CUDA executors share them.
#pragma once

#include <cstdint>
#include <type_traits>

#include "base/dtype.hpp"
#include "base/host_device.hpp"
#include "kernels/codec.hpp"

namespace concord {

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
  using In = typename Codec<From>::Storage;
  using Out = typename Codec<To>::Storage;
  using Compute = std::conditional_t<(sizeof(typename Codec<From>::Compute) >
                                      sizeof(typename Codec<To>::Compute)),
                                     typename Codec<From>::Compute,
                                     typename Codec<To>::Compute>;

  Compute scale;

  CONCORD_HD Out operator()(In x) const {
    const Compute scaled = static_cast<Compute>(Codec<From>::load(x)) * scale;
    return Codec<To>::store(static_cast<typename Codec<To>::Compute>(scaled));
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
  CONCORD_HD double operator()(typename Codec<D>::Storage x) const {
    const double v = static_cast<double>(Codec<D>::load(x));
    return v * v;
  }
};

}  // namespace functors
}  // namespace concord
