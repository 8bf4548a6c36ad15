// CPU reduction executors and the float16/bfloat16 conversions they use,
// checked against plain scalar references written here from the formats'
// definitions.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "base/status.hpp"
#include "kernels/cpu/reduce.hpp"
#include "kernels/half.hpp"
#include "base/reduce_op.hpp"
#include "status_helpers.hpp"

using concord::DType;
using concord::Error;
using concord::ReduceOp;
using concord::StatusCode;
using concord::cpu::reduce_sources;
using concord::testing::invalid_argument_message;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr float kInfF = std::numeric_limits<float>::infinity();

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// ---- reference conversions, from the formats' definitions ----

double ref_fp16_value(std::uint16_t h) {
  int exponent = (h >> 10) & 0x1F;
  int mantissa = h & 0x3FF;
  double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exponent == 0x1F) return mantissa ? kNaN : sign * kInf;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

// bfloat16 is the upper half of a float32.
double ref_bf16_value(std::uint16_t h) { return float_of(std::uint32_t(h) << 16); }

bool fp16_is_nan(std::uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0; }
bool bf16_is_nan(std::uint16_t h) { return (h & 0x7F80) == 0x7F80 && (h & 0x7F) != 0; }

// Nearest float16 to `x` (ties to even) as bits; NaN maps to 0x7E00.
std::uint16_t ref_fp16_bits(double x) {
  if (std::isnan(x)) return 0x7E00;
  std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  double a = std::fabs(x);
  if (a >= 65520.0) return sign | 0x7C00;  // 65520 is the tie above 65504
  int e;
  std::frexp(a, &e);  // a in [2^(e-1), 2^e)
  double quantum = std::ldexp(1.0, std::max(e - 1, -14) - 10);
  double k = std::nearbyint(a / quantum);  // default rounding: ties to even
  double v = k * quantum;
  if (v < 0x1p-14) return sign | static_cast<std::uint16_t>(k);
  std::frexp(v, &e);
  int exponent = e - 1;
  auto mantissa = static_cast<std::uint16_t>(std::ldexp(v, 10 - exponent) - 1024);
  return sign | static_cast<std::uint16_t>((exponent + 15) << 10) | mantissa;
}

// Nearest bfloat16 to `x` (ties to even) as bits; NaN maps to 0x7FC0.
std::uint16_t ref_bf16_bits(float x) {
  if (std::isnan(x)) return 0x7FC0;
  std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isinf(x)) return sign | 0x7F80;
  double a = std::fabs(double(x));
  int e;
  std::frexp(a, &e);
  double quantum = std::ldexp(1.0, std::max(e - 1, -126) - 7);
  double v = std::nearbyint(a / quantum) * quantum;
  if (v >= 0x1p128) return sign | 0x7F80;
  return sign | static_cast<std::uint16_t>(bits_of(static_cast<float>(v)) >> 16);
}

std::string hex(std::uint32_t v) {
  std::ostringstream out;
  out << "0x" << std::hex << v;
  return out.str();
}

// ---- element types under test ----

template <typename S, DType D>
struct Elem {
  using Storage = S;
  static constexpr DType dtype = D;
  static constexpr bool is_half = D == DType::kFloat16 || D == DType::kBFloat16;
  static constexpr bool is_float = is_half || std::is_floating_point_v<S>;
};
using Float16 = Elem<std::uint16_t, DType::kFloat16>;
using BFloat16 = Elem<std::uint16_t, DType::kBFloat16>;
using Float32 = Elem<float, DType::kFloat32>;
using Float64 = Elem<double, DType::kFloat64>;
using Int8 = Elem<std::int8_t, DType::kInt8>;
using Int32 = Elem<std::int32_t, DType::kInt32>;
using Int64 = Elem<std::int64_t, DType::kInt64>;
using UInt8 = Elem<std::uint8_t, DType::kUInt8>;
using Bool = Elem<std::uint8_t, DType::kBool>;

template <class E>
double value_of(typename E::Storage v) {
  if constexpr (E::dtype == DType::kFloat16) return ref_fp16_value(v);
  else if constexpr (E::dtype == DType::kBFloat16) return ref_bf16_value(v);
  else return static_cast<double>(v);
}

