#include "kernels/cpu/optim.hpp"

#include <cstddef>
#include <vector>

#include "kernels/codec.hpp"
#include "kernels/cpu/clones.hpp"
#include "kernels/cpu/parallel.hpp"
#include "kernels/dispatch.hpp"
#include "kernels/optim.hpp"

namespace concord::cpu {
namespace {

// ---- SGD --------------------------------------------------------------------------

template <typename T, class Update>
[[gnu::always_inline]] inline void sgd_plain_run(Update update, void* p, const void* g,
                                                 std::size_t n) {
  auto* param = static_cast<T*>(p);
  const auto* grad = static_cast<const T*>(g);
  for (std::size_t i = 0; i < n; ++i) update(param[i], grad[i]);
}

template <typename T, bool kNesterov, bool kFirstStep>
[[gnu::always_inline]] inline void sgd_momentum_run(const SgdOptions& o, void* p, const void* g,
                                                    void* b, std::size_t n) {
  const functors::SgdMomentum<T, kNesterov, kFirstStep> update{T(o.lr), T(o.weight_decay),
                                                               T(o.momentum)};
  auto* param = static_cast<T*>(p);
  const auto* grad = static_cast<const T*>(g);
  auto* buf = static_cast<T*>(b);
  for (std::size_t i = 0; i < n; ++i) update(param[i], grad[i], buf[i]);
}

template <typename T>
[[gnu::always_inline]] inline void sgd_typed(const SgdOptions& o, void* p, const void* g, void* b,
                                             std::size_t n) {
  if (o.momentum == 0.0)
    return sgd_plain_run<T>(functors::SgdPlain<T>{T(o.lr), T(o.weight_decay)}, p, g, n);
  const bool first = o.step == 1;
  if (o.nesterov)
    return first ? sgd_momentum_run<T, true, true>(o, p, g, b, n)
                 : sgd_momentum_run<T, true, false>(o, p, g, b, n);
  return first ? sgd_momentum_run<T, false, true>(o, p, g, b, n)
               : sgd_momentum_run<T, false, false>(o, p, g, b, n);
}

CONCORD_CPU_CLONES void sgd_tensor(const SgdOptions& o, DType dtype, void* p, const void* g,
                                   void* b, std::size_t n) {
  visit(OptimizerDTypes{}, dtype, [&](auto tag) CONCORD_CLONED_BODY {
    sgd_typed<typename Codec<decltype(tag)::value>::Compute>(o, p, g, b, n);
  });
}

// ---- AdamW --------------------------------------------------------------------------

// One pass: libcore is built with -fno-math-errno, so the compiler
// vectorises the square root along with the rest.
template <typename T>
[[gnu::always_inline]] inline void adamw_typed(const AdamWOptions& o, void* p, const void* g,
                                               void* m, void* v, std::size_t n) {
  const auto update =
      functors::AdamW<T>::make(o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.step);
  auto* __restrict param = static_cast<T*>(p);
  const auto* __restrict grad = static_cast<const T*>(g);
  auto* __restrict avg = static_cast<T*>(m);
  auto* __restrict avg_sq = static_cast<T*>(v);
  for (std::size_t i = 0; i < n; ++i) update(param[i], grad[i], avg[i], avg_sq[i]);
}

CONCORD_CPU_CLONES void adamw_tensor(const AdamWOptions& o, DType dtype, void* p, const void* g,
                                     void* m, void* v, std::size_t n) {
  visit(OptimizerDTypes{}, dtype, [&](auto tag) CONCORD_CLONED_BODY {
    adamw_typed<typename Codec<decltype(tag)::value>::Compute>(o, p, g, m, v, n);
  });
}

std::vector<std::size_t> sizes_of(std::span<const TensorView> tensors) {
  std::vector<std::size_t> sizes;
  sizes.reserve(tensors.size());
  for (const TensorView& t : tensors) sizes.push_back(static_cast<std::size_t>(t.numel));
  return sizes;
}

// Element `begin` of t: threads update disjoint ranges of one tensor.
void* at(const TensorView& t, std::size_t begin, std::size_t elem) {
  return static_cast<char*>(t.data) + begin * elem;
}

}  // namespace

void sgd_step(const SgdOptions& options, std::span<const TensorView> params,
              std::span<const TensorView> grads, std::span<const TensorView> momentum_buffers) {
  const bool momentum = options.momentum != 0.0;
  for_each_range(sizes_of(params), [&](std::size_t i, std::size_t begin, std::size_t end) {
    const std::size_t elem = dtype_size(params[i].dtype);
    sgd_tensor(options, params[i].dtype, at(params[i], begin, elem), at(grads[i], begin, elem),
               momentum ? at(momentum_buffers[i], begin, elem) : nullptr, end - begin);
  });
}

void adamw_step(const AdamWOptions& options, std::span<const TensorView> params,
                std::span<const TensorView> grads, std::span<const TensorView> exp_avg,
                std::span<const TensorView> exp_avg_sq) {
  for_each_range(sizes_of(params), [&](std::size_t i, std::size_t begin, std::size_t end) {
    const std::size_t elem = dtype_size(params[i].dtype);
    adamw_tensor(options, params[i].dtype, at(params[i], begin, elem), at(grads[i], begin, elem),
                 at(exp_avg[i], begin, elem), at(exp_avg_sq[i], begin, elem), end - begin);
  });
}

}  // namespace concord::cpu
