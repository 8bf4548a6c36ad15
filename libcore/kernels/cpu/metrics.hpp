// The metric update kernels on the CPU (plugin/metric_kernels.hpp). Pure
// executors: the arguments are validated by the device-neutral front
// (metrics/updates.hpp), which is what callers use. What needs the data
// itself is checked here (labels in range, binary labels 0 or 1, histogram
// scores in [0, 1]): such an update throws InvalidArgument naming the first
// bad element and leaves the state as it was.
#pragma once

#include "plugin/metric_kernels.hpp"

namespace concord::cpu {

void metric_update(plugin::MetricKernel kernel, const plugin::MetricArgs& args);

}  // namespace concord::cpu