template <class E>
typename E::Storage nan_of() {
  if constexpr (E::dtype == DType::kFloat16) return 0x7E00;
  else if constexpr (E::dtype == DType::kBFloat16) return 0x7FC0;
  else return std::numeric_limits<typename E::Storage>::quiet_NaN();
}

// Random values. Floats get a random sign, mantissa and an exponent spread
// over [2^-20, 8) (float16: down into its subnormals), so that products of
// five stay finite. Integers use their full range, except int64 means,
// whose sums must not overflow for the mean to be exact.
template <class E>
typename E::Storage draw(std::mt19937_64& rng, ReduceOp op) {
  using S = typename E::Storage;
  std::uint64_t r = rng();
  std::uint64_t sign = r >> 63;
  auto exponent = [&](int lo, int hi) { return lo + static_cast<int>((r >> 40) % (hi - lo + 1)); };
  if constexpr (E::dtype == DType::kFloat16) {
    return static_cast<S>(sign << 15 | std::uint64_t(exponent(0, 17)) << 10 | (r & 0x3FF));
  } else if constexpr (E::dtype == DType::kBFloat16) {
    return static_cast<S>(sign << 15 | std::uint64_t(exponent(107, 129)) << 7 | (r & 0x7F));
  } else if constexpr (E::dtype == DType::kFloat32) {
    std::uint64_t u = sign << 31 | std::uint64_t(exponent(107, 129)) << 23 | (r & 0x7FFFFF);
    return float_of(static_cast<std::uint32_t>(u));
  } else if constexpr (E::dtype == DType::kFloat64) {
    std::uint64_t u = sign << 63 | std::uint64_t(exponent(1003, 1025)) << 52 |
                      (rng() & 0xFFFFFFFFFFFFFull);
    double d;
    std::memcpy(&d, &u, sizeof d);
    return d;
  } else if constexpr (E::dtype == DType::kBool) {
    return static_cast<S>(r & 1);
  } else if constexpr (E::dtype == DType::kInt64) {
    return op == ReduceOp::kMean ? static_cast<S>(r) >> 3 : static_cast<S>(r);
  } else {
    return static_cast<S>(r);
  }
}

// One output element of the reduction over in[0..n), computed independently
// of the executors: doubles for floats, 64-bit wrapping arithmetic for ints.
// Returns an empty string when `got` is right, else a description.
template <class E>
std::string check_element(ReduceOp op, const std::vector<typename E::Storage>& in,
                          int divisor, typename E::Storage got) {
  using S = typename E::Storage;
  auto mismatch = [](auto ref, auto got) {
    std::ostringstream why;
    why << "expected " << ref << ", got " << got;
    return why.str();
  };
  if constexpr (E::is_float) {
    double ref = 0, magnitude = 0;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMean:
        for (S x : in) ref += value_of<E>(x), magnitude += std::fabs(value_of<E>(x));
        if (op == ReduceOp::kMean) ref /= divisor, magnitude /= divisor;
        break;
      case ReduceOp::kProd:
        ref = 1;
        for (S x : in) ref *= value_of<E>(x);
        magnitude = std::fabs(ref);
        break;
      case ReduceOp::kMax:
      case ReduceOp::kMin:
        ref = value_of<E>(in[0]);
        for (S x : in) {
          double v = value_of<E>(x);
          if (std::isnan(v) || std::isnan(ref)) ref = kNaN;
          else ref = op == ReduceOp::kMax ? std::max(ref, v) : std::min(ref, v);
        }
        break;
    }
    double g = value_of<E>(got);
    if (std::isnan(ref) || std::isnan(g)) {
      if (std::isnan(ref) && std::isnan(g)) return {};
    } else if (op == ReduceOp::kMax || op == ReduceOp::kMin) {
      if (g == ref) return {};  // the result is one of the inputs, exactly
    } else {
      double tolerance;
      if constexpr (E::is_half) {
        // One ulp of the result type at the result, plus the float32
        // accumulation error over the inputs.
        int e;
        std::frexp(std::max(std::fabs(ref), std::fabs(g)), &e);
        int min_exponent = E::dtype == DType::kFloat16 ? -14 : -126;
        int mantissa_bits = E::dtype == DType::kFloat16 ? 10 : 7;
        tolerance = std::ldexp(1.0, std::max(e - 1, min_exponent) - mantissa_bits) +
                    1e-6 * magnitude;
      } else {
        // Relative to the result, or to the inputs' magnitude when they cancel.
        double rel = E::dtype == DType::kFloat32 ? 1e-5 : 1e-12;
        tolerance = rel * std::max(std::fabs(ref), magnitude);
      }
      if (std::fabs(g - ref) <= tolerance) return {};
    }
    return mismatch(ref, g);
  } else {
    std::int64_t ref = 0;
    if (op == ReduceOp::kSum || op == ReduceOp::kProd) {
      std::uint64_t acc = op == ReduceOp::kSum ? 0 : 1;
      for (S x : in) {
        auto v = static_cast<std::uint64_t>(static_cast<std::int64_t>(x));
        acc = op == ReduceOp::kSum ? acc + v : acc * v;
      }
      ref = static_cast<S>(acc);  // wraps modulo 2^bits
    } else if (op == ReduceOp::kMean) {
      for (S x : in) ref += x;
      ref /= divisor;  // truncates toward zero
    } else {
      ref = in[0];
      for (S x : in) ref = op == ReduceOp::kMax ? std::max<std::int64_t>(ref, x)
                                                : std::min<std::int64_t>(ref, x);
    }
    if (static_cast<std::int64_t>(got) == ref) return {};
    return mismatch(ref, static_cast<std::int64_t>(got));
  }
}

