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
#include "rendezvous/job_file.hpp"
#include "rendezvous/store.hpp"

namespace concord {

struct WorldOptions {
  BootstrapArgs bootstrap;           // explicit values; unset fields come from the environment
  std::optional<double> timeout_s;   // unset: CONCORD_TIMEOUT, else 600 s
  BackendChoice backend = BackendChoice::kAuto;
  // Another process serves the store (rank 0's caller, say): rank 0 must
  // not, as with CONCORD_STORE_SERVER=launcher.
  bool store_served_elsewhere = false;
};

struct World {
  std::unique_ptr<StoreServer> server;  // when this process serves the store; outlives comm
  std::unique_ptr<JobFile> job_file;    // where this process published the store
  std::unique_ptr<Communicator> comm;
};

// The world communicator. Rank and world size come from the options, then
// the launcher's environment (rendezvous/bootstrap.hpp). The store is
// never served without a secret:
// - a world of one meets on a private store on a free loopback port;
// - given a job token and a store port (explicitly, CONCORD_JOB_TOKEN and
//   CONCORD_MASTER_PORT, or MASTER_PORT outside torchrun), rank 0 serves
//   there, unless the launcher does (CONCORD_STORE_SERVER=launcher, or
//   store_served_elsewhere);
// - otherwise, when the launcher says every rank is on this host, rank 0
//   serves on a free loopback port with a fresh secret (or the given token)
//   and the ranks meet through the job's file (rendezvous/job_file.hpp);
// - otherwise InvalidArgument says what to set.
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
