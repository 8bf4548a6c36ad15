// The gloo backend (TCP between ranks, wherever they are), ranks as
// threads: forced on one host, and chosen by "auto" for ranks on hosts of
// one rank each (host identities given to each thread).
#include <catch2/catch.hpp>

#include <limits>

#include "collective_checks.hpp"
#include "collective_suite.hpp"
#include "comm/backends.hpp"
#include "env_guard.hpp"
#include "spawn_ranks.hpp"
#include "status_helpers.hpp"

using namespace concord;
using namespace concord::testing;

namespace {

RankLayout gloo_on_one_host(int nranks) {
  return {BackendChoice::kGloo, std::vector<std::string>(nranks, "one-host"), "gloo"};
}

RankLayout one_rank_a_host(int nhosts) {
  return {BackendChoice::kAuto, hosts_of_sizes(std::vector<int>(nhosts, 1)), "gloo"};
}

// A 16-bit float's bits as an integer that orders like the value, so that
// neighbours differ by one (-0 and +0 are both 0).
int ordered(std::uint16_t bits) {
  return bits & 0x8000 ? -static_cast<int>(bits & 0x7FFF) : static_cast<int>(bits);
}

// Each rank's all_reduce result of `inputs` on a communicator of `choice`.
std::vector<HostTensor> all_reduced(BackendChoice choice, const std::vector<HostTensor>& inputs,
                                ReduceOp op) {
  const int nranks = static_cast<int>(inputs.size());
  std::vector<HostTensor> results(nranks, HostTensor::flat(inputs[0].dtype, 0));
  spawn_ranks(nranks, [&](Communicator& comm) {
    HostTensor mine = inputs[comm.rank()];
    comm.all_reduce(mine.view(), mine.view(), op, false);
    results[comm.rank()] = std::move(mine);
  }, 30.0, choice);
  return results;
}

// How setting up a gloo communicator of 2 ranks ends with `variable` set.
Status setup_with(const char* variable, const char* value) {
  EnvGuard env;
  env.set(variable, value);
  return status_of([] { spawn_ranks(2, [](Communicator&) {}, 10.0, BackendChoice::kGloo); });
}

}  // namespace

TEST_CASE("gloo serves CPU tensors across hosts and forced on one host", "[gloo][backend_choice]") {
  REQUIRE(gloo_built());
  const std::vector<std::pair<RankLayout, const char*>> layouts = {
      {gloo_on_one_host(2), "gloo"},
      {one_rank_a_host(3), "gloo"},
      {{BackendChoice::kAuto, hosts_of_sizes({2, 1}), ""}, "shm+gloo"},
      {{BackendChoice::kAuto, hosts_of_sizes({3}), ""}, "shm"},
  };
  for (const auto& [layout, expected] : layouts) {
    std::vector<std::string> names(layout.nranks());
    spawn_ranks(layout.nranks(), [&](Communicator& comm) {
      names[comm.rank()] = comm.backend_name();
      CHECK(comm.backend_choice() == layout.choice);
    }, 30.0, layout.choice, layout.hosts);
    for (const auto& name : names) CHECK(name == expected);
  }
  // Refused before any communication, on every rank: the first one's error.
  const Status shm = status_of([] {
    spawn_ranks(2, [](Communicator&) {}, 10.0, BackendChoice::kShm, hosts_of_sizes({1, 1}));
  });
  CHECK(shm.code == StatusCode::kUnavailable);
  CHECK(contains(shm.message, "backend 'shm' needs every rank on one host"));
}

TEST_CASE("gloo all_reduce matches the references for every dtype and op", "[gloo]") {
  for (const RankLayout& layout : {gloo_on_one_host(2), gloo_on_one_host(3), gloo_on_one_host(4)})
    check_all_reduce(layout, {0, 1, 7, 1000, 70001});
}

TEST_CASE("gloo all_reduce of a million elements", "[gloo]") {
  for (const RankLayout& layout : {gloo_on_one_host(2), gloo_on_one_host(3), gloo_on_one_host(4)})
    check_all_reduce(layout, {1000003},
                     {{DType::kFloat32, ReduceOp::kSum}, {DType::kBFloat16, ReduceOp::kMean}});
}