enum class Dst { kSeparate, kFirstSource, kLastSource, kMiddleSource };

struct Case {
  ReduceOp op;
  int nsrc;
  std::size_t count;
  Dst dst = Dst::kSeparate;
  int divisor = 0;  // 0: nsrc
  std::size_t misalign = 0;  // elements the buffers start past their allocation
};

// Draws fresh sources, reduces them and checks every element against the
// reference, and that nothing past `count` in dst was written.
template <class E>
void check_case(std::mt19937_64& rng, const Case& c) {
  using S = typename E::Storage;
  constexpr std::size_t kGuard = 16;
  const S sentinel = static_cast<S>(0x5A);
  const int divisor = c.divisor ? c.divisor : c.nsrc;
  INFO("dtype " << concord::dtype_name(E::dtype) << ", op " << concord::reduce_op_name(c.op)
                << ", nsrc " << c.nsrc << ", count " << c.count << ", dst "
                << static_cast<int>(c.dst) << ", divisor " << divisor << ", misalign "
                << c.misalign);

  std::vector<std::vector<S>> buffers(c.nsrc + 1,
                                      std::vector<S>(c.misalign + c.count + kGuard, sentinel));
  for (int k = 0; k < c.nsrc; ++k)
    for (std::size_t i = 0; i < c.count; ++i) buffers[k][c.misalign + i] = draw<E>(rng, c.op);
  const std::vector<std::vector<S>> inputs(buffers.begin(), buffers.begin() + c.nsrc);

  std::vector<const void*> srcs;
  for (int k = 0; k < c.nsrc; ++k) srcs.push_back(buffers[k].data() + c.misalign);
  int dst_index = c.dst == Dst::kSeparate       ? c.nsrc
                  : c.dst == Dst::kFirstSource  ? 0
                  : c.dst == Dst::kLastSource   ? c.nsrc - 1
                                                : c.nsrc / 2;
  S* dst = buffers[dst_index].data() + c.misalign;

  reduce_sources(dst, srcs.data(), c.nsrc, c.count, E::dtype, c.op, divisor);

  std::size_t mismatches = 0;
  std::string first;
  std::vector<S> column(c.nsrc);
  for (std::size_t i = 0; i < c.count; ++i) {
    for (int k = 0; k < c.nsrc; ++k) column[k] = inputs[k][c.misalign + i];
    std::string why = check_element<E>(c.op, column, divisor, dst[i]);
    if (!why.empty() && mismatches++ == 0) first = "element " + std::to_string(i) + ": " + why;
  }
  INFO(first);
  CHECK(mismatches == 0);
  bool guard_intact = true;
  for (std::size_t i = 0; i < kGuard; ++i) guard_intact &= dst[c.count + i] == sentinel;
  CHECK(guard_intact);
}

