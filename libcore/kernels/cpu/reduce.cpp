#include "kernels/cpu/reduce.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "base/format.hpp"
#include "kernels/codec.hpp"
#include "kernels/cpu/clones.hpp"
#include "kernels/dispatch.hpp"
#include "kernels/reduce_functors.hpp"

namespace concord::cpu {
namespace {

// Elements per block. Each block is reduced into a local accumulator (at
// most 8 bytes an element, so it stays in L1) that every source streams
// through once; dst is written only after all sources of the block are
// read, which makes it safe for dst to be one of the sources.
constexpr std::size_t kBlock = 2048;

// The reduction's view of a dtype is its codec (kernels/codec.hpp), or one
// of the adapters below: a type with Storage, Compute, load() and store().

// Integer sum and prod wrap: they run in the unsigned type of the same
// width, where overflow is defined.
template <DType D>
struct Wrapping {
  using Storage = typename Codec<D>::Storage;
  using Compute = std::make_unsigned_t<Storage>;
  static Compute load(Storage v) { return static_cast<Compute>(Codec<D>::load(v)); }
  static Storage store(Compute v) {
    return Codec<D>::store(static_cast<typename Codec<D>::Compute>(v));
  }
};

// Integer means narrower than 64 bits sum in double, which is exact for any
// realistic number of sources, so the mean itself never overflows.
template <DType D>
struct InDouble {
  using Storage = typename Codec<D>::Storage;
  using Compute = double;
  static double load(Storage v) { return static_cast<double>(Codec<D>::load(v)); }
  static Storage store(double v) {
    return Codec<D>::store(static_cast<typename Codec<D>::Compute>(v));
  }
};

// Whether reduce_block may combine the first two sources in one pass, which
// saves a pass over the block accumulator. Not for float16: a fused pass
// would decode srcs[0] as Max/Min's second operand, which does not
// vectorise (see reduce_block).
template <class View>
inline constexpr bool kFuseFirstPair = !std::is_same_v<View, Codec<DType::kFloat16>>;

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
template <class View, class Op, class Finish>
[[gnu::always_inline]] inline void reduce_block(typename View::Storage* dst,
                                                const void* const* srcs, int nsrc,
                                                std::size_t offset, std::size_t n, Op op,
                                                Finish finish) {
  using S = typename View::Storage;
  using A = typename View::Compute;
  auto source = [&](int k) { return static_cast<const S*>(srcs[k]) + offset; };

  // The freshly loaded value is always the first operand: Max/Min skip
  // their second operand when the first is NaN, and a float16 decode made
  // conditional that way keeps the loop from vectorising.
  A acc[kBlock];
  const S* s0 = source(0);
  int k = 1;
  if (kFuseFirstPair<View> && nsrc >= 2) {
    const S* s1 = source(1);
    for (std::size_t i = 0; i < n; ++i) acc[i] = op(View::load(s1[i]), View::load(s0[i]));
    k = 2;
  } else {
    for (std::size_t i = 0; i < n; ++i) acc[i] = View::load(s0[i]);
  }
  for (; k < nsrc; ++k) {
    const S* s = source(k);
    for (std::size_t i = 0; i < n; ++i) acc[i] = op(View::load(s[i]), acc[i]);
  }
  for (std::size_t i = 0; i < n; ++i) dst[i] = View::store(finish(acc[i]));
}

template <class View, class Op, class Finish = Keep>
[[gnu::always_inline]] inline void reduce_blocks(void* dst, const void* const* srcs, int nsrc,
                                                 std::size_t count, Op op,
                                                 Finish finish = {}) {
  auto* out = static_cast<typename View::Storage*>(dst);
  for (std::size_t offset = 0; offset < count; offset += kBlock) {
    std::size_t n = std::min(kBlock, count - offset);
    reduce_block<View>(out + offset, srcs, nsrc, offset, n, op, finish);
  }
}

// Floating types run every op in their compute type.
template <DType D>
[[gnu::always_inline]] inline void reduce_floating(void* dst, const void* const* srcs,
                                                   int nsrc, std::size_t count, ReduceOp op,
                                                   int mean_divisor) {
  using C = Codec<D>;
  using A = typename C::Compute;
  switch (op) {
    case ReduceOp::kSum: return reduce_blocks<C>(dst, srcs, nsrc, count, functors::Sum{});
    case ReduceOp::kProd: return reduce_blocks<C>(dst, srcs, nsrc, count, functors::Prod{});
    case ReduceOp::kMax: return reduce_blocks<C>(dst, srcs, nsrc, count, functors::Max{});
    case ReduceOp::kMin: return reduce_blocks<C>(dst, srcs, nsrc, count, functors::Min{});
    case ReduceOp::kMean:
      return reduce_blocks<C>(dst, srcs, nsrc, count, functors::Sum{},
                              DivideBy<A>{static_cast<A>(mean_divisor)});
  }
}

// Integer sum and prod wrap (Wrapping); an int64 mean divides the wrapped
// sum, narrower means sum in double (InDouble).
template <DType D>
[[gnu::always_inline]] inline void reduce_integer(void* dst, const void* const* srcs, int nsrc,
                                                  std::size_t count, ReduceOp op,
                                                  int mean_divisor) {
  using Native = Codec<D>;
  switch (op) {
    case ReduceOp::kSum:
      return reduce_blocks<Wrapping<D>>(dst, srcs, nsrc, count, functors::Sum{});
    case ReduceOp::kProd:
      return reduce_blocks<Wrapping<D>>(dst, srcs, nsrc, count, functors::Prod{});
    case ReduceOp::kMax: return reduce_blocks<Native>(dst, srcs, nsrc, count, functors::Max{});
    case ReduceOp::kMin: return reduce_blocks<Native>(dst, srcs, nsrc, count, functors::Min{});
    case ReduceOp::kMean:
      if constexpr (sizeof(typename Native::Storage) < 8) {
        return reduce_blocks<InDouble<D>>(dst, srcs, nsrc, count, functors::Sum{},
                                          DivideBy<double>{double(mean_divisor)});
      } else {
        return reduce_blocks<Wrapping<D>>(dst, srcs, nsrc, count, functors::Sum{},
                                          DivideWrappedInt64{mean_divisor});
      }
  }
}

[[gnu::always_inline]] inline void reduce_bool(void* dst, const void* const* srcs, int nsrc,
                                               std::size_t count, ReduceOp op) {
  using Bool = Codec<DType::kBool>;
  if (op == ReduceOp::kMax) return reduce_blocks<Bool>(dst, srcs, nsrc, count, functors::Max{});
  reduce_blocks<Bool>(dst, srcs, nsrc, count, functors::Min{});
}

// Every kernel is inlined here, so each clone holds a full set.
CONCORD_CPU_CLONES void reduce_dtype(void* dst, const void* const* srcs, int nsrc,
                                     std::size_t count, DType dtype, ReduceOp op,
                                     int mean_divisor) {
  visit_dtype(dtype, [&](auto tag) CONCORD_CLONED_BODY {
    constexpr DType D = decltype(tag)::value;
    if constexpr (FloatingDTypes::contains(D))
      reduce_floating<D>(dst, srcs, nsrc, count, op, mean_divisor);
    else if constexpr (D == DType::kBool)
      reduce_bool(dst, srcs, nsrc, count, op);
    else
      reduce_integer<D>(dst, srcs, nsrc, count, op, mean_divisor);
  });
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
