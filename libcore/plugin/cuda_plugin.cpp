#include "plugin/cuda_plugin.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <string>

#include "base/format.hpp"
#include "base/status.hpp"

#ifndef CONCORD_CUDA_PLUGIN_BUILT
#define CONCORD_CUDA_PLUGIN_BUILT 0
#endif

namespace concord::plugin {
namespace {

constexpr const char* kPluginFile = "libconcord_cuda.so";

// The directory of the library this code is linked into (libconcord.so, or
// a test binary): the plugin is installed next to it.
std::string own_directory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&own_directory), &info) == 0 || info.dli_fname == nullptr)
    return ".";
  const std::string path = info.dli_fname;
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

struct Loaded {
  const KernelsApi* kernels = nullptr;
  const NcclApi* nccl = nullptr;
  std::string problem;  // why the plugin is unusable, or ""
};

Loaded load() {
  Loaded result;
  if (!CONCORD_CUDA_PLUGIN_BUILT) {
    result.problem =
        "this build of concord has no CUDA support (built with -Dcuda=disabled or without nvcc)";
    return result;
  }
  // $CONCORD_CUDA_PLUGIN names the file directly (tests of an uninstalled
  // build); otherwise it sits next to this library.
  const char* given = std::getenv("CONCORD_CUDA_PLUGIN");
  const std::string path =
      given != nullptr && *given ? std::string(given) : own_directory() + "/" + kPluginFile;
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    result.problem = concat("the CUDA plugin could not be loaded from ", path, ": ",
                            why ? why : "unknown error");
    return result;
  }
  auto kernels_fn = reinterpret_cast<concord_plugin_kernels_fn>(dlsym(handle, "concord_plugin_kernels"));
  auto nccl_fn = reinterpret_cast<concord_plugin_nccl_fn>(dlsym(handle, "concord_plugin_nccl"));
  if (kernels_fn == nullptr || nccl_fn == nullptr) {
    result.problem = concat(path, " is not a concord CUDA plugin (entry points missing)");
    return result;
  }
  const KernelsApi* kernels = kernels_fn();
  const NcclApi* nccl = nccl_fn();
  if (kernels->abi_version != kAbiVersion || nccl->abi_version != kAbiVersion) {
    result.problem = concat(path, " has plugin ABI version ", kernels->abi_version,
                            ", this libconcord needs ", kAbiVersion, "; reinstall concord");
    return result;
  }
  result.kernels = kernels;
  result.nccl = nccl;
  return result;  // the handle stays open for the life of the process
}

const Loaded& loaded() {
  static const Loaded plugin = load();
  return plugin;
}

const Loaded& require() {
  const Loaded& plugin = loaded();
  if (!plugin.problem.empty()) fail(StatusCode::kUnavailable, "CUDA tensors: ", plugin.problem);
  return plugin;
}

}  // namespace

bool built() noexcept { return CONCORD_CUDA_PLUGIN_BUILT != 0; }

const KernelsApi& kernels() { return *require().kernels; }
const NcclApi& nccl() { return *require().nccl; }

void check(int rc, const char* (*last_error)(), const char* what) {
  if (rc == 0) return;
  const char* message = last_error();
  fail(static_cast<StatusCode>(rc), what, ": ", message && *message ? message : "failed");
}

Availability availability() {
  Availability out;
  const Loaded& plugin = loaded();
  if (!plugin.problem.empty()) {
    out.plugin_problem = plugin.problem;
    return out;
  }
  if (plugin.nccl->probe(&out.probe) != 0) {
    out.plugin_problem = concat("the CUDA plugin's probe failed: ", plugin.nccl->last_error());
    return out;
  }
  out.plugin_loaded = true;
  return out;
}

void require_device(int device, bool need_nccl, const char* what) {
  const Availability found = availability();
  if (!found.plugin_loaded)
    fail(StatusCode::kUnavailable, what, ": CUDA is unavailable: ", found.plugin_problem);
  if (found.probe.device_count == 0)
    fail(StatusCode::kUnavailable, what, ": CUDA is unavailable: ", found.probe.cuda_problem);
  if (need_nccl && found.probe.nccl_version == 0)
    fail(StatusCode::kUnavailable, what, ": ", found.probe.nccl_problem);
  if (device < 0 || device >= found.probe.device_count)
    invalid_argument(what, ": cuda:", device, " does not exist (", found.probe.device_count,
                     " CUDA devices)");
}

}  // namespace concord::plugin