template <class E>
std::vector<ReduceOp> ops_for() {
  if (E::dtype == DType::kBool) return {ReduceOp::kMax, ReduceOp::kMin};
  return {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kMean};
}

// The executors work in blocks of 2048 elements; 6149 ends mid-block.
constexpr std::size_t kCounts[] = {0, 1, 7, 2048, 6149};
constexpr std::size_t kLargeCount = 1000003;

}  // namespace

// ---- conversions ----

TEST_CASE("fp16_to_float decodes every float16 bit pattern", "[half]") {
  int wrong = 0;
  std::uint32_t first = 0;
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    double ref = ref_fp16_value(static_cast<std::uint16_t>(h));
    float got = concord::fp16_to_float(static_cast<std::uint16_t>(h));
    bool ok = std::isnan(ref) ? std::isnan(got)
                              : got == ref && std::signbit(got) == std::signbit(ref);
    if (!ok && wrong++ == 0) first = h;
  }
  INFO("first wrong pattern " << hex(first));
  CHECK(wrong == 0);
}

TEST_CASE("float16 -> float -> float16 round-trips every bit pattern", "[half]") {
  int wrong = 0;
  std::uint32_t first = 0;
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    auto bits = static_cast<std::uint16_t>(h);
    std::uint16_t back = concord::float_to_fp16(concord::fp16_to_float(bits));
    bool ok = fp16_is_nan(bits) ? fp16_is_nan(back) && (back & 0x8000) == (bits & 0x8000)
                                : back == bits;
    if (!ok && wrong++ == 0) first = h;
  }
  INFO("first wrong pattern " << hex(first));
  CHECK(wrong == 0);
}

TEST_CASE("float_to_fp16 rounds every float16 midpoint to even", "[half]") {
  // Between each finite float16 h and its successor (the last one's is inf):
  // the midpoint goes to the even one, one float ulp off it to the nearer.
  int wrong = 0;
  std::string first;
  for (std::uint32_t h = 0; h <= 0x7BFF; ++h) {
    for (std::uint32_t sign : {0u, 0x8000u}) {
      auto lo = static_cast<std::uint16_t>(h | sign);
      auto hi = static_cast<std::uint16_t>((h + 1) | sign);
      double mid_value = (ref_fp16_value(lo) + (h == 0x7BFF ? (sign ? -65536.0 : 65536.0)
                                                            : ref_fp16_value(hi))) / 2;
      auto mid = static_cast<float>(mid_value);  // exact: 12 significant bits
      std::uint16_t even = (h & 1) ? hi : lo;
      float below = std::nextafter(mid, 0.0f);
      float above = std::nextafter(mid, sign ? -kInfF : kInfF);
      bool ok = concord::float_to_fp16(mid) == even && concord::float_to_fp16(below) == lo &&
                concord::float_to_fp16(above) == hi;
      if (!ok && wrong++ == 0) first = hex(lo);
    }
  }
  INFO("first wrong pair starts at " << first);
  CHECK(wrong == 0);
}

