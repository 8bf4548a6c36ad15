// The one codec of the kernels (kernels/codec.hpp) and the one dtype
// dispatch (kernels/dispatch.hpp): every dtype's storage, compute type and
// load/store against references written here from the formats' definitions,
// and every dtype reaching its compile-time tag.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "base/dtype.hpp"
#include "base/tensor_view.hpp"
#include "kernels/codec.hpp"
#include "kernels/cpu/multi_tensor.hpp"
#include "kernels/dispatch.hpp"
#include "kernels/half.hpp"
#include "kernels/optim.hpp"
#include "status_helpers.hpp"

using concord::AllDTypes;
using concord::Codec;
using concord::DType;
using concord::FloatingDTypes;
using concord::testing::invalid_argument_message;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

using concord::bits_float;
using concord::float_bits;

// The value of a binary float from its fields: `exponent_bits` of biased
// exponent and `mantissa_bits` of fraction; the all-ones exponent is inf
// (or NaN), treated as one more binade when `past_max` (the successor of
// the largest finite value, for rounding distances).
double ref_value(std::uint32_t bits, int exponent_bits, int mantissa_bits, bool past_max = false) {
  const std::uint32_t mantissa = bits & ((1u << mantissa_bits) - 1);
  const int max_exponent = (1 << exponent_bits) - 1;
  const int exponent = static_cast<int>(bits >> mantissa_bits) & max_exponent;
  const double sign = (bits >> (mantissa_bits + exponent_bits)) & 1 ? -1.0 : 1.0;
  const int bias = max_exponent / 2;
  if (exponent == max_exponent && !past_max) return mantissa != 0 ? NAN : sign * kInf;
  if (exponent == 0) return sign * std::ldexp(mantissa, 1 - bias - mantissa_bits);
  return sign * std::ldexp((1u << mantissa_bits) + mantissa, exponent - bias - mantissa_bits);
}

double ref_fp16(std::uint16_t h) { return ref_value(h, 5, 10); }
double ref_bf16(std::uint16_t h, bool past_max = false) { return ref_value(h, 8, 7, past_max); }

bool same_value(double got, double ref) {
  return std::isnan(ref) ? std::isnan(got) : got == ref && std::signbit(got) == std::signbit(ref);
}

// bfloat16 rounding from the definition: of the two bfloat16 values around
// f (truncation and its successor), the nearer, ties to the even one.
std::uint16_t ref_bf16_round(float f) {
  const auto lo = static_cast<std::uint16_t>(float_bits(f) >> 16);
  const auto hi = static_cast<std::uint16_t>(lo + 1);
  const double below = std::fabs(static_cast<double>(f) - ref_bf16(lo));
  const double above = std::fabs(ref_bf16(hi, true) - static_cast<double>(f));
  if (below != above) return below < above ? lo : hi;
  return (lo & 1) ? hi : lo;
}

bool fp16_is_nan(std::uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0; }
bool bf16_is_nan(std::uint16_t h) { return (h & 0x7F80) == 0x7F80 && (h & 0x7F) != 0; }

// What every dtype's compute type must be: float32 for the 16-bit floats,
// the type itself otherwise (bool: a byte holding 0 or 1).
struct ComputeCase {
  DType dtype;
  std::size_t size;
  bool floating;
  bool is_signed;
};
const ComputeCase kComputeCases[] = {
    {DType::kFloat16, 4, true, true}, {DType::kBFloat16, 4, true, true},
    {DType::kFloat32, 4, true, true}, {DType::kFloat64, 8, true, true},
    {DType::kInt8, 1, false, true},   {DType::kInt32, 4, false, true},
    {DType::kInt64, 8, false, true},  {DType::kUInt8, 1, false, false},
    {DType::kBool, 1, false, false},
};

// Integers and plain floats: load and store return their argument, bit for bit.
template <DType D>
void check_plain(const std::vector<typename Codec<D>::Storage>& values) {
  using C = Codec<D>;
  STATIC_REQUIRE(std::is_same_v<typename C::Storage, typename C::Compute>);
  for (auto v : values) {
    const auto loaded = C::load(v);
    const auto stored = C::store(loaded);
    CHECK(std::memcmp(&loaded, &v, sizeof v) == 0);
    CHECK(std::memcmp(&stored, &v, sizeof v) == 0);
  }
}

