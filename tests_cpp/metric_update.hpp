// concord_metric_update called the way the tests read best: the kernel's
// name, the state and a list of inputs, with the options that matter.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "concord/concord.h"

namespace concord::testing {

inline concord_status update_metric(const char* kernel, DLTensor* state,
                                    std::initializer_list<const DLTensor*> inputs,
                                    double threshold = 0.5, std::int64_t k = 1) {
  concord_metric_options options = CONCORD_METRIC_OPTIONS_INIT;
  options.threshold = threshold;
  options.k = k;
  const std::vector<const DLTensor*> list(inputs);
  return concord_metric_update(kernel, state, list.data(), list.size(), &options, nullptr);
}

}  // namespace concord::testing