TEST_CASE("float_to_fp16 matches a reference rounding", "[half]") {
  auto check = [](float f) {
    std::uint16_t got = concord::float_to_fp16(f);
    std::uint16_t ref = ref_fp16_bits(f);
    return std::isnan(f) ? fp16_is_nan(got) && (got & 0x8000) == (bits_of(f) >> 16 & 0x8000)
                         : got == ref;
  };

  SECTION("edge values") {
    struct Edge {
      float in;
      std::uint16_t out;
    };
    const Edge edges[] = {
        {0.0f, 0x0000},
        {-0.0f, 0x8000},
        {1.0f, 0x3C00},
        {-2.0f, 0xC000},
        {65504.0f, 0x7BFF},
        {65519.99f, 0x7BFF},
        {65520.0f, 0x7C00},  // the tie above the largest finite rounds to inf
        {-65520.0f, 0xFC00},
        {65536.0f, 0x7C00},
        {1e30f, 0x7C00},
        {static_cast<float>(kInf), 0x7C00},
        {static_cast<float>(-kInf), 0xFC00},
        {0x1p-14f, 0x0400},              // smallest normal
        {0x1p-14f - 0x1p-25f, 0x0400},   // tie between 0x3FF and 0x400: even
        {0x1p-24f, 0x0001},              // smallest subnormal
        {0x1p-25f, 0x0000},              // tie with zero: even
        {-0x1p-25f, 0x8000},
        {0x1.8p-24f, 0x0002},            // tie between 1 and 2: even
        {0x1.000002p-25f, 0x0001},       // just past the tie
        {0x1p-26f, 0x0000},
        {std::numeric_limits<float>::denorm_min(), 0x0000},
        {1.0f + 0x1p-11f, 0x3C00},       // tie between 1 and its successor: even
        {1.0f + 0x1.8p-10f, 0x3C02},     // tie between 0x3C01 and 0x3C02: even
    };
    for (const auto& e : edges) {
      CAPTURE(e.in);
      CHECK(hex(concord::float_to_fp16(e.in)) == hex(e.out));
      CHECK(hex(ref_fp16_bits(e.in)) == hex(e.out));
    }
    for (std::uint32_t nan : {0x7FC00000u, 0x7F800001u, 0xFFC00000u, 0x7FFFFFFFu}) {
      CAPTURE(hex(nan));
      CHECK(check(float_of(nan)));
    }
  }
  SECTION("random bit patterns and random values in range") {
    std::mt19937_64 rng(0xF16);
    std::uniform_int_distribution<int> exponent(-27, 16);
    std::uniform_real_distribution<float> mantissa(-2.0f, 2.0f);
    int wrong = 0;
    float first = 0;
    for (int i = 0; i < 500000; ++i) {
      float any = float_of(static_cast<std::uint32_t>(rng()));
      float in_range = std::ldexp(mantissa(rng), exponent(rng));
      for (float f : {any, in_range})
        if (!check(f) && wrong++ == 0) first = f;
    }
    INFO("first wrong input " << first << " (" << hex(bits_of(first)) << ")");
    CHECK(wrong == 0);
  }
}

