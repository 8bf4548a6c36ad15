// The one place that knows every backend: which one serves a communicator's
// CPU tensors and which its CUDA tensors, given the backend choice and where
// the ranks are. The Communicator sees only comm/backend.hpp's interface.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/tensor_view.hpp"
#include "comm/backend.hpp"
#include "comm/backend_choice.hpp"

namespace concord {

struct SharedStore;

// The ranks a backend is made for: `size` ranks meeting under key prefix
// `name` in the store; hosts[q] identifies rank q's host.
struct Peers {
  SharedStore& store;
  const std::string& name;
  int rank;
  int size;
  double timeout_s;
  const std::vector<std::string>& hosts;
};

// Whether this build has the gloo and shm+gloo backends (Gloo was found).
bool gloo_built() noexcept;

// Throws, before any communication, when `choice` cannot serve this process
// at all: Unavailable for a backend not in this build, or nccl without a
// usable CUDA device, driver, NCCL and plugin.
void check_backend_usable(BackendChoice choice);

// The backend of CPU tensors. auto: shm when every rank is on one host,
// gloo when every host has one rank, shm+gloo otherwise; shm: shm, on one
// host only; gloo: gloo, wherever the ranks are. nullptr when `choice`
// takes no CPU tensors (nccl). Collective: every rank of `peers` calls it,
// and every rank succeeds or every rank fails. Throws Unavailable for shm
// with ranks on several hosts, and for ranks on several hosts without gloo
// in this build.
std::unique_ptr<Backend> make_host_backend(BackendChoice choice, const Peers& peers);

// The backend of CUDA tensors on `device` (nccl), for the first CUDA
// collective `op`; `attempt` counts earlier attempts of this communicator,
// so that a retry never meets a failed attempt's keys. Collective. Throws
// InvalidArgument when `choice` takes no CUDA tensors, Unavailable (before
// any communication) when CUDA or NCCL cannot be used here.
std::unique_ptr<Backend> make_device_backend(BackendChoice choice, const Peers& peers,
                                             const Device& device, const char* op,
                                             std::uint64_t attempt);

}  // namespace concord
