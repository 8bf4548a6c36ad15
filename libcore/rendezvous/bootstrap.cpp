#include "rendezvous/bootstrap.hpp"

#include <array>
#include <climits>

#include "base/env.hpp"
#include "base/format.hpp"

namespace concord {
namespace {

// A launcher's names for rank, world size and local rank, in lookup order.
struct Convention {
  const char* name;
  const char* rank;
  const char* world_size;
  std::array<const char*, 2> local_rank;  // unused slots are nullptr
};

constexpr std::array<Convention, 5> kConventions{{
    {"concord", "CONCORD_RANK", "CONCORD_WORLD_SIZE", {"CONCORD_LOCAL_RANK", nullptr}},
    {"torchrun", "RANK", "WORLD_SIZE", {"LOCAL_RANK", nullptr}},
    {"openmpi",
     "OMPI_COMM_WORLD_RANK",
     "OMPI_COMM_WORLD_SIZE",
     {"OMPI_COMM_WORLD_LOCAL_RANK", nullptr}},
    {"pmi", "PMI_RANK", "PMI_SIZE", {"MPI_LOCALRANKID", "PMI_LOCAL_RANK"}},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", {"SLURM_LOCALID", nullptr}},
}};

constexpr int kDefaultPort = 29500;
constexpr const char* kDefaultAddr = "127.0.0.1";

bool is_set(const char* name) { return env::get(name).has_value(); }

std::optional<int> env_int(const char* name) {
  auto value = env::get_int(name);
  if (!value) return std::nullopt;
  if (*value < INT_MIN || *value > INT_MAX)
    invalid_argument("environment variable ", name, "=", *value, " is out of range");
  return static_cast<int>(*value);
}

// The first convention that sets a field the caller did not pass.
const Convention* find_convention(bool need_rank, bool need_world) {
  for (const auto& convention : kConventions) {
    if ((need_rank && is_set(convention.rank)) || (need_world && is_set(convention.world_size)))
      return &convention;
  }
  return nullptr;
}

// Reads one of a convention's fields; a launcher that sets rank but not
// world size (or the reverse) is misconfigured, and guessing would hang.
int required(const char* name, const char* other) {
  auto value = env_int(name);
  if (!value) invalid_argument("environment variable ", other, " is set but ", name, " is not");
  return *value;
}

std::optional<int> local_rank_of(const Convention& convention) {
  for (const char* name : convention.local_rank) {
    if (name == nullptr) break;
    if (auto value = env_int(name)) return value;
  }
  return std::nullopt;
}

// The chosen convention's local rank, else the first one any convention
// sets that fits the world size, else 0.
int resolve_local_rank(const Convention* chosen, int world_size) {
  if (chosen != nullptr) {
    if (auto value = local_rank_of(*chosen)) return *value;
  }
  for (const auto& convention : kConventions) {
    if (auto value = local_rank_of(convention); value && *value >= 0 && *value < world_size)
      return *value;
  }
  return 0;
}

// Launchers that say every rank of the job is on this host: the local world
// size equals the world size, or the job was placed on one node.
bool launcher_says_one_host(int world_size) {
  for (const char* name : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"})
    if (env_int(name) == world_size) return true;
  for (const char* name : {"SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES"})
    if (env_int(name) == 1) return true;
  return false;
}

// torchrun's agent serves its own store on MASTER_PORT.
bool under_torchrun() { return is_set("TORCHELASTIC_RUN_ID"); }

void resolve_rank_and_world(const BootstrapArgs& args, BootstrapConfig& config) {
  const Convention* chosen = find_convention(!args.rank, !args.world_size);
  if (args.rank) {
    config.rank = *args.rank;
  } else if (chosen != nullptr) {
    config.rank = required(chosen->rank, chosen->world_size);
  }
  if (args.world_size) {
    config.world_size = *args.world_size;
  } else if (chosen != nullptr) {
    config.world_size = required(chosen->world_size, chosen->rank);
  }
  config.local_rank = resolve_local_rank(chosen, config.world_size);
  config.one_host = launcher_says_one_host(config.world_size);
  if (chosen != nullptr) {
    config.source = chosen->name;
  } else {
    config.source = args.rank || args.world_size ? "explicit" : "default";
  }
}

void resolve_store(const BootstrapArgs& args, BootstrapConfig& config) {
  if (args.master_addr) {
    config.master_addr = *args.master_addr;
  } else {
    config.master_addr =
        env::get("CONCORD_MASTER_ADDR").value_or(env::get("MASTER_ADDR").value_or(kDefaultAddr));
  }
  std::optional<int> port = args.master_port;
  if (!port) port = env_int("CONCORD_MASTER_PORT");
  if (!port && !under_torchrun()) port = env_int("MASTER_PORT");
  config.port_given = port.has_value();
  config.master_port = port.value_or(kDefaultPort);
  config.token = args.token ? *args.token : env::get("CONCORD_JOB_TOKEN").value_or("");

  auto server = env::get("CONCORD_STORE_SERVER").value_or("rank0");
  if (server != "rank0" && server != "launcher")
    invalid_argument("CONCORD_STORE_SERVER='", server, "' must be 'rank0' or 'launcher'");
  config.serve_store = server == "rank0" && config.rank == 0;
}

std::string from_where(const BootstrapConfig& config) {
  return config.source == "explicit" || config.source == "default"
             ? std::string()
             : concat(" (from the ", config.source, " environment)");
}

void validate(const BootstrapConfig& config) {
  if (config.world_size < 1)
    invalid_argument("world size must be >= 1, got ", config.world_size, from_where(config));
  if (config.rank < 0 || config.rank >= config.world_size)
    invalid_argument("rank ", config.rank, " outside [0, ", config.world_size, ")",
                     from_where(config));
  if (config.local_rank < 0 || config.local_rank >= config.world_size)
    invalid_argument("local rank ", config.local_rank, " outside [0, ", config.world_size, ")");
  if (config.master_addr.empty()) invalid_argument("master address must not be empty");
  if (config.master_port < 1 || config.master_port > 65535)
    invalid_argument("master port ", config.master_port, " outside 1..65535");
}

}  // namespace

BootstrapConfig resolve_bootstrap(const BootstrapArgs& args) {
  BootstrapConfig config;
  resolve_rank_and_world(args, config);
  resolve_store(args, config);
  validate(config);
  return config;
}

}  // namespace concord
