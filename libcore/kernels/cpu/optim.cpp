#include "kernels/cpu/optim.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <initializer_list>
#include <iterator>
#include <vector>

#include "base/format.hpp"
#include "kernels/cpu/clones.hpp"
#include "kernels/cpu/parallel.hpp"
#include "kernels/optim.hpp"


namespace concord::cpu {
namespace {

// ---- validation ---------------------------------------------------------------

void check_finite_at_least(const char* op, const char* name, double value, double low) {
  if (!std::isfinite(value) || value < low)
    invalid_argument(op, ": ", name, " must be finite and >= ", low, ", got ", value);
}

void check_beta(const char* op, const char* name, double beta) {
  if (!(beta >= 0.0 && beta < 1.0))
    invalid_argument(op, ": ", name, " must be in [0, 1), got ", beta);
}

void check_step(const char* op, std::int64_t step) {
  if (step < 1) invalid_argument(op, ": step must be >= 1 (1 on the first step), got ", step);
}

void check_options(const SgdOptions& o) {
  check_finite_at_least("sgd_step", "lr", o.lr, 0.0);
  check_finite_at_least("sgd_step", "momentum", o.momentum, 0.0);
  check_finite_at_least("sgd_step", "weight_decay", o.weight_decay, 0.0);
  if (o.nesterov && o.momentum == 0.0)
    invalid_argument("sgd_step: nesterov needs a momentum > 0");
  check_step("sgd_step", o.step);
}

void check_options(const AdamWOptions& o) {
  check_finite_at_least("adamw_step", "lr", o.lr, 0.0);
  check_beta("adamw_step", "beta1", o.beta1);
  check_beta("adamw_step", "beta2", o.beta2);
  check_finite_at_least("adamw_step", "eps", o.eps, 0.0);
  check_finite_at_least("adamw_step", "weight_decay", o.weight_decay, 0.0);
  check_step("adamw_step", o.step);
}

struct NamedList {
  const char* name;
  std::span<const TensorView> tensors;
};

bool overlap(const TensorView& a, const TensorView& b) {
  const auto* a0 = static_cast<const unsigned char*>(a.data);
  const auto* b0 = static_cast<const unsigned char*>(b.data);
  return a.numel != 0 && b.numel != 0 && a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

// lists[0] holds the parameters. Every list has one tensor per parameter,
// of its dtype and element count, on the CPU. No two share memory: all but
// the gradients are written, and the loops read each element once.
void check_tensors(const char* op, std::initializer_list<NamedList> lists) {
  const NamedList& params = *lists.begin();
  for (const NamedList& list : lists)
    if (list.tensors.size() != params.tensors.size())
      invalid_argument(op, ": ", params.tensors.size(), " ", params.name, " but ",
                       list.tensors.size(), " ", list.name);
  for (std::size_t i = 0; i < params.tensors.size(); ++i) {
    const TensorView& p = params.tensors[i];
    if (p.device.kind != DeviceKind::kCPU)
      fail(StatusCode::kUnavailable, op, ": ", params.name, "[", i, "] is on ",
           device_kind_name(p.device.kind), ":", p.device.id,
           "; the CPU optimizers take CPU tensors only");
    if (p.dtype != DType::kFloat32 && p.dtype != DType::kFloat64)
      invalid_argument(op, ": ", params.name, "[", i, "] is ", dtype_name(p.dtype),
                       "; the optimizers update float32 or float64 parameters");
    for (const NamedList& list : lists) {
      const TensorView& t = list.tensors[i];
      if (!(t.device == p.device) || t.dtype != p.dtype || t.numel != p.numel)
        invalid_argument(op, ": ", list.name, "[", i, "] is ", dtype_name(t.dtype), " with ",
                         t.numel, " elements on ", device_kind_name(t.device.kind), " but ",
                         params.name, "[", i, "] is ", dtype_name(p.dtype), " with ", p.numel,
                         " elements on ", device_kind_name(p.device.kind));
    }
    for (auto a = lists.begin(); a != lists.end(); ++a)
      for (auto b = std::next(a); b != lists.end(); ++b)
        if (overlap(a->tensors[i], b->tensors[i]))
          invalid_argument(op, ": ", a->name, "[", i, "] and ", b->name, "[", i,
                           "] share memory; every state needs its own buffer");
  }
}

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
  if (dtype == DType::kFloat32)
    sgd_typed<float>(o, p, g, b, n);
  else
    sgd_typed<double>(o, p, g, b, n);
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
  if (dtype == DType::kFloat32)
    adamw_typed<float>(o, p, g, m, v, n);
  else
    adamw_typed<double>(o, p, g, m, v, n);
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
  check_options(options);
  const bool momentum = options.momentum != 0.0;
  if (momentum)
    check_tensors("sgd_step", {{"params", params}, {"grads", grads},
                               {"momentum_buffers", momentum_buffers}});
  else
    check_tensors("sgd_step", {{"params", params}, {"grads", grads}});
  for_each_range(sizes_of(params), [&](std::size_t i, std::size_t begin, std::size_t end) {
    const std::size_t elem = dtype_size(params[i].dtype);
    sgd_tensor(options, params[i].dtype, at(params[i], begin, elem), at(grads[i], begin, elem),
               momentum ? at(momentum_buffers[i], begin, elem) : nullptr, end - begin);
  });
}

void adamw_step(const AdamWOptions& options, std::span<const TensorView> params,
                std::span<const TensorView> grads, std::span<const TensorView> exp_avg,
                std::span<const TensorView> exp_avg_sq) {
  check_options(options);
  check_tensors("adamw_step", {{"params", params}, {"grads", grads}, {"exp_avg", exp_avg},
                               {"exp_avg_sq", exp_avg_sq}});
  for_each_range(sizes_of(params), [&](std::size_t i, std::size_t begin, std::size_t end) {
    const std::size_t elem = dtype_size(params[i].dtype);
    adamw_tensor(options, params[i].dtype, at(params[i], begin, elem), at(grads[i], begin, elem),
                 at(exp_avg[i], begin, elem), at(exp_avg_sq[i], begin, elem), end - begin);
  });
}

}  // namespace concord::cpu