// Counts the 16-bit patterns for which ok(pattern) fails, and names the first.
template <class Ok>
void check_every_pattern(Ok ok) {
  int wrong = 0;
  std::uint32_t first = 0;
  for (std::uint32_t h = 0; h < 0x10000; ++h)
    if (!ok(static_cast<std::uint16_t>(h)) && wrong++ == 0) first = h;
  INFO("first wrong pattern " << first);
  CHECK(wrong == 0);
}

}  // namespace

// ---- the codec -------------------------------------------------------------

TEST_CASE("every dtype's codec stores its dtype's size and computes in the right type",
          "[codec]") {
  int visited = 0;
  concord::for_each_dtype(AllDTypes{}, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    using C = Codec<D>;
    const ComputeCase& c = kComputeCases[visited++];
    CAPTURE(concord::dtype_name(D));
    REQUIRE(c.dtype == D);
    CHECK(sizeof(typename C::Storage) == concord::dtype_size(D));
    CHECK(sizeof(typename C::Compute) == c.size);
    CHECK(std::is_floating_point_v<typename C::Compute> == c.floating);
    CHECK(std::is_signed_v<typename C::Compute> == c.is_signed);
  });
  CHECK(visited == concord::kNumDTypes);
}

TEST_CASE("float16: every bit pattern loads to its value and stores back", "[codec]") {
  using C = Codec<DType::kFloat16>;
  check_every_pattern([](std::uint16_t bits) {
    const float value = C::load(bits);
    // NaN stores as the quiet NaN 0x7E00 with its sign.
    const std::uint16_t expected = fp16_is_nan(bits) ? (bits & 0x8000) | 0x7E00 : bits;
    return same_value(value, ref_fp16(bits)) && C::store(value) == expected;
  });
}

TEST_CASE("float16: known bit patterns, subnormals and rounding", "[codec]") {
  using C = Codec<DType::kFloat16>;
  struct Known {
    std::uint16_t bits;
    float value;
  };
  const Known known[] = {
      {0x3C00, 1.0f},        {0xC000, -2.0f},          {0x3555, 0x1.554p-2f},
      {0x7BFF, 65504.0f},    {0x0400, 0x1p-14f},       {0x03FF, 0x1.ff8p-15f},
      {0x0001, 0x1p-24f},    {0x8001, -0x1p-24f},      {0x0200, 0x1p-15f},
      {0x0000, 0.0f},        {0x8000, -0.0f},          {0x7C00, INFINITY},
      {0xFC00, -INFINITY},
  };
  for (const Known& k : known) {
    CAPTURE(k.bits, k.value);
    CHECK(same_value(C::load(k.bits), k.value));
    CHECK(C::store(k.value) == k.bits);
  }
  // Values between float16s round to nearest, ties to even, subnormals
  // included; past the largest finite value to inf.
  // The subnormal step is 2^-24.
  CHECK(C::store(0x1p-25f) == 0x0000);    // 0.5 steps: tie, to even 0
  CHECK(C::store(0x1.8p-24f) == 0x0002);  // 1.5 steps: tie, to even 2
  CHECK(C::store(0x1.4p-23f) == 0x0002);  // 2.5 steps: tie, to even 2
  CHECK(C::store(0x1.ap-23f) == 0x0003);  // 3.25 steps: nearer 3
  CHECK(C::store(0x1.2p-22f) == 0x0004);  // 4.5 steps: tie, to even 4
  CHECK(C::store(65520.0f) == 0x7C00);
  CHECK(C::store(-65519.0f) == 0xFBFF);
  CHECK(fp16_is_nan(C::store(NAN)));
}

TEST_CASE("bfloat16: every bit pattern loads to its value; stores round to nearest even",
          "[codec]") {
  using C = Codec<DType::kBFloat16>;
  check_every_pattern([](std::uint16_t bits) {
    const float value = C::load(bits);
    const std::uint16_t back = C::store(value);
    return same_value(value, ref_bf16(bits)) &&
           (bf16_is_nan(bits) ? bf16_is_nan(back) && (back & 0x8000) == (bits & 0x8000)
                              : back == bits);
  });

  std::mt19937_64 rng(0xC0DEC);
  int wrong = 0;
  std::uint32_t first = 0;
  for (int i = 0; i < 200000; ++i) {
    const float f = bits_float(static_cast<std::uint32_t>(rng()));
    const std::uint16_t got = C::store(f);
    const bool ok = std::isnan(f) ? bf16_is_nan(got) : got == ref_bf16_round(f);
    if (!ok && wrong++ == 0) first = float_bits(f);
  }
  INFO("first wrong float bits " << first);
  CHECK(wrong == 0);
  CHECK(C::store(std::numeric_limits<float>::max()) == 0x7F80);  // rounds past the largest
  CHECK(C::store(1.0f + 0x1p-8f) == 0x3F80);                     // tie: even
}

