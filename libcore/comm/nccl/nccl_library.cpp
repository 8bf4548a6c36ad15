#include "comm/nccl/nccl_library.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "base/format.hpp"

namespace concord::nccl {
namespace {

// Where this plugin's file is: the wheel's NCCL is found relative to it.
std::string plugin_directory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&plugin_directory), &info) == 0 || info.dli_fname == nullptr)
    return {};
  std::string path = info.dli_fname;
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

// In order; an entry "!name" means the copy already loaded in the process,
// if any (RTLD_NOLOAD).
std::vector<std::string> candidates(bool* explicit_path) {
  std::vector<std::string> out;
  if (const char* given = std::getenv("CONCORD_NCCL_LIBRARY"); given != nullptr && *given) {
    *explicit_path = true;
    out.emplace_back(given);
    return out;
  }
  *explicit_path = false;
  // A framework's NCCL already in the process (torch loads the wheel's):
  // sharing it avoids two NCCLs in one process.
  out.emplace_back("!libnccl.so.2");
  // The nvidia-nccl wheel before the loader's search path: once a copy is
  // loaded, glibc hands it to every later "libnccl.so.2" by name, so a
  // system copy older than the wheel would break a framework imported
  // afterwards that needs the wheel's symbols.
  // <site-packages>/concord/lib/libconcord_cuda.so -> <site-packages>/nvidia/nccl/lib
  if (const std::string dir = plugin_directory(); !dir.empty())
    out.push_back(dir + "/../../nvidia/nccl/lib/libnccl.so.2");
  out.emplace_back("libnccl.so.2");
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"})
    if (const char* home = std::getenv(var); home != nullptr && *home) {
      out.push_back(std::string(home) + "/lib64/libnccl.so.2");
      out.push_back(std::string(home) + "/lib/libnccl.so.2");
    }
  out.emplace_back("/usr/local/cuda/lib64/libnccl.so.2");
  out.emplace_back("/usr/local/cuda/lib/libnccl.so.2");
  return out;
}

template <class Fn>
bool resolve(void* handle, const char* name, Fn& fn, std::string* missing) {
  fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (fn == nullptr) {
    if (!missing->empty()) *missing += ", ";
    *missing += name;
    return false;
  }
  return true;
}

struct Loaded {
  Library library;
  bool ok = false;
  std::string problem;
};

Loaded load() {
  Loaded result;
  bool explicit_path = false;
  std::string tried;
  for (const std::string& candidate : candidates(&explicit_path)) {
    const bool loaded_only = candidate.front() == '!';
    const std::string path = loaded_only ? candidate.substr(1) : candidate;
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | (loaded_only ? RTLD_NOLOAD : 0));
    if (handle == nullptr) {
      if (loaded_only) {
        dlerror();
        continue;  // none loaded yet: not worth a line in the message
      }
      const char* why = dlerror();
      tried += "\n  " + path + ": " + (why ? why : "not loadable");
      continue;
    }
    Library& lib = result.library;
    std::string missing;
    bool ok = resolve(handle, "ncclGetVersion", lib.GetVersion, &missing);
    ok &= resolve(handle, "ncclGetUniqueId", lib.GetUniqueId, &missing);
    ok &= resolve(handle, "ncclCommInitRankConfig", lib.CommInitRankConfig, &missing);
    ok &= resolve(handle, "ncclCommFinalize", lib.CommFinalize, &missing);
    ok &= resolve(handle, "ncclCommDestroy", lib.CommDestroy, &missing);
    ok &= resolve(handle, "ncclCommAbort", lib.CommAbort, &missing);
    ok &= resolve(handle, "ncclCommGetAsyncError", lib.CommGetAsyncError, &missing);
    ok &= resolve(handle, "ncclGetErrorString", lib.GetErrorString, &missing);
    ok &= resolve(handle, "ncclGetLastError", lib.GetLastError, &missing);
    ok &= resolve(handle, "ncclAllReduce", lib.AllReduce, &missing);
    ok &= resolve(handle, "ncclAllGather", lib.AllGather, &missing);
    ok &= resolve(handle, "ncclReduceScatter", lib.ReduceScatter, &missing);
    ok &= resolve(handle, "ncclBroadcast", lib.Broadcast, &missing);
    ok &= resolve(handle, "ncclGroupStart", lib.GroupStart, &missing);
    ok &= resolve(handle, "ncclGroupEnd", lib.GroupEnd, &missing);
    if (!ok) {
      tried += "\n  " + path + ": lacks " + missing + " (NCCL 2.14 or newer is needed)";
      dlclose(handle);
      lib = Library{};
      continue;
    }
    lib.CommSplit = reinterpret_cast<decltype(lib.CommSplit)>(dlsym(handle, "ncclCommSplit"));
    if (lib.GetVersion(&lib.version) != ncclSuccess) lib.version = 0;
    char where[4096] = {};
    if (dlinfo(handle, RTLD_DI_ORIGIN, where) == 0 && where[0] != '\0') {
      lib.path = std::string(where) + "/" + path.substr(path.rfind('/') + 1);
    } else {
      lib.path = path;
    }
    if (char* canonical = realpath(lib.path.c_str(), nullptr)) {
      lib.path = canonical;
      std::free(canonical);
    }
    result.ok = true;  // the handle stays open for the life of the process
    return result;
  }
  result.problem = std::string("NCCL could not be loaded; looked for ") +
                   (explicit_path ? "$CONCORD_NCCL_LIBRARY only" : "libnccl.so.2") + ":" + tried +
                   "\nInstall NCCL (the nvidia-nccl-cu12/cu13 wheel, the CUDA toolkit's "
                   "libnccl, or libnccl2), or point CONCORD_NCCL_LIBRARY at libnccl.so.2.";
  return result;
}

}  // namespace

const Library* library(std::string* problem) {
  static const Loaded loaded = load();
  if (!loaded.ok) {
    if (problem != nullptr) *problem = loaded.problem;
    return nullptr;
  }
  return &loaded.library;
}

const Library& require_library() {
  std::string problem;
  const Library* lib = library(&problem);
  if (lib == nullptr) fail(StatusCode::kUnavailable, problem);
  return *lib;
}

std::string version_string(int code) {
  // NCCL_VERSION(X, Y, Z) = X*10000 + Y*100 + Z for every NCCL loaded here
  // (2.14 or newer; the encoding changed at 2.9).
  return concat(code / 10000, ".", (code % 10000) / 100, ".", code % 100);
}

}  // namespace concord::nccl
