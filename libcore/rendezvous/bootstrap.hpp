// Where a process finds its rank, world size and store:
// explicit arguments first, then CONCORD_*, torchrun (RANK, WORLD_SIZE,
// LOCAL_RANK, MASTER_ADDR, MASTER_PORT), Open MPI (OMPI_COMM_WORLD_*),
// PMI_*, SLURM_*; nothing set means a world of one.
#pragma once

#include <optional>
#include <string>

namespace concord {

struct BootstrapArgs {  // explicit arguments; unset fields come from the environment
  std::optional<int> rank;
  std::optional<int> world_size;
  std::optional<std::string> master_addr;
  std::optional<int> master_port;
  std::optional<std::string> token;
};

struct BootstrapConfig {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // Whether master_port was given (explicitly, CONCORD_MASTER_PORT, or
  // MASTER_PORT) and is concord's to use: under torchrun MASTER_PORT is the
  // port of torchrun's own store.
  bool port_given = false;
  std::string token;           // CONCORD_JOB_TOKEN; empty when none was configured
  bool serve_store = false;    // rank 0 serves unless CONCORD_STORE_SERVER=launcher
  // Whether the launcher says every rank runs on this host (its local world
  // size is the world size, or it placed the job on one node).
  bool one_host = false;
  std::string source;          // which convention supplied rank/world: "explicit", "concord", "torchrun", ...
};

// Throws InvalidArgument for contradictory or out-of-range values
// (rank outside [0, world_size), world_size < 1, port outside 1..65535).
// A local rank read from another source than rank and world size (explicit
// arguments beside a launcher's LOCAL_RANK, say) is kept only when it fits
// the world size: explicit values win over the environment.
BootstrapConfig resolve_bootstrap(const BootstrapArgs& args);

}  // namespace concord
