// How each dtype's storage maps to the type kernels compute in: the one
// codec of every executor (CPU and CUDA reductions, packing, optimizers,
// metrics). Executors that need another view of a dtype (integer sums in
// wrapping unsigned arithmetic, say) adapt this codec next to their code.
#pragma once

#include <cstdint>

#include "base/dtype.hpp"
#include "base/host_device.hpp"
#include "kernels/half.hpp"

namespace concord {

// Codec<D>::Storage is an element as stored; Codec<D>::Compute the type its
// arithmetic runs in: float32 for float16 and bfloat16 (which widen to it
// exactly), the type itself otherwise. load() widens a stored element;
// store() narrows a result back, rounding to nearest even into the 16-bit
// floats. A bool is a byte: any nonzero byte loads as 1, and store() writes
// a canonical 0 or 1.
template <DType D>
struct Codec;

namespace codec_detail {

// A dtype whose storage is its compute type.
template <typename T>
struct Plain {
  using Storage = T;
  using Compute = T;
  static CONCORD_HD T load(T v) { return v; }
  static CONCORD_HD T store(T v) { return v; }
};

}  // namespace codec_detail

template <>
struct Codec<DType::kFloat16> {
  using Storage = std::uint16_t;
  using Compute = float;
  static CONCORD_HD float load(std::uint16_t v) { return fp16_to_float(v); }
  static CONCORD_HD std::uint16_t store(float v) { return float_to_fp16(v); }
};

template <>
struct Codec<DType::kBFloat16> {
  using Storage = std::uint16_t;
  using Compute = float;
  static CONCORD_HD float load(std::uint16_t v) { return bf16_to_float(v); }
  static CONCORD_HD std::uint16_t store(float v) { return float_to_bf16(v); }
};

template <>
struct Codec<DType::kFloat32> : codec_detail::Plain<float> {};
template <>
struct Codec<DType::kFloat64> : codec_detail::Plain<double> {};
template <>
struct Codec<DType::kInt8> : codec_detail::Plain<std::int8_t> {};
template <>
struct Codec<DType::kInt32> : codec_detail::Plain<std::int32_t> {};
template <>
struct Codec<DType::kInt64> : codec_detail::Plain<std::int64_t> {};
template <>
struct Codec<DType::kUInt8> : codec_detail::Plain<std::uint8_t> {};

template <>
struct Codec<DType::kBool> {
  using Storage = std::uint8_t;
  using Compute = std::uint8_t;
  static CONCORD_HD std::uint8_t load(std::uint8_t v) { return v != 0; }
  static CONCORD_HD std::uint8_t store(std::uint8_t v) { return v != 0; }
};

}  // namespace concord
