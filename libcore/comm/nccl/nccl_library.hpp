// NCCL, loaded with dlopen inside the CUDA plugin: the plugin
// is built against nccl.h for its types only, so it loads on machines
// without NCCL and says what it looked for when a communicator needs it.
//
// Where it looks, in order: $CONCORD_NCCL_LIBRARY (a path; nothing else is
// tried then); a libnccl.so.2 already loaded in the process (a framework's);
// the nvidia-nccl wheel next to the concord package
// (site-packages/nvidia/nccl/lib); libnccl.so.2 through the dynamic loader
// (LD_LIBRARY_PATH, the loader cache); the CUDA toolkit ($CUDA_HOME,
// /usr/local/cuda).
#pragma once

#include <nccl.h>

#include <string>

namespace concord::nccl {

struct Library {
  decltype(&ncclGetVersion) GetVersion = nullptr;
  decltype(&ncclGetUniqueId) GetUniqueId = nullptr;
  decltype(&ncclCommInitRankConfig) CommInitRankConfig = nullptr;
  decltype(&ncclCommSplit) CommSplit = nullptr;  // null before NCCL 2.18
  decltype(&ncclCommFinalize) CommFinalize = nullptr;
  decltype(&ncclCommDestroy) CommDestroy = nullptr;
  decltype(&ncclCommAbort) CommAbort = nullptr;
  decltype(&ncclCommGetAsyncError) CommGetAsyncError = nullptr;
  decltype(&ncclGetErrorString) GetErrorString = nullptr;
  decltype(&ncclGetLastError) GetLastError = nullptr;
  decltype(&ncclAllReduce) AllReduce = nullptr;
  decltype(&ncclAllGather) AllGather = nullptr;
  decltype(&ncclReduceScatter) ReduceScatter = nullptr;
  decltype(&ncclBroadcast) Broadcast = nullptr;
  decltype(&ncclGroupStart) GroupStart = nullptr;
  decltype(&ncclGroupEnd) GroupEnd = nullptr;

  int version = 0;   // ncclGetVersion's code, e.g. 22807
  std::string path;  // the file loaded
};

// The loaded library, or nullptr with `problem` saying what was tried and
// why each failed. Loads once; later calls return the same result.
const Library* library(std::string* problem);

// Throws Error(kUnavailable) with that message when NCCL is missing.
const Library& require_library();

// "2.28.9" from a version code.
std::string version_string(int code);

}  // namespace concord::nccl
