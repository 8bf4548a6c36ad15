#include "comm/world.hpp"

#include <chrono>
#include <iomanip>
#include <mutex>
#include <random>

#include "base/env.hpp"
#include "base/format.hpp"
#include "comm/backends.hpp"

namespace concord {
namespace {

std::unique_ptr<Communicator> make_generation(std::shared_ptr<SharedStore> store,
                                              const std::string& name, int rank, int size,
                                              double timeout_s, BackendChoice backend) {
  std::int64_t generation;
  {
    std::lock_guard lock(store->mutex);
    generation = store->client->add(concat(name, "/generation/", rank), 1);
  }
  return std::make_unique<Communicator>(std::move(store), concat(name, "#", generation), rank,
                                        size, timeout_s, backend);
}

}  // namespace

double default_timeout_s() {
  const double timeout = env::get_double("CONCORD_TIMEOUT").value_or(600.0);
  if (!(timeout > 0)) invalid_argument("CONCORD_TIMEOUT must be positive, got ", timeout);
  return timeout;
}

std::unique_ptr<Communicator> join_communicator(std::shared_ptr<SharedStore> store,
                                                const std::string& name, int rank, int size,
                                                double timeout_s, BackendChoice backend) {
  check_backend_usable(backend);
  return make_generation(std::move(store), name, rank, size, timeout_s, backend);
}

namespace {

// A fresh secret for a store only this job may use.
std::string random_token() {
  std::random_device device;
  std::string token;
  for (int i = 0; i < 4; ++i) token += concat(std::hex, std::setw(8), std::setfill('0'), device());
  return token;
}

}  // namespace

World init_world(const WorldOptions& options) {
  BootstrapConfig config = resolve_bootstrap(options.bootstrap);
  if (options.store_served_elsewhere) config.serve_store = false;
  const double timeout_s = options.timeout_s ? *options.timeout_s : default_timeout_s();
  if (!(timeout_s > 0)) invalid_argument("timeout must be positive, got ", timeout_s, " s");
  check_backend_usable(options.backend);

  World world;
  StoreEndpoint store{config.master_addr, config.master_port, config.token};
  if (config.world_size == 1) {
    // Nobody to meet: a private store on a free loopback port.
    store = {"127.0.0.1", 0, random_token()};
    world.server = std::make_unique<StoreServer>(store.host, 0, store.token);
    store.port = world.server->port();
  } else if (!config.token.empty() && config.port_given) {
    if (config.serve_store)
      world.server = std::make_unique<StoreServer>(store.host, store.port, store.token);
  } else if (config.one_host) {
    world.job_file = std::make_unique<JobFile>(JobFile::of_this_job(config.world_size));
    if (config.serve_store) {
      store = {"127.0.0.1", 0, config.token.empty() ? random_token() : config.token};
      world.server = std::make_unique<StoreServer>(store.host, 0, store.token);
      store.port = world.server->port();
      world.job_file->publish(store);
    } else {
      store = world.job_file->read(timeout_s);
    }
  } else {
    const char* missing = config.token.empty()
                              ? "no job token is set"
                              : "no store port is set (under torchrun, MASTER_PORT is torchrun's own)";
    invalid_argument("rank ", config.rank, " of ", config.world_size, ": ", missing,
                     " and concord cannot tell that every rank runs on this host, where ranks "
                     "meet without one: set CONCORD_JOB_TOKEN (the same secret on every rank) "
                     "and CONCORD_MASTER_PORT (a free port on the master address), or launch "
                     "with concord-run");
  }
  auto shared = std::make_shared<SharedStore>();
  shared->client = std::make_unique<StoreClient>(store.host, store.port, store.token,
                                                 std::chrono::duration<double>(timeout_s));
  world.comm = make_generation(std::move(shared), "world", config.rank, config.world_size,
                               timeout_s, options.backend);
  return world;
}

}  // namespace concord
