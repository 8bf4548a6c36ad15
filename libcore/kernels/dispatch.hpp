// From a tensor's run-time dtype to a kernel template: the one dtype switch
// of every executor, CPU and CUDA (host and device code). A visitor calls
// fn(DTypeTag<D>{}) with the dtype as a compile-time constant, so fn
// instantiates its kernel for it (Codec<decltype(tag)::value>, ...).
#pragma once

#include <string>
#include <type_traits>

#include "base/dtype.hpp"
#include "base/format.hpp"

// Visitors are always inlined, on the host too: a visit inside a cloned CPU
// executor (kernels/cpu/clones.hpp) must leave the loops it reaches inside
// each clone. Rejecting a dtype is the cold path, kept out of line.
#if defined(__CUDACC__)
#define CONCORD_VISITOR __host__ __device__ __forceinline__
#define CONCORD_VISIT_FAILURE __host__ __device__ __noinline__
#else
#define CONCORD_VISITOR [[gnu::always_inline]] inline
#define CONCORD_VISIT_FAILURE [[gnu::cold]]
#endif

namespace concord {

template <DType D>
using DTypeTag = std::integral_constant<DType, D>;

// A compile-time set of dtypes.
template <DType... Ds>
struct DTypeSet {
  static constexpr bool contains(DType dtype) { return ((dtype == Ds) || ...); }
};

using AllDTypes = DTypeSet<DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64,
                           DType::kInt8, DType::kInt32, DType::kInt64, DType::kUInt8,
                           DType::kBool>;
using FloatingDTypes =
    DTypeSet<DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64>;

namespace dispatch_detail {

// A dtype outside the visited set: InvalidArgument on the host; on the
// device, where nothing can be thrown, a trap (the host-side validation
// keeps such dtypes from reaching a kernel).
template <DType... Ds>
[[noreturn]] CONCORD_VISIT_FAILURE void unsupported(DType dtype, DTypeSet<Ds...>) {
#if defined(__CUDA_ARCH__)
  __trap();
  __builtin_unreachable();
#else
  std::string expected;
  ((expected += concat(expected.empty() ? "" : ", ", dtype_name(Ds))), ...);
  invalid_argument("dtype ", dtype_name(dtype), " is not supported here; expected one of ",
                   expected);
#endif
}

template <DType D, DType... Rest, class Fn, class Set>
CONCORD_VISITOR decltype(auto) visit_among(DType dtype, Fn& fn, Set set) {
  if constexpr (sizeof...(Rest) == 0) {
    if (dtype != D) unsupported(dtype, set);
    return fn(DTypeTag<D>{});
  } else {
    if (dtype == D) return fn(DTypeTag<D>{});
    return visit_among<Rest...>(dtype, fn, set);
  }
}

}  // namespace dispatch_detail

// fn(DTypeTag<dtype>{}) for a dtype of `set`; any other is rejected.
template <DType... Ds, class Fn>
CONCORD_VISITOR decltype(auto) visit(DTypeSet<Ds...> set, DType dtype, Fn&& fn) {
  return dispatch_detail::visit_among<Ds...>(dtype, fn, set);
}

// Every dtype.
template <class Fn>
CONCORD_VISITOR decltype(auto) visit_dtype(DType dtype, Fn&& fn) {
  return visit(AllDTypes{}, dtype, fn);
}

// float16, bfloat16, float32 or float64; any other dtype is rejected.
template <class Fn>
CONCORD_VISITOR decltype(auto) visit_floating(DType dtype, Fn&& fn) {
  return visit(FloatingDTypes{}, dtype, fn);
}

// fn(DTypeTag<D>{}) for every dtype D of `set`, in order.
template <DType... Ds, class Fn>
CONCORD_VISITOR void for_each_dtype(DTypeSet<Ds...>, Fn&& fn) {
  (fn(DTypeTag<Ds>{}), ...);
}

}  // namespace concord

#undef CONCORD_VISITOR
#undef CONCORD_VISIT_FAILURE
