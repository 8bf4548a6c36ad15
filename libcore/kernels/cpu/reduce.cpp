#include "kernels/cpu/reduce.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "base/format.hpp"
#include "kernels/cpu/clones.hpp"
#include "kernels/half.hpp"
#include "kernels/reduce_functors.hpp"

namespace concord::cpu {
namespace {

// Elements per block. Each block is reduced into a local accumulator (at
// most 8 bytes an element, so it stays in L1) that every source streams
// through once; dst is written only after all sources of the block are
// read, which makes it safe for dst to be one of the sources.
constexpr std::size_t kBlock = 2048;

// Codecs: how a dtype's storage maps to the type the reduction runs in.
// kFuseFirstPair: whether reduce_block may combine the first two sources in
// one pass, which saves a pass over the block accumulator.
template <typename S, typename A>
struct Cast {
  using Storage = S;
  using Acc = A;
  static constexpr bool kFuseFirstPair = true;
  static A load(S v) { return static_cast<A>(v); }
  static S store(A v) { return static_cast<S>(v); }
};

struct Fp16 {
  using Storage = std::uint16_t;
  using Acc = float;
  // A fused pass would decode srcs[0] as Max/Min's second operand, which
  // does not vectorise (see reduce_block).
  static constexpr bool kFuseFirstPair = false;
  static float load(std::uint16_t v) { return fp16_to_float(v); }
  static std::uint16_t store(float v) { return float_to_fp16(v); }
};

struct Bf16 {
  using Storage = std::uint16_t;
  using Acc = float;
  static constexpr bool kFuseFirstPair = true;
  static float load(std::uint16_t v) { return bf16_to_float(v); }
  static std::uint16_t store(float v) { return float_to_bf16(v); }
};

// Any nonzero byte is true; max/min over bytes keep that meaning and the
// result is stored as a canonical 0/1.
struct Bool {
  using Storage = std::uint8_t;
  using Acc = std::uint8_t;
  static constexpr bool kFuseFirstPair = true;
  static std::uint8_t load(std::uint8_t v) { return v; }
  static std::uint8_t store(std::uint8_t v) { return v != 0; }
};

// What happens to the accumulator before it is stored.
struct Keep {
  template <typename A>
  A operator()(A a) const { return a; }
};

template <typename A>
struct DivideBy {
  A divisor;
  A operator()(A a) const { return a / divisor; }
};

// int64 means sum in wrapping unsigned arithmetic, then divide as signed
// (truncating toward zero).
struct DivideWrappedInt64 {
  std::int64_t divisor;
  std::uint64_t operator()(std::uint64_t a) const {
    return static_cast<std::uint64_t>(static_cast<std::int64_t>(a) / divisor);
  }
};

// One block of at most kBlock elements, `offset` elements into every buffer.
template <class Codec, class Op, class Finish>
[[gnu::always_inline]] inline void reduce_block(typename Codec::Storage* dst,
                                                const void* const* srcs, int nsrc,
                                                std::size_t offset, std::size_t n, Op op,
                                                Finish finish) {
  using S = typename Codec::Storage;
  using A = typename Codec::Acc;
  auto source = [&](int k) { return static_cast<const S*>(srcs[k]) + offset; };

  // The freshly loaded value is always the first operand: Max/Min skip
  // their second operand when the first is NaN, and a float16 decode made
  // conditional that way keeps the loop from vectorising.
  A acc[kBlock];
  const S* s0 = source(0);
  int k = 1;
  if (Codec::kFuseFirstPair && nsrc >= 2) {
    const S* s1 = source(1);
    for (std::size_t i = 0; i < n; ++i) acc[i] = op(Codec::load(s1[i]), Codec::load(s0[i]));
    k = 2;
  } else {
    for (std::size_t i = 0; i < n; ++i) acc[i] = Codec::load(s0[i]);
  }
  for (; k < nsrc; ++k) {
    const S* s = source(k);
    for (std::size_t i = 0; i < n; ++i) acc[i] = op(Codec::load(s[i]), acc[i]);
  }
  for (std::size_t i = 0; i < n; ++i) dst[i] = Codec::store(finish(acc[i]));
}

template <class Codec, class Op, class Finish = Keep>
[[gnu::always_inline]] inline void reduce_blocks(void* dst, const void* const* srcs, int nsrc,
                                                 std::size_t count, Op op,
                                                 Finish finish = {}) {
  auto* out = static_cast<typename Codec::Storage*>(dst);
  for (std::size_t offset = 0; offset < count; offset += kBlock) {
    std::size_t n = std::min(kBlock, count - offset);
    reduce_block<Codec>(out + offset, srcs, nsrc, offset, n, op, finish);
  }
}

// Floating types run every op in their accumulator type.
template <class Codec>
[[gnu::always_inline]] inline void reduce_floating(void* dst, const void* const* srcs,
                                                   int nsrc, std::size_t count, ReduceOp op,
                                                   int mean_divisor) {
  using A = typename Codec::Acc;
  switch (op) {
    case ReduceOp::kSum: return reduce_blocks<Codec>(dst, srcs, nsrc, count, functors::Sum{});
    case ReduceOp::kProd: return reduce_blocks<Codec>(dst, srcs, nsrc, count, functors::Prod{});
    case ReduceOp::kMax: return reduce_blocks<Codec>(dst, srcs, nsrc, count, functors::Max{});
    case ReduceOp::kMin: return reduce_blocks<Codec>(dst, srcs, nsrc, count, functors::Min{});
    case ReduceOp::kMean:
      return reduce_blocks<Codec>(dst, srcs, nsrc, count, functors::Sum{},
                                  DivideBy<A>{static_cast<A>(mean_divisor)});
  }
}

// Integer sum and prod wrap: they run in the unsigned type of the same
// width, where overflow is defined. Means of types narrower than 64 bits sum
// in double, which is exact for any realistic number of sources, so the
// mean itself never overflows.
template <typename S>
[[gnu::always_inline]] inline void reduce_integer(void* dst, const void* const* srcs, int nsrc,
                                                  std::size_t count, ReduceOp op,
                                                  int mean_divisor) {
  using Wrapping = Cast<S, std::make_unsigned_t<S>>;
  using Native = Cast<S, S>;
  switch (op) {
    case ReduceOp::kSum: return reduce_blocks<Wrapping>(dst, srcs, nsrc, count, functors::Sum{});
    case ReduceOp::kProd:
      return reduce_blocks<Wrapping>(dst, srcs, nsrc, count, functors::Prod{});
    case ReduceOp::kMax: return reduce_blocks<Native>(dst, srcs, nsrc, count, functors::Max{});
    case ReduceOp::kMin: return reduce_blocks<Native>(dst, srcs, nsrc, count, functors::Min{});
    case ReduceOp::kMean:
      if constexpr (sizeof(S) < 8) {
        return reduce_blocks<Cast<S, double>>(dst, srcs, nsrc, count, functors::Sum{},
                                               DivideBy<double>{double(mean_divisor)});
      } else {
        return reduce_blocks<Wrapping>(dst, srcs, nsrc, count, functors::Sum{},
                                       DivideWrappedInt64{mean_divisor});
      }
  }
}

[[gnu::always_inline]] inline void reduce_bool(void* dst, const void* const* srcs, int nsrc,
                                               std::size_t count, ReduceOp op) {
  if (op == ReduceOp::kMax) return reduce_blocks<Bool>(dst, srcs, nsrc, count, functors::Max{});
  reduce_blocks<Bool>(dst, srcs, nsrc, count, functors::Min{});
}

// Every kernel is inlined here, so each clone holds a full set.
CONCORD_CPU_CLONES void reduce_dtype(void* dst, const void* const* srcs, int nsrc,
                                     std::size_t count, DType dtype, ReduceOp op,
                                     int mean_divisor) {
  switch (dtype) {
    case DType::kFloat16:
      return reduce_floating<Fp16>(dst, srcs, nsrc, count, op, mean_divisor);
    case DType::kBFloat16:
      return reduce_floating<Bf16>(dst, srcs, nsrc, count, op, mean_divisor);
    case DType::kFloat32:
      return reduce_floating<Cast<float, float>>(dst, srcs, nsrc, count, op, mean_divisor);
    case DType::kFloat64:
      return reduce_floating<Cast<double, double>>(dst, srcs, nsrc, count, op, mean_divisor);
    case DType::kInt8:
      return reduce_integer<std::int8_t>(dst, srcs, nsrc, count, op, mean_divisor);
    case DType::kInt32:
      return reduce_integer<std::int32_t>(dst, srcs, nsrc, count, op, mean_divisor);
    case DType::kInt64:
      return reduce_integer<std::int64_t>(dst, srcs, nsrc, count, op, mean_divisor);
    case DType::kUInt8:
      return reduce_integer<std::uint8_t>(dst, srcs, nsrc, count, op, mean_divisor);
    case DType::kBool: return reduce_bool(dst, srcs, nsrc, count, op);
  }
}

}  // namespace

void reduce_sources(void* dst, const void* const* srcs, int nsrc, std::size_t count,
                    DType dtype, ReduceOp op, int mean_divisor) {
  check_reduce_op(op, dtype);
  if (dtype_size(dtype) == 0) invalid_argument("unsupported dtype ", static_cast<int>(dtype));
  if (nsrc < 1) invalid_argument("reduce_sources needs at least one source, got ", nsrc);
  if (op == ReduceOp::kMean && mean_divisor < 1)
    invalid_argument("mean divisor must be positive, got ", mean_divisor);
  if (count == 0) return;

  // A single source is the result itself unless a mean divides it.
  if (nsrc == 1 && op != ReduceOp::kMean) {
    if (dst != srcs[0]) std::memmove(dst, srcs[0], count * dtype_size(dtype));
    return;
  }
  reduce_dtype(dst, srcs, nsrc, count, dtype, op, mean_divisor);
}

}  // namespace concord::cpu
