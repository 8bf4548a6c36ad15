// The C ABI of data parallelism: gradient buckets, fused optimizers and the
// multi-tensor helpers of gradient clipping. Every argument is checked
// before any tensor is read or written. Kernel calls on CUDA tensors are
// enqueued on the stream the caller passes.
#include <cstdint>
#include <memory>
#include <vector>

#include "abi_support.hpp"
#include "base/format.hpp"
#include "base/tensor_view.hpp"
#include "dp/grad_sync.hpp"
#include "kernels/multi_tensor.hpp"
#include "kernels/optim_step.hpp"

// The communicator is borrowed, not owned: concord_comm handles own theirs
// uniquely, so the contract (concord.h) is that the comm handle outlives
// this one.
struct concord_grad_sync {
  std::unique_ptr<concord::dp::GradientSynchronizer> sync;
};

namespace {

using concord::TensorView;
using concord::invalid_argument;
using concord::cabi::read_options;
using concord::cabi::enum_value;
using concord::cabi::require;
using concord::cabi::require_out;
using concord::cabi::to_reduce_op;
using concord::cabi::view;
using concord::cabi::views;

// An optimizer's options: required (a step with default hyperparameters is
// more likely a mistake than a choice), then read as read_options does.
template <typename Options>
Options require_options(const Options* options, const Options& defaults, const char* type,
                        const char* init) {
  if (options == nullptr)
    invalid_argument("options is NULL; pass a ", type, " set up with ", init);
  return read_options(options, defaults, type);
}

concord::dp::Compression to_compression(int c) {
  switch (c) {
    case CONCORD_COMPRESS_NONE: return concord::dp::Compression::kNone;
    case CONCORD_COMPRESS_BF16: return concord::dp::Compression::kBFloat16;
    case CONCORD_COMPRESS_FP16: return concord::dp::Compression::kFloat16;
  }
  invalid_argument("unknown compression ", c,
                   "; valid: CONCORD_COMPRESS_NONE, CONCORD_COMPRESS_BF16, CONCORD_COMPRESS_FP16");
}

concord::dp::GradSyncOptions to_grad_sync_options(const concord_grad_sync_options* given) {
  const concord_grad_sync_options o = read_options(
      given, concord_grad_sync_options CONCORD_GRAD_SYNC_OPTIONS_INIT, "concord_grad_sync_options");
  return {o.bucket_cap_mb, o.first_bucket_mb, to_reduce_op(enum_value(o.op)),
          to_compression(enum_value(o.compress))};
}

std::vector<std::size_t> to_ready_order(const std::int64_t* order, std::size_t n) {
  if (order == nullptr) return {};
  std::vector<std::size_t> result(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (order[i] < 0) invalid_argument("ready_order[", i, "] is ", order[i], ", a negative index");
    result[i] = static_cast<std::size_t>(order[i]);
  }
  return result;
}

}  // namespace

