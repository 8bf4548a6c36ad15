// How ranks join a job (comm/world.hpp): the store is never served without
// a secret; ranks of one host that were given none meet through the job's
// file; torchrun's MASTER_PORT is left to torchrun.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "base/format.hpp"
#include "comm/world.hpp"
#include "rendezvous/job_file.hpp"
#include "rendezvous/store.hpp"
#include "env_guard.hpp"
#include "status_helpers.hpp"

using namespace concord;
using concord::testing::contains;
using concord::testing::EnvGuard;
using concord::testing::status_of;

namespace {

// Runs init_world on `nranks` threads with explicit rank and world size and
// no token; each rank all-reduces its rank. Returns each rank's status.
std::vector<Status> join_as_threads(int nranks, std::vector<double>* sums = nullptr) {
  std::vector<Status> statuses(nranks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < nranks; ++rank)
    threads.emplace_back([&, rank] {
      statuses[rank] = status_of([&] {
        WorldOptions options;
        options.bootstrap.rank = rank;
        options.bootstrap.world_size = nranks;
        options.timeout_s = 20.0;
        World world = init_world(options);
        double x = rank;
        world.comm->all_reduce(TensorView::flat(&x, 1, DType::kFloat64),
                               TensorView::flat(&x, 1, DType::kFloat64), ReduceOp::kSum, false);
        if (sums) (*sums)[rank] = x;
      });
    });
  for (auto& t : threads) t.join();
  return statuses;
}

}  // namespace

TEST_CASE("ranks of one host with no token meet through the job file", "[world]") {
  EnvGuard env;
  env.set("LOCAL_WORLD_SIZE", "3").unset("CONCORD_JOB_TOKEN");
  std::vector<double> sums(3);
  const auto statuses = join_as_threads(3, &sums);
  for (int rank = 0; rank < 3; ++rank) {
    INFO(statuses[rank].message);
    CHECK(statuses[rank].ok());
    CHECK(sums[rank] == 3.0);
  }
  // Rank 0 removed its file when its world ended.
  CHECK(::access(JobFile::of_this_job(3).path().c_str(), F_OK) != 0);
}

TEST_CASE("under torchrun the ranks leave MASTER_PORT to torchrun's own store", "[world]") {
  // torchrun's agent serves its store on MASTER_PORT; concord's rank 0 used
  // to try to bind it too and failed with "Address already in use".
  StoreServer agent_store("127.0.0.1", 0, "torchrun's");
  EnvGuard env;
  env.set("TORCHELASTIC_RUN_ID", "run-1")
      .set("MASTER_ADDR", "127.0.0.1")
      .set("MASTER_PORT", std::to_string(agent_store.port()))
      .set("LOCAL_WORLD_SIZE", "2")
      .unset("CONCORD_JOB_TOKEN");
  const auto statuses = join_as_threads(2);
  for (const Status& s : statuses) {
    INFO(s.message);
    CHECK(s.ok());
  }
}

TEST_CASE("ranks that may span hosts need a job token", "[world][errors]") {
  EnvGuard env;
  env.unset("LOCAL_WORLD_SIZE").unset("CONCORD_JOB_TOKEN");
  WorldOptions options;
  options.bootstrap.rank = 1;
  options.bootstrap.world_size = 2;
  options.bootstrap.master_port = 29999;
  const Status status = status_of([&] { init_world(options); });
  CHECK(status.code == StatusCode::kInvalidArgument);
  CHECK(status.message ==
        "rank 1 of 2: no job token is set and concord cannot tell that every rank runs on this "
        "host, where ranks meet without one: set CONCORD_JOB_TOKEN (the same secret on every "
        "rank) and CONCORD_MASTER_PORT (a free port on the master address), or launch with "
        "concord-run");
}

TEST_CASE("a job file from a launch whose rank 0 is gone is not read", "[world]") {
  EnvGuard env;
  env.set("CONCORD_RUNTIME_DIR", concat("/tmp/concord-test-", ::getpid()));
  JobFile file = JobFile::of_this_job(7);
  {
    // A pid that does not exist: the stale file of a crashed launch.
    std::FILE* out = std::fopen(file.path().c_str(), "w");
    REQUIRE(out != nullptr);
    std::fprintf(out, "%d 127.0.0.1 1234 stale\n", 0x3FFFFFFF);
    std::fclose(out);
  }
  const Status stale = status_of([&] { file.read(0.2); });
  CHECK(stale.code == StatusCode::kTimeout);
  file.publish({"127.0.0.1", 4321, "fresh"});
  const StoreEndpoint endpoint = file.read(1.0);
  CHECK(endpoint.port == 4321);
  CHECK(endpoint.token == "fresh");
  const std::string path = file.path();
  { JobFile gone = std::move(file); }
  CHECK(::access(path.c_str(), F_OK) != 0);
  ::rmdir(concat("/tmp/concord-test-", ::getpid()).c_str());
}
