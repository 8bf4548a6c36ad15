#include "comm/backends.hpp"

#include <algorithm>
#include <mutex>

#include "base/format.hpp"
#include "comm/nccl/nccl_backend.hpp"
#include "comm/shm/shm_backend.hpp"
#include "plugin/cuda_plugin.hpp"
#include "rendezvous/store.hpp"

namespace concord {

void check_backend_usable(BackendChoice choice) {
  if (choice == BackendChoice::kGloo)
    fail(StatusCode::kUnavailable, "backend 'gloo' is not in this build");
  if (choice == BackendChoice::kNccl)
    plugin::require_device(0, /*need_nccl=*/true, "backend 'nccl'");
}

std::unique_ptr<Backend> make_host_backend(BackendChoice choice, const Peers& peers) {
  if (choice == BackendChoice::kNccl) return nullptr;
  if (choice == BackendChoice::kGloo) check_backend_usable(choice);
  const auto other = std::find_if(peers.hosts.begin(), peers.hosts.end(),
                                  [&](const std::string& h) { return h != peers.hosts[peers.rank]; });
  if (other != peers.hosts.end())
    fail(StatusCode::kUnavailable, "ranks of communicator '", peers.name, "' span hosts (",
         peers.hosts[peers.rank], ", ", *other,
         "): CPU collectives across hosts need the gloo backend, which is not in this build");
  std::lock_guard lock(peers.store.mutex);
  return std::make_unique<shm::ShmBackend>(*peers.store.client, peers.name, peers.rank, peers.size,
                                           shm::ShmConfig::from_env(peers.size, peers.timeout_s));
}

std::unique_ptr<Backend> make_device_backend(BackendChoice choice, const Peers& peers,
                                             const Device& device, const char* op,
                                             std::uint64_t attempt) {
  if (choice == BackendChoice::kShm || choice == BackendChoice::kGloo)
    invalid_argument(op, ": CUDA tensors on a communicator of backend '",
                     backend_choice_name(choice),
                     "', which takes CPU tensors; init with backend 'auto' or 'nccl' for them");
  return NcclBackend::create(peers, device.id, op, attempt);
}

}  // namespace concord