extern "C" {

// ---- gradient buckets ------------------------------------------------------------

concord_status concord_grad_sync_create(concord_comm_t comm, const DLTensor* const* grads,
                                        size_t num_grads, const int64_t* ready_order,
                                        const concord_grad_sync_options* options,
                                        concord_grad_sync_t* out) {
  CONCORD_API_BEGIN
  require_out(out, "out");
  *out = nullptr;
  auto& communicator = require(comm, "comm").comm();
  const concord::dp::GradSyncOptions opts = to_grad_sync_options(options);
  std::vector<TensorView> templates = views(grads, num_grads, "grads", "num_grads");
  auto handle = std::make_unique<concord_grad_sync>();
  handle->sync = std::make_unique<concord::dp::GradientSynchronizer>(
      communicator, std::move(templates), to_ready_order(ready_order, num_grads), opts);
  *out = handle.release();
  CONCORD_API_END
}

concord_status concord_grad_sync_num_buckets(concord_grad_sync_t sync, size_t* num_buckets) {
  CONCORD_API_BEGIN
  require_out(num_buckets, "num_buckets");
  *num_buckets = require(sync, "sync").sync->num_buckets();
  CONCORD_API_END
}

concord_status concord_grad_sync_bucket_of(concord_grad_sync_t sync, size_t index,
                                           size_t* bucket) {
  CONCORD_API_BEGIN
  require_out(bucket, "bucket");
  *bucket = require(sync, "sync").sync->bucket_of(index);
  CONCORD_API_END
}

concord_status concord_grad_sync_mark_ready(concord_grad_sync_t sync, size_t index,
                                            DLTensor* grad, void* stream) {
  CONCORD_API_BEGIN
  auto& s = require(sync, "sync");
  s.sync->mark_ready(index, view(grad, "grad"), stream);
  CONCORD_API_END
}

concord_status concord_grad_sync_wait(concord_grad_sync_t sync, void* stream) {
  CONCORD_API_BEGIN
  require(sync, "sync").sync->wait(stream);
  CONCORD_API_END
}

concord_status concord_grad_sync_destroy(concord_grad_sync_t sync) {
  CONCORD_API_BEGIN
  delete sync;
  CONCORD_API_END
}

// ---- fused optimizers ---------------------------------------------------------------

concord_status concord_optim_sgd_step(const concord_sgd_options* options, size_t num_tensors,
                                      DLTensor* const* params, const DLTensor* const* grads,
                                      DLTensor* const* momentum_buffers, void* stream) {
  CONCORD_API_BEGIN
  const concord_sgd_options o =
      require_options(options, concord_sgd_options CONCORD_SGD_OPTIONS_INIT,
                      "concord_sgd_options", "CONCORD_SGD_OPTIONS_INIT");
  const std::vector<TensorView> p = views(params, num_tensors, "params");
  const std::vector<TensorView> g = views(grads, num_tensors, "grads");
  std::vector<TensorView> buffers;
  if (o.momentum != 0.0) {
    if (momentum_buffers == nullptr && num_tensors != 0)
      invalid_argument("momentum_buffers is NULL but momentum is ", o.momentum,
                       "; pass one buffer per parameter (NULL only when momentum == 0)");
    buffers = views(momentum_buffers, num_tensors, "momentum_buffers");
  }
  concord::kernels::sgd_step({o.lr, o.momentum, o.weight_decay, o.nesterov != 0, o.step}, p, g,
                             buffers, stream);
  CONCORD_API_END
}

concord_status concord_optim_adamw_step(const concord_adamw_options* options, size_t num_tensors,
                                        DLTensor* const* params, const DLTensor* const* grads,
                                        DLTensor* const* exp_avg, DLTensor* const* exp_avg_sq,
                                        void* stream) {
  CONCORD_API_BEGIN
  const concord_adamw_options o =
      require_options(options, concord_adamw_options CONCORD_ADAMW_OPTIONS_INIT,
                      "concord_adamw_options", "CONCORD_ADAMW_OPTIONS_INIT");
  const std::vector<TensorView> p = views(params, num_tensors, "params");
  const std::vector<TensorView> g = views(grads, num_tensors, "grads");
  const std::vector<TensorView> m = views(exp_avg, num_tensors, "exp_avg");
  const std::vector<TensorView> v = views(exp_avg_sq, num_tensors, "exp_avg_sq");
  concord::kernels::adamw_step({o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.step}, p, g, m,
                               v, stream);
  CONCORD_API_END
}

// ---- multi-tensor helpers -----------------------------------------------------------

concord_status concord_tensors_sum_of_squares(size_t num_tensors, const DLTensor* const* tensors,
                                              double* result, void* stream) {
  CONCORD_API_BEGIN
  require_out(result, "result");
  *result = concord::kernels::sum_of_squares(views(tensors, num_tensors, "tensors"), stream);
  CONCORD_API_END
}

concord_status concord_tensors_sum_of_squares_into(size_t num_tensors,
                                                   const DLTensor* const* tensors,
                                                   DLTensor* result, void* stream) {
  CONCORD_API_BEGIN
  const std::vector<TensorView> t = views(tensors, num_tensors, "tensors");
  concord::kernels::sum_of_squares_into(t, view(result, "result"), stream);
  CONCORD_API_END
}

concord_status concord_tensors_scale(size_t num_tensors, DLTensor* const* tensors, double scale,
                                     void* stream) {
  CONCORD_API_BEGIN
  concord::kernels::scale(views(tensors, num_tensors, "tensors"), scale, stream);
  CONCORD_API_END
}

concord_status concord_tensors_clip_by_sum_of_squares(size_t num_tensors,
                                                      DLTensor* const* tensors,
                                                      const DLTensor* sum_of_squares,
                                                      double max_norm, void* stream) {
  CONCORD_API_BEGIN
  const std::vector<TensorView> t = views(tensors, num_tensors, "tensors");
  concord::kernels::clip_by_sum_of_squares(t, view(sum_of_squares, "sum_of_squares"), max_norm,
                                           stream);
  CONCORD_API_END
}

}  // extern "C"
