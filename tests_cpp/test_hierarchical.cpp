// The shm+gloo backend, ranks as threads standing for ranks on several
// hosts (a host identity given to each thread): hosts of equal and of
// different sizes, messages below and above the size at which they are
// sharded across the ranks of each host.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "collective_checks.hpp"
#include "collective_suite.hpp"
#include "comm/hosts.hpp"
#include "rendezvous/store.hpp"
#include "env_guard.hpp"
#include "spawn_ranks.hpp"
#include "status_helpers.hpp"

using namespace concord;
using namespace concord::testing;

namespace {

RankLayout hosts_of(const std::vector<int>& ranks_per_host) {
  return {BackendChoice::kAuto, hosts_of_sizes(ranks_per_host), "shm+gloo"};
}

}  // namespace

TEST_CASE("a host identity is the host name and what decides who can share memory unless CONCORD_HOST_ID says",
          "[shm+gloo][hosts]") {
  EnvGuard env;
  env.unset("CONCORD_HOST_ID");
  char name[256] = {};
  REQUIRE(gethostname(name, sizeof name - 1) == 0);
  const std::string mine = host_identity();
  CHECK(mine.rfind(std::string(name) + "/", 0) == 0);
  CHECK(mine.size() == std::string(name).size() + 1 + 8);  // and 32 bits in hex
  CHECK(host_identity() == mine);
  env.set("CONCORD_HOST_ID", "rack3-node7");
  CHECK(host_identity() == "rack3-node7");
}

TEST_CASE("every rank learns every rank's host identity in rank order, whatever bytes it holds",
          "[shm+gloo][hosts]") {
  // Identities set through CONCORD_HOST_ID may hold separators, digits,
  // newlines or nothing; ranks 1 and 4 share a host.
  const std::vector<std::string> identities = {"node-a", "12:34", "", "line\nbreak", "12:34",
                                               std::string(300, 'x')};
  const int size = static_cast<int>(identities.size());
  StoreServer server("127.0.0.1", 0, "hosts-token");
  std::vector<std::vector<std::string>> seen(identities.size());
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < size; ++rank)
    ranks.emplace_back([&, rank] {
      StoreClient client("127.0.0.1", server.port(), "hosts-token", std::chrono::seconds(10));
      seen[rank] = exchange_hosts(client, "job#1", rank, size, 10.0, identities[rank]);
    });
  for (auto& rank : ranks) rank.join();
  for (const auto& hosts : seen) CHECK(hosts == identities);
  CHECK(local_rank_of(identities, 1) == 0);
  CHECK(local_rank_of(identities, 4) == 1);
  CHECK(local_rank_of(identities, 5) == 0);
}

TEST_CASE("shm+gloo all_reduce matches the references", "[shm+gloo]") {
  check_all_reduce(hosts_of({2, 2}), {0, 1, 7, 1000, 70001});
  // Uneven hosts: every dtype and every op, not every pair.
  check_all_reduce(hosts_of({2, 1}), {0, 7, 70001},
                   {{DType::kFloat16, ReduceOp::kSum}, {DType::kBFloat16, ReduceOp::kProd},
                    {DType::kFloat32, ReduceOp::kMean}, {DType::kFloat64, ReduceOp::kMin},
                    {DType::kInt8, ReduceOp::kMean}, {DType::kInt32, ReduceOp::kSum},
                    {DType::kInt64, ReduceOp::kProd}, {DType::kUInt8, ReduceOp::kMax},
                    {DType::kBool, ReduceOp::kMin}});
}

TEST_CASE("shm+gloo all_reduce of large messages sharded over the ranks of each host",
          "[shm+gloo]") {
  // 2 x 2: two shards of equal size (reduce-scatter, all-gather on each
  // host) and not (all-reduce, broadcasts); 3 + 2: two shards, one host
  // with a rank outside both; 1 + 3: one shard, carried by the leaders.
  for (const RankLayout& layout : {hosts_of({2, 2}), hosts_of({3, 2}), hosts_of({1, 3})}) {
    check_all_reduce(layout, {70000},
                     {{DType::kFloat32, ReduceOp::kSum}, {DType::kBFloat16, ReduceOp::kMean},
                      {DType::kInt8, ReduceOp::kMean}});
    check_all_reduce(layout, {1000003}, {{DType::kFloat32, ReduceOp::kSum}});
  }
  // 2 x 2, shards of several MiB (bfloat16 carried in float32).
  check_all_reduce(hosts_of({2, 2}), {2500002},
                   {{DType::kFloat32, ReduceOp::kSum}, {DType::kFloat64, ReduceOp::kMax}});
  check_all_reduce(hosts_of({2, 2}), {4194306},
                   {{DType::kBFloat16, ReduceOp::kMean}, {DType::kInt32, ReduceOp::kProd}});
}

