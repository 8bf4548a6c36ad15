// libconcord's side of the CUDA plugin: finds libconcord_cuda.so next to
// libconcord.so, loads it once on first use (a CUDA tensor, a build_info()
// query) and hands out its tables. Every failure is an Error saying what was
// looked for and why it is unusable.
#pragma once

#include <string>

#include "plugin/cuda_plugin_abi.hpp"

namespace concord::plugin {

// Whether this build has the plugin at all (meson option `cuda`).
bool built() noexcept;

// The plugin's tables; throw Error(kUnavailable) when the plugin was not
// built, cannot be loaded, or is of another ABI version.
const KernelsApi& kernels();
const NcclApi& nccl();

// Throws Error(rc, "<what>: <the plugin's message>") when rc != 0.
void check(int rc, const char* (*last_error)(), const char* what);

// What the plugin found on this machine, without throwing: ok() is false
// (with the reason) when the plugin itself is missing or broken.
struct Availability {
  bool plugin_loaded = false;
  std::string plugin_problem;  // why the plugin did not load, or ""
  Probe probe{};                // valid when plugin_loaded
};
Availability availability();

// Throws Error(kUnavailable) saying what is missing (the plugin, a driver, a
// device, NCCL when `need_nccl`) unless CUDA device `device` can be used, and
// InvalidArgument when no such device exists. `what` starts the message.
// Local: callers check it before a rendezvous, so ranks fail at once.
void require_device(int device, bool need_nccl, const char* what);

}  // namespace concord::plugin