TEST_CASE("gloo forced on a rank alone: messages past the one-step size stay in its buffers",
          "[gloo]") {
  // A rank alone takes one step at any size; its payload once overran the
  // exchange's message buffer.
  check_all_reduce(gloo_on_one_host(1), {70001, 1000003},
                   {{DType::kFloat32, ReduceOp::kSum}, {DType::kBFloat16, ReduceOp::kMean}});
  check_gather_broadcast_scatter(gloo_on_one_host(1), {30011, 1000003});
}

TEST_CASE("gloo all_gather broadcast and reduce_scatter match the references", "[gloo]") {
  for (const RankLayout& layout : {gloo_on_one_host(2), gloo_on_one_host(3), one_rank_a_host(4)})
    check_gather_broadcast_scatter(layout, {0, 7, 30011});
}

TEST_CASE("gloo asynchronous collectives keep their order and all_reduce_multi reduces mixed dtypes", "[gloo]") {
  check_async_and_multi(gloo_on_one_host(3));
  check_async_and_multi(one_rank_a_host(2));
}

TEST_CASE("gloo float16 and bfloat16 results are within one rounding of shm's", "[gloo]") {
  // Small messages reduce as shm does (every rank's values in rank order,
  // accumulated in float32): bitwise the same. Large ones sum float32
  // partial results in ring order and round once.
  for (DType dtype : {DType::kFloat16, DType::kBFloat16})
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kProd})
      for (std::size_t n : {std::size_t{1000}, std::size_t{70001}}) {
        INFO(dtype_name(dtype) << " " << reduce_op_name(op) << " n=" << n);
        std::vector<HostTensor> inputs;
        for (int q = 0; q < 3; ++q) inputs.push_back(random_buffer(dtype, n, seed_of(q, 900 + int(op))));
        const auto shm = all_reduced(BackendChoice::kShm, inputs, op);
        const auto gloo = all_reduced(BackendChoice::kGloo, inputs, op);
        int worst = 0;
        for (std::size_t i = 0; i < n; ++i) {
          std::uint16_t a, b;
          std::memcpy(&a, shm[0].bytes.data() + 2 * i, 2);
          std::memcpy(&b, gloo[0].bytes.data() + 2 * i, 2);
          worst = std::max(worst, std::abs(ordered(a) - ordered(b)));
        }
        CHECK(worst <= (n <= 1000 ? 0 : 1));
      }
}

TEST_CASE("gloo integer means are exact as shm's: sums that overflow the dtype do not wrap",
          "[gloo]") {
  struct Case {
    DType dtype;
    double low;  // every rank's values lie in [low, low + 20]
  };
  for (const Case& c : {Case{DType::kInt8, 100}, Case{DType::kUInt8, 230}, Case{DType::kInt32, 2.1e9},
                        Case{DType::kInt8, -120}})
    for (std::size_t n : {std::size_t{5}, std::size_t{70001}}) {
      INFO(dtype_name(c.dtype) << " from " << c.low << " n=" << n);
      std::vector<HostTensor> inputs;
      for (int q = 0; q < 4; ++q) {
        HostTensor b = HostTensor::flat(c.dtype, n);
        for (std::size_t i = 0; i < n; ++i) b.set(i, c.low + double((i * 7 + q * 5) % 21));
        inputs.push_back(std::move(b));
      }
      const auto gloo = all_reduced(BackendChoice::kGloo, inputs, ReduceOp::kMean);
      const auto shm = all_reduced(BackendChoice::kShm, inputs, ReduceOp::kMean);
      CHECK(compare_reduced(gloo[0], 0, ReduceOp::kMean, inputs, 0) == "");
      CHECK(gloo[3].bytes == shm[3].bytes);
    }
}

