#include "comm/backends.hpp"

#include <algorithm>
#include <mutex>
#include <numeric>
#include <optional>

#include "base/format.hpp"
#include "comm/nccl/nccl_backend.hpp"
#include "comm/shm/shm_backend.hpp"
#include "plugin/cuda_plugin.hpp"
#include "rendezvous/store.hpp"
#if CONCORD_GLOO_BUILT
#include "comm/gloo/gloo_backend.hpp"
#include "comm/gloo/setup_agreement.hpp"
#include "comm/hierarchical/hierarchical_backend.hpp"
#endif

namespace concord {
namespace {

std::unique_ptr<Backend> make_shm(const Peers& peers) {
  std::lock_guard lock(peers.store.mutex);
  return std::make_unique<shm::ShmBackend>(*peers.store.client, peers.name, peers.rank, peers.size,
                                           shm::ShmConfig::from_env(peers.size, peers.timeout_s));
}

#if CONCORD_GLOO_BUILT

std::vector<int> ranks_up_to(int size) {
  std::vector<int> ranks(static_cast<std::size_t>(size));
  std::iota(ranks.begin(), ranks.end(), 0);
  return ranks;
}

// Makes the backends of a set-up with `make`; every rank of `setup`
// succeeds or every rank fails.
template <class Make>
auto agreed(const gloo::SetupAgreement& setup, Make&& make) {
  decltype(make()) made;
  std::optional<Status> failure;
  try {
    made = make();
  } catch (const Error& e) {
    failure = e.status();
  }
  setup.conclude(failure);
  return made;
}

std::unique_ptr<Backend> make_gloo(const Peers& peers) {
  const std::vector<int> names = ranks_up_to(peers.size);
  const gloo::SetupAgreement setup(peers.store, peers.name + "/gloo-setup", peers.rank, names,
                                   peers.timeout_s);
  return agreed(setup, [&] {
    return std::make_unique<gloo::GlooBackend>(peers.store, peers.name, peers.rank, names,
                                               peers.timeout_s,
                                               gloo::default_one_shot_bytes(peers.size), setup);
  });
}

// The shm+gloo backend's three parts (comm/hierarchical/hierarchical_backend.hpp),
// each made collectively over its group: first the hosts' shm, then the
// world's mesh, then the shard groups'.
std::unique_ptr<Backend> make_shm_gloo(const Peers& peers) {
  using hierarchical::HostLayout;
  HostLayout layout = HostLayout::of(peers.hosts, peers.rank);
  const std::vector<int> names = ranks_up_to(peers.size);
  const gloo::SetupAgreement setup(peers.store, peers.name + "/shm+gloo-setup", peers.rank, names,
                                   peers.timeout_s);
  return agreed(setup, [&]() -> std::unique_ptr<Backend> {
    const std::string& host_id = layout.host_ids[layout.host];
    const std::vector<std::string> local_hosts(layout.local_ranks().size(), host_id);
    const std::string local_name = concat(peers.name, "/host", layout.host);
    auto local = make_shm(Peers{peers.store, local_name, layout.local,
                                static_cast<int>(local_hosts.size()), peers.timeout_s, local_hosts});
    // The world's mesh agrees, and carries the small collectives whole.
    auto world = std::make_unique<gloo::GlooBackend>(peers.store, peers.name, peers.rank, names,
                                                     peers.timeout_s,
                                                     gloo::default_one_shot_bytes(peers.size), setup);
    std::unique_ptr<Backend> across;
    if (layout.local < layout.shards) {
      const std::vector<int> group = layout.shard_group(layout.local);
      across = std::make_unique<gloo::GlooBackend>(
          peers.store, concat(peers.name, "/shard", layout.local), layout.host, group,
          peers.timeout_s, gloo::default_one_shot_bytes(layout.nhosts()), setup);
    }
    return std::make_unique<hierarchical::HierarchicalBackend>(std::move(layout), std::move(world),
                                                               std::move(local), std::move(across));
  });
}

#endif

[[noreturn]] void fail_spanning(const Peers& peers, const std::string& other, const char* needs) {
  fail(StatusCode::kUnavailable, "ranks of communicator '", peers.name, "' span hosts (",
       peers.hosts[peers.rank], ", ", other, "): ", needs);
}

}  // namespace

bool gloo_built() noexcept { return CONCORD_GLOO_BUILT; }

void check_backend_usable(BackendChoice choice) {
  if (choice == BackendChoice::kGloo && !gloo_built())
    fail(StatusCode::kUnavailable, "backend 'gloo' is not in this build");
  if (choice == BackendChoice::kNccl)
    plugin::require_device(0, /*need_nccl=*/true, "backend 'nccl'");
}

std::unique_ptr<Backend> make_host_backend(BackendChoice choice, const Peers& peers) {
  if (choice == BackendChoice::kNccl) return nullptr;
  check_backend_usable(choice);
  const auto other = std::find_if(peers.hosts.begin(), peers.hosts.end(),
                                  [&](const std::string& h) { return h != peers.hosts[peers.rank]; });
  const bool one_host = other == peers.hosts.end();
  if (choice == BackendChoice::kShm && !one_host)
    fail_spanning(peers, *other,
                  "backend 'shm' needs every rank on one host; use 'gloo' or 'auto' across hosts");
  if (choice == BackendChoice::kShm || (choice == BackendChoice::kAuto && one_host))
    return make_shm(peers);
#if CONCORD_GLOO_BUILT
  if (choice == BackendChoice::kGloo) return make_gloo(peers);
  const bool one_rank_a_host = std::all_of(peers.hosts.begin(), peers.hosts.end(), [&](const auto& h) {
    return std::count(peers.hosts.begin(), peers.hosts.end(), h) == 1;
  });
  return one_rank_a_host ? make_gloo(peers) : make_shm_gloo(peers);
#else
  fail_spanning(peers, *other,
                "CPU collectives across hosts need the gloo backend, which is not in this build");
#endif
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
