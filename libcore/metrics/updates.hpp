// Metric updates: validate a state tensor and its inputs for one of the
// metric kernels (plugin/metric_kernels.hpp, which says what each adds),
// then accumulate the inputs into the state where it lives, with no
// communication. Every failure is an Error, and a failed update leaves the
// state as it was.
//
// The state and its inputs sit on one device: CPU tensors run the CPU
// executor (kernels/cpu/metrics), CUDA tensors the CUDA plugin's
// (kernels/cuda/launch), enqueued on `stream` (nullptr: the legacy default
// stream) with no host synchronisation. Everything checked from shapes,
// dtypes and devices is checked for both; checks of the input values
// themselves (labels in range, binary labels 0 or 1, histogram scores in
// [0, 1]) would need the data on the host, so on CUDA such samples are
// skipped, not rejected.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "base/tensor_view.hpp"
#include "plugin/cuda_plugin_abi.hpp"
#include "plugin/metric_kernels.hpp"

namespace concord::metrics {

using plugin::MetricKernel;

// The scalars of an update; each kernel reads those it names and ignores
// the others.
struct MetricOptions {
  double threshold;  // binary_confusion, multilabel_counts
  std::int64_t k;    // topk_correct
};

// What a kernel's tensors are called in messages: the state, then each
// input; inputs past `required_inputs` may be left out.
struct KernelSignature {
  const char* state;
  const char* inputs[plugin::kMaxMetricInputs];
  std::size_t required_inputs;
  std::size_t max_inputs;
};

KernelSignature signature(MetricKernel kernel);

// The kernel named `name` ("binary_histogram"); InvalidArgument listing the
// valid names otherwise.
MetricKernel kernel_from_name(std::string_view name);

// state += the kernel's counts of `inputs`, in the order of its signature.
void update(MetricKernel kernel, const TensorView& state, std::span<const TensorView> inputs,
            const MetricOptions& options, plugin::Stream stream = nullptr);

}  // namespace concord::metrics
