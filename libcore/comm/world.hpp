// How a process joins its job: the set-up policy behind concord_comm_init
// and init() (explicit values first, then the environment), and the
// communicators made on an existing store.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "comm/backend_choice.hpp"
#include "comm/communicator.hpp"
#include "rendezvous/bootstrap.hpp"
#include "rendezvous/store.hpp"

namespace concord {

struct WorldOptions {
  BootstrapArgs bootstrap;           // explicit values; unset fields come from the environment
  std::optional<double> timeout_s;   // unset: CONCORD_TIMEOUT, else 600 s
  BackendChoice backend = BackendChoice::kAuto;
};

struct World {
  std::unique_ptr<StoreServer> server;  // when this process serves the store; outlives comm
  std::unique_ptr<Communicator> comm;
};

// The world communicator. Rank and world size come from the options, then
// the launcher's environment (rendezvous/bootstrap.hpp); a world of one
// meets on a private store on a free loopback port, otherwise rank 0
// serves the store unless the launcher does (CONCORD_STORE_SERVER).
World init_world(const WorldOptions& options);

// A communicator of `size` ranks meeting through `store` under key prefix
// `name`. Every join of a name by a rank is a new generation of it, so a
// communicator made again under the same name (init after shutdown) never
// meets stale keys.
std::unique_ptr<Communicator> join_communicator(std::shared_ptr<SharedStore> store,
                                                const std::string& name, int rank, int size,
                                                double timeout_s,
                                                BackendChoice backend = BackendChoice::kAuto);

// CONCORD_TIMEOUT, else 600 s; InvalidArgument unless positive.
double default_timeout_s();

}  // namespace concord
