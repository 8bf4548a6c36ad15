#include "kernels/cpu/multi_tensor.hpp"

#include <cstddef>
#include <cstring>

#include "kernels/codec.hpp"
#include "kernels/cpu/clones.hpp"
#include "kernels/dispatch.hpp"
#include "kernels/pack.hpp"

namespace concord::cpu {
namespace {

// ---- kernels: plain loops over the shared functors ---------------------------

// The loops read and write distinct buffers; the compiler checks that at run
// time once per loop and takes the vectorised version.
template <DType From, DType To>
[[gnu::always_inline]] inline void cast_run(const void* in, void* out, std::size_t n,
                                            double factor) {
  using Cast = functors::ScaledCast<From, To>;
  const Cast cast{static_cast<typename Cast::Compute>(factor)};
  const auto* src = static_cast<const typename Cast::In*>(in);
  auto* dst = static_cast<typename Cast::Out*>(out);
  for (std::size_t i = 0; i < n; ++i) dst[i] = cast(src[i]);
}

CONCORD_CPU_CLONES void cast_floating(DType from, DType to, const void* in, void* out,
                                      std::size_t n, double factor) {
  visit_floating(from, [&](auto f) CONCORD_CLONED_BODY {
    visit_floating(to, [&](auto t) CONCORD_CLONED_BODY {
      cast_run<decltype(f)::value, decltype(t)::value>(in, out, n, factor);
    });
  });
}

void convert(DType from, DType to, const void* in, void* out, std::size_t n, double factor) {
  if (n == 0) return;
  if (is_plain_copy(from, to, factor))
    std::memcpy(out, in, n * dtype_size(from));
  else
    cast_floating(from, to, in, out, n, factor);
}

template <DType D>
[[gnu::always_inline]] inline void scale_run(void* data, std::size_t n, double factor) {
  using Cast = functors::ScaledCast<D, D>;
  const Cast cast{static_cast<typename Cast::Compute>(factor)};
  auto* x = static_cast<typename Cast::Out*>(data);
  for (std::size_t i = 0; i < n; ++i) x[i] = cast(x[i]);
}

CONCORD_CPU_CLONES void scale_floating(DType dtype, void* data, std::size_t n, double factor) {
  visit_floating(dtype, [&](auto d) CONCORD_CLONED_BODY {
    scale_run<decltype(d)::value>(data, n, factor);
  });
}

// A float64 sum does not reassociate without -ffast-math, so one running
// sum is a serial chain of dependent adds. kLanes independent partial sums
// break the chain: the inner loop maps onto vector registers.
template <DType D>
[[gnu::always_inline]] inline double squares_run(const void* data, std::size_t n) {
  constexpr std::size_t kLanes = 16;
  const functors::SquareF64<D> square;
  const auto* x = static_cast<const typename Codec<D>::Storage*>(data);
  double partial[kLanes] = {};
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (std::size_t j = 0; j < kLanes; ++j) partial[j] += square(x[i + j]);
  double total = 0.0;
  for (; i < n; ++i) total += square(x[i]);
  for (double p : partial) total += p;
  return total;
}

CONCORD_CPU_CLONES double squares_floating(DType dtype, const void* data, std::size_t n) {
  return visit_floating(dtype, [&](auto d) CONCORD_CLONED_BODY {
    return squares_run<decltype(d)::value>(data, n);
  });
}

std::size_t count(const TensorView& t) { return static_cast<std::size_t>(t.numel); }

}  // namespace

void pack(std::span<const TensorView> tensors, void* wire, DType wire_dtype, double factor) {
  auto* out = static_cast<unsigned char*>(wire);
  for (const TensorView& t : tensors) {
    convert(t.dtype, wire_dtype, t.data, out, count(t), factor);
    out += count(t) * dtype_size(wire_dtype);
  }
}

void unpack(const void* wire, DType wire_dtype, std::span<const TensorView> tensors,
            double factor) {
  const auto* in = static_cast<const unsigned char*>(wire);
  for (const TensorView& t : tensors) {
    convert(wire_dtype, t.dtype, in, t.data, count(t), factor);
    in += count(t) * dtype_size(wire_dtype);
  }
}

void scale(std::span<const TensorView> tensors, double factor) {
  if (factor == 1.0) return;
  for (const TensorView& t : tensors)
    if (t.numel != 0) scale_floating(t.dtype, t.data, count(t), factor);
}

double sum_of_squares(std::span<const TensorView> tensors) {
  double total = 0.0;
  for (const TensorView& t : tensors)
    if (t.numel != 0) total += squares_floating(t.dtype, t.data, count(t));
  return total;
}

}  // namespace concord::cpu
