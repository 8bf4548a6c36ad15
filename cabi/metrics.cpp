// The C ABI of the metric update kernels: the kernel looked up by name, its
// DLTensors turned into views named by the kernel's signature, then
// libcore/metrics validates and runs the update (on CUDA tensors, enqueued
// on the caller's stream).
#include "abi_support.hpp"
#include "metrics/updates.hpp"

namespace {

using concord::TensorView;
using concord::invalid_argument;
using concord::metrics::MetricKernel;

}  // namespace

concord_status concord_metric_update(const char* kernel, DLTensor* state,
                                     const DLTensor* const* inputs, size_t num_inputs,
                                     const concord_metric_options* options, void* stream) {
  CONCORD_API_BEGIN
  concord::cabi::require(kernel, "kernel");
  const MetricKernel which = concord::metrics::kernel_from_name(kernel);
  const concord_metric_options o = concord::cabi::read_options(
      options, concord_metric_options CONCORD_METRIC_OPTIONS_INIT, "concord_metric_options");
  // The kernel's name prefixes each role in messages ("confusion_matrix:
  // preds tensor is NULL"), as the kernels' own messages are prefixed.
  const concord::metrics::KernelSignature s = concord::metrics::signature(which);
  if (num_inputs > s.max_inputs)
    invalid_argument(kernel, ": ", num_inputs, " inputs given, it takes at most ", s.max_inputs);
  if (inputs == nullptr && num_inputs != 0)
    invalid_argument(kernel, ": inputs is NULL but num_inputs is ", num_inputs);
  auto view = [kernel](const DLTensor* tensor, const char* role) {
    return concord::cabi::view(tensor, concord::cabi::RoleName(kernel, role).c_str());
  };
  const TensorView state_view = view(state, s.state);
  TensorView views[concord::plugin::kMaxMetricInputs];
  std::size_t n = 0;
  // An optional input may be NULL: it is left out, with those after it.
  for (; n < num_inputs && !(inputs[n] == nullptr && n >= s.required_inputs); ++n)
    views[n] = view(inputs[n], s.inputs[n]);
  concord::metrics::update(which, state_view, {views, n}, {o.threshold, o.k}, stream);
  CONCORD_API_END
}
