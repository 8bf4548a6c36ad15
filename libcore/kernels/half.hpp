// float16 / bfloat16 <-> float32 conversions, branch-free so the compiler
// vectorises loops over them; usable on host and device.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/reduce_op.hpp"

namespace concord {

CONCORD_HD std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
CONCORD_HD float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// bfloat16: round to nearest even; NaN stays NaN (quiet bit forced).
CONCORD_HD std::uint16_t float_to_bf16(float f) {
  std::uint32_t u = float_bits(f);
  std::uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  std::uint32_t nan = (u >> 16) | 0x40u;
  bool is_nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<std::uint16_t>(is_nan ? nan : rounded);
}
CONCORD_HD float bf16_to_float(std::uint16_t h) { return bits_float(std::uint32_t(h) << 16); }

// IEEE binary16 from float32, round to nearest even, overflow to inf,
// subnormals handled exactly, NaN kept.
CONCORD_HD std::uint16_t float_to_fp16(float f) {
  std::uint32_t u = float_bits(f);
  std::uint32_t sign = (u >> 16) & 0x8000u;
  std::uint32_t abs = u & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u);  // NaN
  if (abs >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // overflow -> inf
  if (abs < 0x38800000u) {
    // Subnormal or zero in fp16: add 0.5 (as float) so the FPU rounds the
    // mantissa to the fp16 subnormal grid (ties to even), then read it off.
    float shifted = bits_float(abs) + 0.5f;
    return static_cast<std::uint16_t>(sign | (float_bits(shifted) - 0x3F000000u));
  }
  std::uint32_t mant_odd = (abs >> 13) & 1u;
  abs += 0xC8000FFFu + mant_odd;  // rebias exponent (-112 << 23) and round
  return static_cast<std::uint16_t>(sign | (abs >> 13));
}
CONCORD_HD float fp16_to_float(std::uint16_t h) {
  std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  std::uint32_t rest = std::uint32_t(h & 0x7FFFu) << 13;
  // Scale by 2^112 to rebias; inf/NaN need their exponent set to all ones.
  float magnitude = bits_float(rest) * bits_float(0x77800000u);
  std::uint32_t m = float_bits(magnitude);
  if (rest >= 0x0F800000u) m |= 0x7F800000u;
  return bits_float(sign | m);
}

}  // namespace concord