TEST_CASE("shm+gloo: an abort while large all_reduces run fails every rank fast",
          "[shm+gloo][errors]") {
  // Rank 3 aborts from another thread while every rank, itself included,
  // runs 16 MiB all_reduces: whichever step each rank is in (on its host
  // or across hosts), it fails, and none hangs.
  constexpr int kAborting = 3;
  const auto start = std::chrono::steady_clock::now();
  std::vector<double> seconds(4);
  auto statuses = statuses_of(4, 30.0, [&](Communicator& comm) {
    std::vector<float> x(4u << 20, 1.0f);
    const TensorView v = TensorView::flat(x.data(), std::int64_t(x.size()), DType::kFloat32);
    comm.barrier(false);
    std::thread aborter;
    if (comm.rank() == kAborting)
      aborter = std::thread([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(150));
        comm.abort();
      });
    Status status;
    for (int i = 0; i < 1000 && status.ok(); ++i)
      status = status_of([&] { comm.all_reduce(v, v, ReduceOp::kSum, false); });
    seconds[comm.rank()] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (aborter.joinable()) aborter.join();
    throw Error(status.code, status.message);
  }, BackendChoice::kAuto, hosts_of({2, 2}).hosts);
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r << ": " << statuses[r].message);
    CHECK(seconds[r] < 5.0);  // as check_abort: the ranks start and abort within it
    CHECK(statuses[r].code == (r == kAborting ? StatusCode::kAborted : StatusCode::kRemote));
  }
}

TEST_CASE("shm+gloo all_gather broadcast and reduce_scatter match the references",
          "[shm+gloo]") {
  for (const RankLayout& layout : {hosts_of({2, 2}), hosts_of({2, 1}), hosts_of({3, 2})})
    check_gather_broadcast_scatter(layout, {0, 7, 30011});
}

TEST_CASE("shm+gloo asynchronous collectives keep their order and all_reduce_multi reduces mixed dtypes", "[shm+gloo]") {
  check_async_and_multi(hosts_of({2, 2}));
  check_async_and_multi(hosts_of({1, 2}));
}

TEST_CASE("shm+gloo split: sub-communicators within and across hosts", "[shm+gloo]") {
  const int nranks = 4;
  std::vector<std::vector<std::string>> names(nranks);
  std::vector<std::vector<double>> sums(nranks);
  spawn_ranks(nranks, [&](Communicator& comm) {
    // Ranks 0, 1 on host0 and 2, 3 on host1.
    auto across = comm.split(comm.rank() % 2, comm.rank());  // one rank a host
    auto uneven = comm.split(comm.rank() < 3 ? 0 : -1, 0);   // 2 + 1
    auto within = comm.split(comm.rank() / 2, 0);            // one host
    for (Communicator* sub : {across.get(), uneven.get(), within.get()}) {
      if (!sub) continue;
      names[comm.rank()].push_back(sub->backend_name());
      double x = comm.rank();
      sub->all_reduce(TensorView::flat(&x, 1, DType::kFloat64), TensorView::flat(&x, 1, DType::kFloat64),
                      ReduceOp::kSum, false);
      sums[comm.rank()].push_back(x);
    }
  }, 30.0, BackendChoice::kAuto, hosts_of_sizes({2, 2}));
  CHECK(names[0] == std::vector<std::string>{"gloo", "shm+gloo", "shm"});
  CHECK(names[1] == std::vector<std::string>{"gloo", "shm+gloo", "shm"});
  CHECK(names[2] == std::vector<std::string>{"gloo", "shm+gloo", "shm"});
  CHECK(names[3] == std::vector<std::string>{"gloo", "shm"});
  CHECK(sums[0] == std::vector<double>{2, 3, 1});
  CHECK(sums[1] == std::vector<double>{4, 3, 1});
  CHECK(sums[2] == std::vector<double>{2, 3, 5});
  CHECK(sums[3] == std::vector<double>{4, 5});
}

TEST_CASE("shm+gloo ranks that disagree all get Mismatch on every host", "[shm+gloo][errors]") {
  check_mismatches(hosts_of({2, 2}));
  check_mismatches(hosts_of({2, 1}));
}

TEST_CASE("shm+gloo: a rank that never calls times out every other rank and is named",
          "[shm+gloo][errors]") {
  check_silent_rank(hosts_of({2, 2}), 3);
  check_silent_rank(hosts_of({2, 1}), 1);
}

TEST_CASE("shm+gloo: abort makes the peers on every host fail fast", "[shm+gloo][errors]") {
  check_abort(hosts_of({2, 2}), 0);
  check_abort(hosts_of({2, 1}), 2);
}

TEST_CASE("shm+gloo: a rank that leaves makes every waiting rank fail fast with Remote",
          "[shm+gloo][errors]") {
  check_leaving_rank(hosts_of({2, 2}), 3);
}

TEST_CASE("shm+gloo: an interrupt ends a blocked collective at once and the peers on every host learn",
          "[shm+gloo][errors]") {
  check_interrupt(hosts_of({2, 1}));
}
