// Tests that hand the kernels CUDA tensors with fake device pointers, to see
// validation and the plugin's absence, must not reach a working CUDA
// plugin: there the kernels would run on those pointers.
#pragma once

#include "plugin/cuda_plugin.hpp"

namespace concord::testing {

// Whether CUDA kernels can run in this process (the plugin loads and sees
// a device).
inline bool cuda_kernels_run_here() {
  const plugin::Availability a = plugin::availability();
  return a.plugin_loaded && a.probe.device_count > 0;
}

}  // namespace concord::testing
