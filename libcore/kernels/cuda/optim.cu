// Fused optimizer steps on CUDA tensors: the functors of kernels/optim.hpp,
// chosen exactly as the CPU executor (kernels/cpu/optim.cpp) chooses them,
// over multi-tensor tables (kernels/cuda/common.cuh). float32 and float64
// tensors may be mixed in one call: each dtype gets its own launches.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/codec.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/entry_points.hpp"
#include "kernels/dispatch.hpp"
#include "kernels/optim.hpp"

namespace concord::cuda_exec {
namespace {

// ---- kernels ----------------------------------------------------------------------

// data[t] = {param, grad}.
template <typename T, class Update>
__global__ void __launch_bounds__(kThreads)
    sgd_plain_kernel(const __grid_constant__ TensorTable<2> table, Update update) {
  for_each_element(table, [&](int t, std::int64_t j) {
    T* param = static_cast<T*>(table.data[t][0]);
    const T* grad = static_cast<const T*>(table.data[t][1]);
    T p = param[j];
    update(p, grad[j]);
    param[j] = p;
  });
}

// data[t] = {param, grad, momentum buffer}.
template <typename T, class Update>
__global__ void __launch_bounds__(kThreads)
    sgd_momentum_kernel(const __grid_constant__ TensorTable<3> table, Update update) {
  for_each_element(table, [&](int t, std::int64_t j) {
    T* param = static_cast<T*>(table.data[t][0]);
    const T* grad = static_cast<const T*>(table.data[t][1]);
    T* buffer = static_cast<T*>(table.data[t][2]);
    T p = param[j], b = buffer[j];
    update(p, grad[j], b);
    param[j] = p;
    buffer[j] = b;
  });
}

// data[t] = {param, grad, exp_avg, exp_avg_sq}.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    adamw_kernel(const __grid_constant__ TensorTable<4> table, functors::AdamW<T> update) {
  for_each_element(table, [&](int t, std::int64_t j) {
    T* param = static_cast<T*>(table.data[t][0]);
    const T* grad = static_cast<const T*>(table.data[t][1]);
    T* exp_avg = static_cast<T*>(table.data[t][2]);
    T* exp_avg_sq = static_cast<T*>(table.data[t][3]);
    T p = param[j], m = exp_avg[j], v = exp_avg_sq[j];
    update(p, grad[j], m, v);
    param[j] = p;
    exp_avg[j] = m;
    exp_avg_sq[j] = v;
  });
}

// ---- launches -----------------------------------------------------------------------

// Raises unless every parameter is float32 or float64 (checked before the
// first launch).
void require_optimizer_dtypes(const char* op, const DeviceTensor* params, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (!OptimizerDTypes::contains(params[i].dtype)) unsupported_dtype(op, params[i].dtype);
}

// Launches for each optimizer dtype: launch_for(tag, table, total)
// with the tensors of that dtype, lists[l][i] being tensor i of list l.
template <int kLists, class LaunchFor>
void per_optimizer_dtype(const DeviceTensor* const (&lists)[kLists], std::size_t n,
                         LaunchFor&& launch_for) {
  auto run = [&](auto tag) {
    constexpr DType dtype = decltype(tag)::value;
    auto select = [&](std::size_t i, TableEntry<kLists>& entry) {
      if (lists[0][i].dtype != dtype) return false;
      for (int l = 0; l < kLists; ++l) entry.data[l] = lists[l][i].data;
      entry.numel = lists[0][i].numel;
      return true;
    };
    launch_tables<kLists>(n, select, [&](const TensorTable<kLists>& table, std::int64_t total) {
      launch_for(tag, table, total);
    });
  };
  for_each_dtype(OptimizerDTypes{}, run);
}

template <DType D>
using Scalar = typename Codec<D>::Compute;

template <typename T>
void launch_sgd_momentum(const SgdParams& o, const TensorTable<3>& table, std::int64_t total,
                         std::int32_t device, cudaStream_t stream) {
  const unsigned blocks = blocks_for(total, device);
  const T lr = T(o.lr), wd = T(o.weight_decay), momentum = T(o.momentum);
  const bool first = o.step == 1;
  auto launch = [&](auto update) {
    sgd_momentum_kernel<T, decltype(update)><<<blocks, kThreads, 0, stream>>>(table, update);
  };
  if (o.nesterov != 0) {
    if (first)
      launch(functors::SgdMomentum<T, true, true>{lr, wd, momentum});
    else
      launch(functors::SgdMomentum<T, true, false>{lr, wd, momentum});
  } else {
    if (first)
      launch(functors::SgdMomentum<T, false, true>{lr, wd, momentum});
    else
      launch(functors::SgdMomentum<T, false, false>{lr, wd, momentum});
  }
  check_launch("sgd_momentum_kernel");
}

}  // namespace

// ---- entry points ---------------------------------------------------------------------

int sgd_step(const SgdParams* options, const DeviceTensor* params, const DeviceTensor* grads,
             const DeviceTensor* momentum_buffers, std::size_t n, Stream stream) noexcept {
  return plugin::guarded([&] {
    if (n == 0) return;
    require_optimizer_dtypes("sgd_step", params, n);
    const SgdParams& o = *options;
    const std::int32_t device = params[0].device;
    DeviceGuard guard(device);
    const cudaStream_t s = to_cuda(stream);
    if (o.momentum == 0.0) {
      const DeviceTensor* const lists[2] = {params, grads};
      per_optimizer_dtype(lists, n, [&](auto tag, const TensorTable<2>& table, std::int64_t total) {
        using T = Scalar<decltype(tag)::value>;
        sgd_plain_kernel<T, functors::SgdPlain<T>><<<blocks_for(total, device), kThreads, 0, s>>>(
            table, functors::SgdPlain<T>{T(o.lr), T(o.weight_decay)});
        check_launch("sgd_plain_kernel");
      });
      return;
    }
    const DeviceTensor* const lists[3] = {params, grads, momentum_buffers};
    per_optimizer_dtype(lists, n, [&](auto tag, const TensorTable<3>& table, std::int64_t total) {
      launch_sgd_momentum<Scalar<decltype(tag)::value>>(o, table, total, device, s);
    });
  });
}

int adamw_step(const AdamWParams* options, const DeviceTensor* params, const DeviceTensor* grads,
               const DeviceTensor* exp_avg, const DeviceTensor* exp_avg_sq, std::size_t n,
               Stream stream) noexcept {
  return plugin::guarded([&] {
    if (n == 0) return;
    require_optimizer_dtypes("adamw_step", params, n);
    const AdamWParams& o = *options;
    const std::int32_t device = params[0].device;
    DeviceGuard guard(device);
    const cudaStream_t s = to_cuda(stream);
    const DeviceTensor* const lists[4] = {params, grads, exp_avg, exp_avg_sq};
    per_optimizer_dtype(lists, n, [&](auto tag, const TensorTable<4>& table, std::int64_t total) {
      using T = Scalar<decltype(tag)::value>;
      const auto update =
          functors::AdamW<T>::make(o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.step);
      adamw_kernel<T><<<blocks_for(total, device), kThreads, 0, s>>>(table, update);
      check_launch("adamw_kernel");
    });
  });
}

}  // namespace concord::cuda_exec