TEST_CASE("bfloat16 conversions", "[half]") {
  SECTION("every bit pattern decodes to the upper half of a float and round-trips") {
    int wrong = 0;
    std::uint32_t first = 0;
    for (std::uint32_t h = 0; h < 0x10000; ++h) {
      auto bits = static_cast<std::uint16_t>(h);
      float f = concord::bf16_to_float(bits);
      std::uint16_t back = concord::float_to_bf16(f);
      bool ok = bits_of(f) == h << 16 &&
                (bf16_is_nan(bits) ? bf16_is_nan(back) && (back & 0x8000) == (bits & 0x8000)
                                   : back == bits);
      if (!ok && wrong++ == 0) first = h;
    }
    INFO("first wrong pattern " << hex(first));
    CHECK(wrong == 0);
  }
  SECTION("every midpoint rounds to even") {
    int wrong = 0;
    std::uint32_t first = 0;
    for (std::uint32_t h = 0; h < 0x10000; ++h) {
      if ((h & 0x7F80) == 0x7F80) continue;  // inf and NaN have no successor
      std::uint32_t mid = h << 16 | 0x8000;
      auto lo = static_cast<std::uint16_t>(h);
      auto hi = static_cast<std::uint16_t>(h + 1);  // may become inf: still right
      std::uint16_t even = (h & 1) ? hi : lo;
      bool ok = concord::float_to_bf16(float_of(mid)) == even &&
                concord::float_to_bf16(float_of(mid - 1)) == lo &&
                concord::float_to_bf16(float_of(mid + 1)) == hi;
      if (!ok && wrong++ == 0) first = h;
    }
    INFO("first wrong pair starts at " << hex(first));
    CHECK(wrong == 0);
  }
  SECTION("edge values") {
    CHECK(concord::float_to_bf16(0.0f) == 0x0000);
    CHECK(concord::float_to_bf16(-0.0f) == 0x8000);
    CHECK(concord::float_to_bf16(static_cast<float>(kInf)) == 0x7F80);
    CHECK(concord::float_to_bf16(static_cast<float>(-kInf)) == 0xFF80);
    CHECK(concord::float_to_bf16(std::numeric_limits<float>::max()) == 0x7F80);
    CHECK(concord::float_to_bf16(std::numeric_limits<float>::denorm_min()) == 0x0000);
    CHECK(concord::float_to_bf16(1.0f + 0x1p-8f) == 0x3F80);  // tie: even
    CHECK(concord::float_to_bf16(1.0f + 0x1.8p-7f) == 0x3F82);  // tie: even
    // A signalling NaN whose payload lies only in the dropped bits must not
    // truncate to inf.
    CHECK(bf16_is_nan(concord::float_to_bf16(float_of(0x7F800001u))));
    CHECK((concord::float_to_bf16(float_of(0xFF800001u)) & 0x8000) != 0);
    CHECK(bf16_is_nan(concord::float_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  }
  SECTION("random floats match a reference rounding") {
    std::mt19937_64 rng(0xBF16);
    int wrong = 0;
    std::uint32_t first = 0;
    for (int i = 0; i < 1000000; ++i) {
      auto u = static_cast<std::uint32_t>(rng());
      float f = float_of(u);
      std::uint16_t got = concord::float_to_bf16(f);
      bool ok = std::isnan(f) ? bf16_is_nan(got) : got == ref_bf16_bits(f);
      if (!ok && wrong++ == 0) first = u;
    }
    INFO("first wrong input " << hex(first));
    CHECK(wrong == 0);
  }
}

// ---- reduce ops ----

TEST_CASE("reduce ops: names and dtype support", "[reduce]") {
  CHECK(std::string(concord::reduce_op_name(ReduceOp::kSum)) == "sum");
  CHECK(std::string(concord::reduce_op_name(ReduceOp::kProd)) == "prod");
  CHECK(std::string(concord::reduce_op_name(ReduceOp::kMax)) == "max");
  CHECK(std::string(concord::reduce_op_name(ReduceOp::kMin)) == "min");
  CHECK(std::string(concord::reduce_op_name(ReduceOp::kMean)) == "mean");

  for (int d = 0; d < concord::kNumDTypes; ++d) {
    auto dtype = static_cast<DType>(d);
    bool is_bool = dtype == DType::kBool;
    CAPTURE(concord::dtype_name(dtype));
    CHECK(concord::reduce_op_supported(ReduceOp::kMax, dtype));
    CHECK(concord::reduce_op_supported(ReduceOp::kMin, dtype));
    CHECK(concord::reduce_op_supported(ReduceOp::kSum, dtype) == !is_bool);
    CHECK(concord::reduce_op_supported(ReduceOp::kProd, dtype) == !is_bool);
    CHECK(concord::reduce_op_supported(ReduceOp::kMean, dtype) == !is_bool);
    CHECK_NOTHROW(concord::check_reduce_op(ReduceOp::kMax, dtype));
  }

  CHECK(invalid_argument_message([] {
          concord::check_reduce_op(ReduceOp::kSum, DType::kBool);
        }) == "reduction 'sum' is not supported for dtype bool; bool supports max and min");
  CHECK(invalid_argument_message([] {
          concord::check_reduce_op(ReduceOp::kMean, DType::kBool);
        }) == "reduction 'mean' is not supported for dtype bool; bool supports max and min");
  CHECK_THAT(invalid_argument_message([] {
               concord::check_reduce_op(static_cast<ReduceOp>(17), DType::kFloat32);
             }),
             Catch::Matchers::Contains("unknown reduction op 17"));
}

TEMPLATE_TEST_CASE("reduce_sources matches a scalar reference", "[reduce]", Float16, BFloat16,
                   Float32, Float64, Int8, Int32, Int64, UInt8, Bool) {
  for (ReduceOp op : ops_for<TestType>()) {
    DYNAMIC_SECTION(concord::reduce_op_name(op)) {
      std::mt19937_64 rng(0xC0DC0 + static_cast<int>(op));
      for (int nsrc = 1; nsrc <= 5; ++nsrc)
        for (std::size_t count : kCounts) check_case<TestType>(rng, {op, nsrc, count});
      check_case<TestType>(rng, {op, 3, kLargeCount});
    }
  }
}

TEMPLATE_TEST_CASE("reduce_sources may write over a source", "[reduce]", Float16, BFloat16,
                   Float32, Float64, Int8, Int32, Int64, UInt8, Bool) {
  std::mt19937_64 rng(0xA11A5);
  for (ReduceOp op : ops_for<TestType>()) {
    for (int nsrc : {1, 2, 3, 5}) {
      check_case<TestType>(rng, {op, nsrc, 6149, Dst::kFirstSource});
      check_case<TestType>(rng, {op, nsrc, 6149, Dst::kLastSource});
      check_case<TestType>(rng, {op, nsrc, 6149, Dst::kMiddleSource});
    }
  }
  check_case<TestType>(rng, {ops_for<TestType>()[0], 4, kLargeCount, Dst::kLastSource});
}

TEMPLATE_TEST_CASE("reduce_sources handles unaligned buffers and other mean divisors",
                   "[reduce]", Float16, BFloat16, Float32, Float64, Int8, Int32, Int64, UInt8,
                   Bool) {
  std::mt19937_64 rng(0xD1F);
  for (ReduceOp op : ops_for<TestType>()) {
    check_case<TestType>(rng, {op, 3, 6149, Dst::kSeparate, 0, 1});
    check_case<TestType>(rng, {op, 2, 77, Dst::kFirstSource, 0, 3});
  }
  if constexpr (TestType::dtype != DType::kBool) {
    // The divisor is the world size, which need not be the source count.
    check_case<TestType>(rng, {ReduceOp::kMean, 1, 6149, Dst::kSeparate, 4});
    check_case<TestType>(rng, {ReduceOp::kMean, 1, 100, Dst::kFirstSource, 3});
    check_case<TestType>(rng, {ReduceOp::kMean, 3, 6149, Dst::kSeparate, 8});
  }
}

TEMPLATE_TEST_CASE("NaN in any source propagates through every float op", "[reduce]", Float16,
                   BFloat16, Float32, Float64) {
  using S = typename TestType::Storage;
  constexpr int kSources = 3;
  constexpr std::size_t kCount = 6149;
  std::mt19937_64 rng(0x7A7);
  for (ReduceOp op : ops_for<TestType>()) {
    CAPTURE(concord::reduce_op_name(op));
    std::vector<std::vector<S>> data(kSources, std::vector<S>(kCount));
    for (auto& source : data)
      for (S& x : source) x = draw<TestType>(rng, op);
    // Source k gets NaNs at i % 7 == k (so in the first, middle and last
    // source), all sources at i % 7 == 6, and none elsewhere.
    for (std::size_t i = 0; i < kCount; ++i) {
      int slot = static_cast<int>(i % 7);
      for (int k = 0; k < kSources; ++k)
        if (slot == k || slot == 6) data[k][i] = nan_of<TestType>();
    }
    std::vector<const void*> srcs{data[0].data(), data[1].data(), data[2].data()};
    std::vector<S> out(kCount);
    reduce_sources(out.data(), srcs.data(), kSources, kCount, TestType::dtype, op, kSources);

    int wrong = 0;
    std::size_t first = 0;
    std::vector<S> column(kSources);
    for (std::size_t i = 0; i < kCount; ++i) {
      bool has_nan = i % 7 < kSources || i % 7 == 6;
      for (int k = 0; k < kSources; ++k) column[k] = data[k][i];
      bool ok = has_nan ? std::isnan(value_of<TestType>(out[i]))
                        : check_element<TestType>(op, column, kSources, out[i]).empty();
      if (!ok && wrong++ == 0) first = i;
    }
    INFO("first wrong element " << first);
    CHECK(wrong == 0);
  }
}

TEST_CASE("integer reductions wrap and integer means truncate toward zero", "[reduce]") {
  auto reduce = [](DType dtype, ReduceOp op, auto a, auto b, auto c, int nsrc, int divisor) {
    using T = decltype(a);
    T in[3] = {a, b, c};
    const void* srcs[3] = {&in[0], &in[1], &in[2]};
    T out{};
    reduce_sources(&out, srcs, nsrc, 1, dtype, op, divisor);
    return static_cast<std::int64_t>(out);
  };
  using i8 = std::int8_t;
  using u8 = std::uint8_t;
  // -7 / 2 = -3.5 -> -3 and -5 / 3 = -1.67 -> -1, never floor.
  CHECK(reduce(DType::kInt8, ReduceOp::kMean, i8(-3), i8(-4), i8(0), 2, 2) == -3);
  CHECK(reduce(DType::kInt32, ReduceOp::kMean, -5, 0, 0, 3, 3) == -1);
  CHECK(reduce(DType::kInt32, ReduceOp::kMean, 7, -1, 0, 2, 2) == 3);
  CHECK(reduce(DType::kInt64, ReduceOp::kMean, std::int64_t(-9), std::int64_t(0),
               std::int64_t(0), 2, 4) == -2);
  // Means do not overflow where the sum would.
  CHECK(reduce(DType::kInt8, ReduceOp::kMean, i8(100), i8(100), i8(100), 3, 3) == 100);
  CHECK(reduce(DType::kInt8, ReduceOp::kMean, i8(-128), i8(-128), i8(0), 2, 2) == -128);
  CHECK(reduce(DType::kUInt8, ReduceOp::kMean, u8(255), u8(254), u8(0), 2, 2) == 254);
  CHECK(reduce(DType::kInt32, ReduceOp::kMean, INT32_MAX, INT32_MAX, INT32_MAX, 3, 3) ==
        INT32_MAX);
  // Sums and products wrap.
  CHECK(reduce(DType::kInt8, ReduceOp::kSum, i8(100), i8(100), i8(0), 2, 2) == -56);
  CHECK(reduce(DType::kUInt8, ReduceOp::kSum, u8(200), u8(100), u8(0), 2, 2) == 44);
  CHECK(reduce(DType::kInt8, ReduceOp::kProd, i8(-128), i8(-1), i8(1), 3, 3) == -128);
  CHECK(reduce(DType::kInt32, ReduceOp::kSum, INT32_MAX, 1, 0, 2, 2) == INT32_MIN);
  CHECK(reduce(DType::kInt64, ReduceOp::kSum, INT64_MAX, std::int64_t(1), std::int64_t(0), 2,
               2) == INT64_MIN);
  CHECK(reduce(DType::kInt64, ReduceOp::kProd, INT64_MIN, std::int64_t(-1), std::int64_t(1), 3,
               3) == INT64_MIN);
}

TEST_CASE("bool reductions are any/all and store 0 or 1", "[reduce]") {
  // Bytes other than 0/1 count as true.
  std::uint8_t a[4] = {0, 0, 2, 7};
  std::uint8_t b[4] = {0, 3, 0, 255};
  const void* srcs[2] = {a, b};
  std::uint8_t out[4];
  reduce_sources(out, srcs, 2, 4, DType::kBool, ReduceOp::kMax, 2);
  CHECK(std::vector<int>(out, out + 4) == std::vector<int>{0, 1, 1, 1});
  reduce_sources(out, srcs, 2, 4, DType::kBool, ReduceOp::kMin, 2);
  CHECK(std::vector<int>(out, out + 4) == std::vector<int>{0, 0, 0, 1});
}

TEST_CASE("reduce_sources rejects bad arguments", "[reduce]") {
  float a[2] = {1, 2}, out[2];
  const void* srcs[1] = {a};
  CHECK(invalid_argument_message([&] {
          reduce_sources(out, srcs, 1, 2, DType::kBool, ReduceOp::kSum, 1);
        }) == "reduction 'sum' is not supported for dtype bool; bool supports max and min");
  CHECK_THAT(invalid_argument_message([&] {
               reduce_sources(out, srcs, 0, 2, DType::kFloat32, ReduceOp::kSum, 1);
             }),
             Catch::Matchers::Contains("at least one source"));
  CHECK_THAT(invalid_argument_message([&] {
               reduce_sources(out, srcs, 1, 2, DType::kFloat32, ReduceOp::kMean, 0);
             }),
             Catch::Matchers::Contains("mean divisor must be positive"));
  // Nothing to do: no buffer is touched.
  CHECK_NOTHROW(reduce_sources(nullptr, srcs, 1, 0, DType::kFloat32, ReduceOp::kSum, 1));
}
