#include <catch2/catch.hpp>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/status.hpp"
#include "rendezvous/bootstrap.hpp"
#include "env_guard.hpp"

using concord::BootstrapArgs;
using concord::BootstrapConfig;
using concord::Error;
using concord::resolve_bootstrap;
using concord::StatusCode;

namespace {

const std::vector<const char*> kVariables{
    "CONCORD_RANK",
    "CONCORD_WORLD_SIZE",
    "CONCORD_LOCAL_RANK",
    "CONCORD_MASTER_ADDR",
    "CONCORD_MASTER_PORT",
    "CONCORD_JOB_TOKEN",
    "CONCORD_STORE_SERVER",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALRANKID",
    "PMI_LOCAL_RANK",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "LOCAL_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MPI_LOCALNRANKS",
    "SLURM_STEP_NUM_NODES",
    "SLURM_JOB_NUM_NODES",
    "TORCHELASTIC_RUN_ID",
};

// Clears every variable bootstrap reads, and restores them afterwards.
class CleanEnv : public concord::testing::EnvGuard {
 public:
  CleanEnv() {
    for (const char* name : kVariables) unset(name);
  }
};

void set(const char* name, const std::string& value) { ::setenv(name, value.c_str(), 1); }

std::string error_message(const BootstrapArgs& args = {}) {
  try {
    resolve_bootstrap(args);
  } catch (const Error& e) {
    CHECK(e.code() == StatusCode::kInvalidArgument);
    return e.what();
  }
  FAIL("resolve_bootstrap did not throw");
  return {};
}

struct Convention {
  const char* source;
  const char* rank;
  const char* world;
  const char* local;
};

const std::vector<Convention> kConventions{
    {"concord", "CONCORD_RANK", "CONCORD_WORLD_SIZE", "CONCORD_LOCAL_RANK"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

}  // namespace

TEST_CASE("bootstrap: nothing set is a world of one", "[bootstrap]") {
  CleanEnv env;
  BootstrapConfig config = resolve_bootstrap({});
  CHECK(config.rank == 0);
  CHECK(config.world_size == 1);
  CHECK(config.local_rank == 0);
  CHECK(config.master_addr == "127.0.0.1");
  CHECK(config.master_port == 29500);
  CHECK(config.token.empty());
  CHECK(config.serve_store);
  CHECK(config.source == "default");
}

TEST_CASE("bootstrap: each launcher convention is read", "[bootstrap]") {
  for (const auto& convention : kConventions) {
    CleanEnv env;
    INFO(convention.source);
    set(convention.rank, "2");
    set(convention.world, "4");
    set(convention.local, "1");
    BootstrapConfig config = resolve_bootstrap({});
    CHECK(config.source == convention.source);
    CHECK(config.rank == 2);
    CHECK(config.world_size == 4);
    CHECK(config.local_rank == 1);
    CHECK_FALSE(config.serve_store);
  }
}

TEST_CASE("bootstrap: PMI_LOCAL_RANK is read when MPI_LOCALRANKID is not set", "[bootstrap]") {
  CleanEnv env;
  set("PMI_RANK", "3");
  set("PMI_SIZE", "8");
  set("PMI_LOCAL_RANK", "3");
  CHECK(resolve_bootstrap({}).local_rank == 3);
  set("MPI_LOCALRANKID", "1");
  CHECK(resolve_bootstrap({}).local_rank == 1);
}

TEST_CASE("bootstrap: the first convention that sets rank and world size wins", "[bootstrap]") {
  CleanEnv env;
  // Every convention set at once, each with its own values; removing the
  // winner each round hands over to the next one in order.
  for (std::size_t i = 0; i < kConventions.size(); ++i) {
    set(kConventions[i].rank, std::to_string(i));
    set(kConventions[i].world, std::to_string(10 + i));
    set(kConventions[i].local, std::to_string(i));
  }
  for (std::size_t i = 0; i < kConventions.size(); ++i) {
    INFO(kConventions[i].source);
    BootstrapConfig config = resolve_bootstrap({});
    CHECK(config.source == kConventions[i].source);
    CHECK(config.rank == static_cast<int>(i));
    CHECK(config.world_size == static_cast<int>(10 + i));
    CHECK(config.local_rank == static_cast<int>(i));
    ::unsetenv(kConventions[i].rank);
    ::unsetenv(kConventions[i].world);
    ::unsetenv(kConventions[i].local);
  }
  CHECK(resolve_bootstrap({}).source == "default");
}

TEST_CASE("bootstrap: explicit arguments beat the environment", "[bootstrap]") {
  CleanEnv env;
  set("CONCORD_RANK", "1");
  set("CONCORD_WORLD_SIZE", "2");
  set("RANK", "3");
  set("WORLD_SIZE", "4");

  BootstrapArgs args;
  args.rank = 2;
  args.world_size = 3;
  BootstrapConfig config = resolve_bootstrap(args);
  CHECK(config.source == "explicit");
  CHECK(config.rank == 2);
  CHECK(config.world_size == 3);

  BootstrapArgs rank_only;
  rank_only.rank = 0;
  config = resolve_bootstrap(rank_only);
  CHECK(config.rank == 0);
  CHECK(config.world_size == 2);
  CHECK(config.source == "concord");
}

TEST_CASE("bootstrap: local rank falls back to any convention, then 0", "[bootstrap]") {
  CleanEnv env;
  BootstrapArgs args;
  args.rank = 1;
  args.world_size = 4;
  CHECK(resolve_bootstrap(args).local_rank == 0);
  set("LOCAL_RANK", "3");
  CHECK(resolve_bootstrap(args).local_rank == 3);
  set("CONCORD_LOCAL_RANK", "2");
  CHECK(resolve_bootstrap(args).local_rank == 2);
}

TEST_CASE("bootstrap: master address and port", "[bootstrap]") {
  CleanEnv env;
  set("MASTER_ADDR", "10.0.0.2");
  set("MASTER_PORT", "1234");
  BootstrapConfig config = resolve_bootstrap({});
  CHECK(config.master_addr == "10.0.0.2");
  CHECK(config.master_port == 1234);

  set("CONCORD_MASTER_ADDR", "10.0.0.3");
  set("CONCORD_MASTER_PORT", "2345");
  config = resolve_bootstrap({});
  CHECK(config.master_addr == "10.0.0.3");
  CHECK(config.master_port == 2345);

  BootstrapArgs args;
  args.master_addr = "node7";
  args.master_port = 3456;
  config = resolve_bootstrap(args);
  CHECK(config.master_addr == "node7");
  CHECK(config.master_port == 3456);
}

TEST_CASE("bootstrap: job token", "[bootstrap]") {
  CleanEnv env;
  CHECK(resolve_bootstrap({}).token.empty());
  set("CONCORD_JOB_TOKEN", "from-env");
  CHECK(resolve_bootstrap({}).token == "from-env");
  BootstrapArgs args;
  args.token = "explicit";
  CHECK(resolve_bootstrap(args).token == "explicit");
}

TEST_CASE("bootstrap: who serves the store", "[bootstrap]") {
  CleanEnv env;
  set("RANK", "0");
  set("WORLD_SIZE", "2");
  CHECK(resolve_bootstrap({}).serve_store);
  set("CONCORD_STORE_SERVER", "rank0");
  CHECK(resolve_bootstrap({}).serve_store);
  set("CONCORD_STORE_SERVER", "launcher");
  CHECK_FALSE(resolve_bootstrap({}).serve_store);
  set("RANK", "1");
  set("CONCORD_STORE_SERVER", "rank0");
  CHECK_FALSE(resolve_bootstrap({}).serve_store);
  set("CONCORD_STORE_SERVER", "rank1");
  CHECK(error_message() == "CONCORD_STORE_SERVER='rank1' must be 'rank0' or 'launcher'");
}

TEST_CASE("bootstrap: out-of-range values are refused", "[bootstrap]") {
  CleanEnv env;
  BootstrapArgs args;
  args.rank = 5;
  args.world_size = 4;
  CHECK(error_message(args) == "rank 5 outside [0, 4)");
  args.rank = -1;
  CHECK(error_message(args) == "rank -1 outside [0, 4)");
  args.rank = 0;
  args.world_size = 0;
  CHECK(error_message(args) == "world size must be >= 1, got 0");
  args.world_size = 4;
  args.master_port = 70000;
  CHECK(error_message(args) == "master port 70000 outside 1..65535");
  args.master_port = 0;
  CHECK(error_message(args) == "master port 0 outside 1..65535");
  args.master_port.reset();
  args.master_addr = "";
  CHECK(error_message(args) == "master address must not be empty");

  CleanEnv fresh;
  set("RANK", "5");
  set("WORLD_SIZE", "4");
  CHECK(error_message() == "rank 5 outside [0, 4) (from the torchrun environment)");
  set("RANK", "1");
  set("LOCAL_RANK", "4");
  CHECK(error_message() == "local rank 4 outside [0, 4)");
  set("LOCAL_RANK", "0");
  set("MASTER_PORT", "70000");
  CHECK(error_message() == "master port 70000 outside 1..65535");
}

TEST_CASE("bootstrap: malformed or half-set variables are refused", "[bootstrap]") {
  CleanEnv env;
  set("RANK", "abc");
  set("WORLD_SIZE", "2");
  CHECK(error_message() == "environment variable RANK='abc' is not an integer");
  set("RANK", "99999999999");
  CHECK(error_message() == "environment variable RANK=99999999999 is out of range");
  ::unsetenv("RANK");
  CHECK(error_message() == "environment variable WORLD_SIZE is set but RANK is not");
  ::unsetenv("WORLD_SIZE");
  set("SLURM_PROCID", "1");
  CHECK(error_message() == "environment variable SLURM_PROCID is set but SLURM_NTASKS is not");
}

TEST_CASE("bootstrap: explicit rank and world size win over a launcher's local rank",
          "[bootstrap]") {
  // LOCAL_RANK=3 beside cc.init(rank=0, world_size=1) used to fail.
  CleanEnv env;
  set("LOCAL_RANK", "3");
  BootstrapArgs args;
  args.rank = 0;
  args.world_size = 1;
  BootstrapConfig config = resolve_bootstrap(args);
  CHECK(config.local_rank == 0);
  CHECK(config.world_size == 1);
  // From the launcher that also gave rank and world size, it is an error.
  set("RANK", "0");
  set("WORLD_SIZE", "2");
  CHECK(error_message() == "local rank 3 outside [0, 2)");
}

TEST_CASE("bootstrap: under torchrun, MASTER_PORT is torchrun's own", "[bootstrap]") {
  CleanEnv env;
  set("RANK", "1");
  set("WORLD_SIZE", "2");
  set("MASTER_PORT", "29511");
  CHECK(resolve_bootstrap({}).port_given);
  CHECK(resolve_bootstrap({}).master_port == 29511);
  set("TORCHELASTIC_RUN_ID", "job-7");
  CHECK_FALSE(resolve_bootstrap({}).port_given);
  set("CONCORD_MASTER_PORT", "29600");
  CHECK(resolve_bootstrap({}).port_given);
  CHECK(resolve_bootstrap({}).master_port == 29600);
  ::unsetenv("CONCORD_MASTER_PORT");
  BootstrapArgs args;
  args.master_port = 29700;
  CHECK(resolve_bootstrap(args).port_given);
}

TEST_CASE("bootstrap: launchers that say every rank is on this host", "[bootstrap]") {
  const std::vector<std::pair<const char*, const char*>> says_so{
      {"LOCAL_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}, {"MPI_LOCALNRANKS", "4"},
      {"SLURM_STEP_NUM_NODES", "1"}, {"SLURM_JOB_NUM_NODES", "1"}};
  for (const auto& [name, value] : says_so) {
    CleanEnv env;
    INFO(name);
    set("RANK", "2");
    set("WORLD_SIZE", "4");
    CHECK_FALSE(resolve_bootstrap({}).one_host);
    set(name, value);
    CHECK(resolve_bootstrap({}).one_host);
    set(name, std::string(value) == "1" ? "2" : "2");  // two hosts' worth
    CHECK_FALSE(resolve_bootstrap({}).one_host);
  }
}