TEST_CASE("gloo split forms sub-communicators across hosts", "[gloo]") {
  const int nranks = 4;
  std::vector<std::vector<int>> seen(nranks);
  std::vector<std::string> names(nranks);
  spawn_ranks(nranks, [&](Communicator& comm) {
    // Every rank on a host of its own; each color spans two hosts.
    auto sub = comm.split(comm.rank() % 2, -comm.rank());
    names[comm.rank()] = sub->backend_name();
    std::int32_t mine = comm.rank(), gathered[2] = {-1, -1};
    sub->all_gather(TensorView::flat(&mine, 1, DType::kInt32), TensorView::flat(gathered, 2, DType::kInt32),
                    false);
    double x = 1;
    sub->all_reduce(TensorView::flat(&x, 1, DType::kFloat64), TensorView::flat(&x, 1, DType::kFloat64),
                    ReduceOp::kSum, false);
    seen[comm.rank()] = {sub->rank(), sub->size(), gathered[0], gathered[1], int(x)};
  }, 30.0, BackendChoice::kAuto, hosts_of_sizes({1, 1, 1, 1}));
  CHECK(seen[0] == std::vector<int>{1, 2, 2, 0, 2});
  CHECK(seen[1] == std::vector<int>{1, 2, 3, 1, 2});
  CHECK(seen[2] == std::vector<int>{0, 2, 2, 0, 2});
  CHECK(seen[3] == std::vector<int>{0, 2, 3, 1, 2});
  for (const auto& name : names) CHECK(name == "gloo");
}

TEST_CASE("gloo ranks that disagree all get Mismatch", "[gloo][errors]") {
  check_mismatches(gloo_on_one_host(2));
  check_mismatches(gloo_on_one_host(3));
}

TEST_CASE("gloo: a rank that never calls times out every other rank and is named", "[gloo][errors]") {
  check_silent_rank(gloo_on_one_host(3), 2);
  check_silent_rank(one_rank_a_host(3), 0);
}

TEST_CASE("gloo: abort makes the peers fail fast", "[gloo][errors]") {
  check_abort(gloo_on_one_host(2), 0);
  check_abort(one_rank_a_host(3), 1);
}

TEST_CASE("gloo: a rank that leaves makes every waiting rank fail fast with Remote",
          "[gloo][errors]") {
  check_leaving_rank(gloo_on_one_host(3), 2);
}

TEST_CASE("gloo: an interrupt ends a blocked collective at once and its peers learn",
          "[gloo][errors]") {
  check_interrupt(gloo_on_one_host(2));
}

TEST_CASE("gloo: an infinite timeout means no limit", "[gloo][errors]") {
  spawn_ranks(2, [](Communicator& comm) {
    float x[3] = {1, 2, 3};
    comm.all_reduce(TensorView::flat(x, 3, DType::kFloat32), TensorView::flat(x, 3, DType::kFloat32),
                    ReduceOp::kSum, false);
    CHECK(x[2] == 6.0f);
  }, std::numeric_limits<double>::infinity(), BackendChoice::kGloo);
}

TEST_CASE("gloo: a set-up that cannot listen fails on every rank", "[gloo][errors]") {
  const Status status = setup_with("CONCORD_GLOO_IFACE", "no-such-interface0");
  INFO(status.message);
  CHECK(status.code == StatusCode::kUnavailable);
  CHECK(contains(status.message, "no-such-interface0"));
}

TEST_CASE("gloo's ring and direct algorithms both match the references", "[gloo]") {
  // Communicators of up to kMostDirectRanks ranks go direct unless told.
  EnvGuard env;
  for (const char* algorithm : {"ring", "direct"}) {
    INFO(algorithm);
    env.set("CONCORD_GLOO_ALGORITHM", algorithm);
    check_all_reduce(gloo_on_one_host(3), {70001},
                     {{DType::kFloat32, ReduceOp::kSum}, {DType::kBFloat16, ReduceOp::kMean},
                      {DType::kInt8, ReduceOp::kMean}, {DType::kInt32, ReduceOp::kMax}});
    check_gather_broadcast_scatter(gloo_on_one_host(3), {30011});
  }
}

TEST_CASE("gloo: an unknown CONCORD_GLOO_ALGORITHM fails on every rank before connecting",
          "[gloo][errors]") {
  const Status status = setup_with("CONCORD_GLOO_ALGORITHM", "tree");
  INFO(status.message);
  CHECK(status.code == StatusCode::kInvalidArgument);
  CHECK(contains(status.message, "CONCORD_GLOO_ALGORITHM='tree' must be 'direct' or 'ring'"));
}
