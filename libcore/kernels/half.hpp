// float16 / bfloat16 <-> float32 conversions, branch-free so the compiler
// vectorises loops over them; usable on host and device.
#pragma once

#include <cstdint>
#include <cstring>

#include "base/host_device.hpp"

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

// bfloat16: round to nearest even; NaN stays NaN (quiet bit forced). The
// choice is a mask on the 32-bit value, narrowed once at the end, which
// vectorises to fewer instructions than a select of 16-bit results.
CONCORD_HD std::uint16_t float_to_bf16(float f) {
  std::uint32_t u = float_bits(f);
  std::uint32_t rounded = u + 0x7FFFu + ((u >> 16) & 1u);
  std::uint32_t quiet_nan = u | 0x00400000u;
  std::uint32_t is_nan = 0u - std::uint32_t((u & 0x7FFFFFFFu) > 0x7F800000u);
  return static_cast<std::uint16_t>(((quiet_nan & is_nan) | (rounded & ~is_nan)) >> 16);
}
CONCORD_HD float bf16_to_float(std::uint16_t h) { return bits_float(std::uint32_t(h) << 16); }

// IEEE binary16 from float32: round to nearest even, overflow to inf,
// subnormals exact, NaN kept (as the quiet NaN 0x7E00 with its sign).
// Every case is computed and then picked with masks, with no branch, so
// loops over it vectorise.
CONCORD_HD std::uint16_t float_to_fp16(float f) {
  std::uint32_t u = float_bits(f);
  std::uint32_t sign = u & 0x80000000u;
  std::uint32_t abs = u ^ sign;
  // Normal range: rebias the exponent (-112 << 23) and round the 13 dropped
  // mantissa bits to nearest even.
  std::uint32_t normal = (abs + 0xC8000FFFu + ((abs >> 13) & 1u)) >> 13;
  // Subnormal range: one ulp of 0.5f is 2^-24, the fp16 subnormal step, so
  // adding 0.5f makes the FPU round to that grid (ties to even); the sum's
  // low bits are then the fp16 bits. The sum is a normal float, so
  // flush-to-zero modes do not disturb it.
  std::uint32_t subnormal = float_bits(bits_float(abs) + 0.5f) - 0x3F000000u;
  std::uint32_t is_subnormal = 0u - std::uint32_t(abs < 0x38800000u);
  std::uint32_t h = (subnormal & is_subnormal) | (normal & ~is_subnormal);
  std::uint32_t is_inf = 0u - std::uint32_t(abs >= 0x477FF000u);  // rounds past 65504
  h = (0x7C00u & is_inf) | (h & ~is_inf);
  std::uint32_t is_nan = 0u - std::uint32_t(abs > 0x7F800000u);
  h = (0x7E00u & is_nan) | (h & ~is_nan);
  // Assembled in the upper half and shifted down last: otherwise compilers
  // narrow each mask to 16 bits separately, which costs a pack per mask.
  return static_cast<std::uint16_t>((sign | (h << 16)) >> 16);
}

CONCORD_HD float fp16_to_float(std::uint16_t half) {
  std::uint32_t h = half;
  std::uint32_t sign = (h & 0x8000u) << 16;
  std::uint32_t rest = (h & 0x7FFFu) << 13;
  std::uint32_t exponent = rest & 0x0F800000u;
  // Rebias the exponent by 112; inf/NaN by another 112, to all ones.
  std::uint32_t is_special = 0u - std::uint32_t(exponent == 0x0F800000u);
  std::uint32_t bits = rest + 0x38000000u + (0x38000000u & is_special);
  // Subnormals: read as 2^-14 * 1.mantissa, then subtract 2^-14. No float
  // subnormal is involved, so flush-to-zero / denormals-are-zero modes (set
  // by some fast-math builds) cannot lose them.
  std::uint32_t subnormal = float_bits(bits_float(bits + 0x00800000u) - 0x1p-14f);
  std::uint32_t is_subnormal = 0u - std::uint32_t(exponent == 0u);
  bits = (subnormal & is_subnormal) | (bits & ~is_subnormal);
  return bits_float(sign | bits);
}

}  // namespace concord
