#include "comm/world.hpp"

#include <chrono>
#include <mutex>

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

World init_world(const WorldOptions& options) {
  const BootstrapConfig config = resolve_bootstrap(options.bootstrap);
  const double timeout_s = options.timeout_s ? *options.timeout_s : default_timeout_s();
  if (!(timeout_s > 0)) invalid_argument("timeout must be positive, got ", timeout_s, " s");
  check_backend_usable(options.backend);

  World world;
  std::string store_host = config.master_addr;
  int store_port = config.master_port;
  if (config.world_size == 1) {
    // Nobody to meet: a private store on a free loopback port.
    world.server = std::make_unique<StoreServer>("127.0.0.1", 0, config.token);
    store_host = "127.0.0.1";
    store_port = world.server->port();
  } else if (config.serve_store) {
    world.server =
        std::make_unique<StoreServer>(config.master_addr, config.master_port, config.token);
  }
  auto store = std::make_shared<SharedStore>();
  store->client = std::make_unique<StoreClient>(store_host, store_port, config.token,
                                                std::chrono::duration<double>(timeout_s));
  world.comm = make_generation(std::move(store), "world", config.rank, config.world_size,
                               timeout_s, options.backend);
  return world;
}

}  // namespace concord