TEST_CASE("float32, float64 and the integers load and store themselves", "[codec]") {
  check_plain<DType::kFloat32>({0.0f, -0.0f, 1.5f, -3e38f, std::numeric_limits<float>::denorm_min(),
                                INFINITY, bits_float(0x7FC12345u), bits_float(0xFF800001u)});
  check_plain<DType::kFloat64>({0.0, -0.0, 1e300, -kInf, std::numeric_limits<double>::denorm_min(),
                                std::numeric_limits<double>::quiet_NaN()});
  check_plain<DType::kInt8>({0, 1, -1, INT8_MIN, INT8_MAX});
  check_plain<DType::kInt32>({0, -7, INT32_MIN, INT32_MAX});
  check_plain<DType::kInt64>({0, -7, INT64_MIN, INT64_MAX});
  check_plain<DType::kUInt8>({0, 1, 128, 255});
}

TEST_CASE("bool loads any nonzero byte as 1 and stores canonical 0 or 1", "[codec]") {
  using C = Codec<DType::kBool>;
  for (unsigned byte = 0; byte < 256; ++byte) {
    CAPTURE(byte);
    const auto b = static_cast<std::uint8_t>(byte);
    const std::uint8_t expected = byte != 0 ? 1 : 0;
    CHECK(C::load(b) == expected);
    CHECK(C::store(b) == expected);
    CHECK(C::store(C::load(b)) == expected);
  }
}

// ---- the dispatch ------------------------------------------------------------

TEST_CASE("visit_dtype brings every dtype to its own tag", "[dispatch]") {
  for (int d = 0; d < concord::kNumDTypes; ++d) {
    const auto dtype = static_cast<DType>(d);
    CAPTURE(concord::dtype_name(dtype));
    const auto [reached, storage] = concord::visit_dtype(dtype, [](auto tag) {
      constexpr DType D = decltype(tag)::value;
      return std::pair{D, sizeof(typename Codec<D>::Storage)};
    });
    CHECK(reached == dtype);
    CHECK(storage == concord::dtype_size(dtype));
  }
  // A value outside the enumeration is rejected, not sent to some kernel.
  CHECK(invalid_argument_message([] {
          concord::visit_dtype(static_cast<DType>(concord::kNumDTypes), [](auto) {});
        }) ==
        "dtype unknown is not supported here; expected one of float16, bfloat16, float32, "
        "float64, int8, int32, int64, uint8, bool");
}

TEST_CASE("visit_floating reaches the floating dtypes and rejects the others", "[dispatch]") {
  for (int d = 0; d < concord::kNumDTypes; ++d) {
    const auto dtype = static_cast<DType>(d);
    CAPTURE(concord::dtype_name(dtype));
    int calls = 0;
    auto visit = [&] {
      return concord::visit_floating(dtype, [&](auto tag) {
        ++calls;
        return decltype(tag)::value;
      });
    };
    if (concord::dtype_is_floating(dtype)) {
      CHECK(FloatingDTypes::contains(dtype));
      CHECK(visit() == dtype);
      CHECK(calls == 1);
    } else {
      CHECK_FALSE(FloatingDTypes::contains(dtype));
      CHECK(invalid_argument_message(visit) ==
            std::string("dtype ") + concord::dtype_name(dtype) +
                " is not supported here; expected one of float16, bfloat16, float32, float64");
      CHECK(calls == 0);
    }
  }
  // The optimizers' set, and a CPU executor reached with a dtype its front
  // would have refused.
  CHECK(invalid_argument_message([] {
          concord::visit(concord::OptimizerDTypes{}, DType::kBFloat16, [](auto) {});
        }) == "dtype bfloat16 is not supported here; expected one of float32, float64");
  std::int32_t ints[3] = {1, 2, 3};
  const auto view = concord::TensorView::flat(ints, 3, DType::kInt32);
  CHECK(invalid_argument_message([&] { concord::cpu::sum_of_squares({&view, 1}); }) ==
        "dtype int32 is not supported here; expected one of float16, bfloat16, float32, float64");
}

TEST_CASE("for_each_dtype visits a set in order", "[dispatch]") {
  std::vector<DType> seen;
  concord::for_each_dtype(FloatingDTypes{},
                          [&](auto tag) { seen.push_back(decltype(tag)::value); });
  CHECK(seen == std::vector<DType>{DType::kFloat16, DType::kBFloat16, DType::kFloat32,
                                   DType::kFloat64});
}
