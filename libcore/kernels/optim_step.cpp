#include "kernels/optim_step.hpp"

#include <cmath>
#include <cstddef>
#include <initializer_list>
#include <iterator>

#include "base/format.hpp"
#include "kernels/cpu/optim.hpp"
#include "kernels/cuda/launch.hpp"
#include "kernels/front.hpp"
#include "kernels/optim.hpp"

namespace concord::kernels {
namespace {

// ---- options ----------------------------------------------------------------------

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

// ---- tensors ----------------------------------------------------------------------

struct NamedList {
  const char* name;
  std::span<const TensorView> tensors;
};

// lists[0] holds the parameters. Every list has one tensor per parameter,
// of its dtype, shape and device, and every parameter is on the
// device of the first. No two share memory: all but the gradients are
// written, and the loops read each element once.
void check_tensors(const char* op, std::initializer_list<NamedList> lists) {
  const NamedList& params = *lists.begin();
  for (const NamedList& list : lists)
    if (list.tensors.size() != params.tensors.size())
      invalid_argument(op, ": ", params.tensors.size(), " ", params.name, " but ",
                       list.tensors.size(), " ", list.name);
  for (std::size_t i = 0; i < params.tensors.size(); ++i) {
    const TensorView& p = params.tensors[i];
    const Device first = params.tensors[0].device;
    if (!(p.device == first))
      invalid_argument(op, ": ", params.name, "[", i, "] is on ", device_str(p.device), " but ",
                       params.name, "[0] is on ", device_str(first),
                       "; pass tensors on one device");
    if (!OptimizerDTypes::contains(p.dtype))
      invalid_argument(op, ": ", params.name, "[", i, "] is ", dtype_name(p.dtype),
                       "; the optimizers update float32 or float64 parameters");
    for (const NamedList& list : lists) {
      const TensorView& t = list.tensors[i];
      if (!(t.device == p.device) || t.dtype != p.dtype)
        invalid_argument(op, ": ", list.name, "[", i, "] is ", dtype_name(t.dtype), " with ",
                         t.numel, " elements on ", device_str(t.device), " but ", params.name,
                         "[", i, "] is ", dtype_name(p.dtype), " with ", p.numel,
                         " elements on ", device_str(p.device));
      if (!(t.shape == p.shape))
        invalid_argument(op, ": ", list.name, "[", i, "] has shape ", t.shape.str(), " but ",
                         params.name, "[", i, "] has shape ", p.shape.str());
    }
    for (auto a = lists.begin(); a != lists.end(); ++a)
      for (auto b = std::next(a); b != lists.end(); ++b)
        if (overlap(a->tensors[i], b->tensors[i]))
          invalid_argument(op, ": ", a->name, "[", i, "] and ", b->name, "[", i,
                           "] share memory; every state needs its own buffer");
  }
}

}  // namespace

void sgd_step(const SgdOptions& options, std::span<const TensorView> params,
              std::span<const TensorView> grads, std::span<const TensorView> momentum_buffers,
              plugin::Stream stream) {
  check_options(options);
  const bool momentum = options.momentum != 0.0;
  if (momentum)
    check_tensors("sgd_step", {{"params", params}, {"grads", grads},
                               {"momentum_buffers", momentum_buffers}});
  else
    check_tensors("sgd_step", {{"params", params}, {"grads", grads}});
  const std::span<const TensorView> buffers =
      momentum ? momentum_buffers : std::span<const TensorView>{};
  if (on_cuda(params))
    cuda::sgd_step(options, params, grads, buffers, stream);
  else
    cpu::sgd_step(options, params, grads, buffers);
}

void adamw_step(const AdamWOptions& options, std::span<const TensorView> params,
                std::span<const TensorView> grads, std::span<const TensorView> exp_avg,
                std::span<const TensorView> exp_avg_sq, plugin::Stream stream) {
  check_options(options);
  check_tensors("adamw_step", {{"params", params}, {"grads", grads}, {"exp_avg", exp_avg},
                               {"exp_avg_sq", exp_avg_sq}});
  if (on_cuda(params))
    cuda::adamw_step(options, params, grads, exp_avg, exp_avg_sq, stream);
  else
    cpu::adamw_step(options, params, grads, exp_avg, exp_avg_sq);
}

}  // namespace concord::kernels
