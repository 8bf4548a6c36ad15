// The C ABI as a C caller sees it: statuses, thread-local messages, NULL
// handling, DLTensor validation and collectives with ranks as threads.
#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "concord/concord.h"

#include "cabi_ranks.hpp"

using concord::testing::with_cabi_ranks;

namespace {

DLTensor float_tensor(float* data, std::int64_t* shape, int ndim = 1, std::int64_t* strides = nullptr) {
  DLTensor t{};
  t.data = data;
  t.device = {kDLCPU, 0};
  t.ndim = ndim;
  t.dtype = {kDLFloat, 32, 1};
  t.shape = shape;
  t.strides = strides;
  return t;
}


}  // namespace

TEST_CASE("versions agree between header and library", "[cabi]") {
  CHECK(concord_version_code() == CONCORD_VERSION_CODE);
  const std::string expected = std::to_string(CONCORD_VERSION_MAJOR) + "." +
                               std::to_string(CONCORD_VERSION_MINOR) + "." +
                               std::to_string(CONCORD_VERSION_PATCH);
  CHECK(std::string(concord_version()) == expected);
  const std::string info = concord_build_info();
  CHECK(info.find("\"version\": \"" + expected + "\"") != std::string::npos);
  CHECK(info.find("\"shm\": true") != std::string::npos);
}

TEST_CASE("every status has static text and destroy accepts NULL", "[cabi]") {
  for (int s = CONCORD_OK; s <= CONCORD_ERR_INTERNAL; ++s)
    CHECK(std::string(concord_status_string(static_cast<concord_status>(s))) != "unknown status");
  CHECK(concord_comm_destroy(nullptr) == CONCORD_OK);
  CHECK(concord_work_destroy(nullptr) == CONCORD_OK);
  CHECK(concord_store_destroy(nullptr) == CONCORD_OK);
  CHECK(concord_store_server_destroy(nullptr) == CONCORD_OK);
}

TEST_CASE("errors carry a thread-local message", "[cabi]") {
  int rank = 0;
  CHECK(concord_comm_rank(nullptr, &rank) == CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(std::string(concord_last_error()) == "comm is NULL");
  std::string other_thread;
  std::thread([&] { other_thread = concord_last_error(); }).join();
  CHECK(other_thread.empty());
}

TEST_CASE("a world of one needs no launcher", "[cabi]") {
  concord_comm_options options = CONCORD_COMM_OPTIONS_INIT;
  options.rank = 0;
  options.world_size = 1;
  concord_comm_t comm = nullptr;
  REQUIRE(concord_comm_init(&options, &comm) == CONCORD_OK);
  int size = 0;
  CHECK(concord_comm_size(comm, &size) == CONCORD_OK);
  CHECK(size == 1);
  const char* backend = nullptr;
  CHECK(concord_comm_backend(comm, &backend) == CONCORD_OK);
  CHECK(std::string(backend) == "shm");
  float data[3] = {1, 2, 3};
  std::int64_t shape[1] = {3};
  DLTensor t = float_tensor(data, shape);
  CHECK(concord_comm_all_reduce(comm, &t, &t, CONCORD_MEAN, nullptr, nullptr) == CONCORD_OK);
  CHECK(data[2] == 3.0f);
  CHECK(concord_comm_destroy(comm) == CONCORD_OK);
}

TEST_CASE("rank and world size of -1 come from the environment; other negatives are refused",
          "[cabi][errors]") {
  concord_comm_options options = CONCORD_COMM_OPTIONS_INIT;
  options.world_size = 1;
  concord_comm_t comm = nullptr;
  options.rank = -3;  // used to be ignored, as if unset
  CHECK(concord_comm_init(&options, &comm) == CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(std::string(concord_last_error()) == "rank -3 outside [0, 1)");
  options.rank = 0;
  options.world_size = -2;
  CHECK(concord_comm_init(&options, &comm) == CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(std::string(concord_last_error()) == "world size must be >= 1, got -2");
  CHECK(comm == nullptr);
}

TEST_CASE("the backend option is honoured", "[cabi][backend_choice]") {
  concord_comm_options options = CONCORD_COMM_OPTIONS_INIT;
  options.rank = 0;
  options.world_size = 1;
  concord_comm_t comm = nullptr;
  options.backend = "shm";
  REQUIRE(concord_comm_init(&options, &comm) == CONCORD_OK);
  const char* backend = nullptr;
  CHECK(concord_comm_backend(comm, &backend) == CONCORD_OK);
  CHECK(std::string(backend) == "shm");
  CHECK(concord_comm_destroy(comm) == CONCORD_OK);

  options.backend = "mpi";
  CHECK(concord_comm_init(&options, &comm) == CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(std::string(concord_last_error()) ==
        "unknown backend 'mpi'; choose 'auto', 'shm', 'gloo' or 'nccl'");
  CHECK(comm == nullptr);
  // The C caller learns from build_info whether this build has gloo.
  options.backend = "gloo";
  if (std::string(concord_build_info()).find("\"gloo\": true") != std::string::npos) {
    REQUIRE(concord_comm_init(&options, &comm) == CONCORD_OK);
    CHECK(concord_comm_backend(comm, &backend) == CONCORD_OK);
    CHECK(std::string(backend) == "gloo");
    CHECK(concord_comm_destroy(comm) == CONCORD_OK);
  } else {
    CHECK(concord_comm_init(&options, &comm) == CONCORD_ERR_UNAVAILABLE);
    CHECK(comm == nullptr);
  }
}

TEST_CASE("collectives through the C ABI, blocking and asynchronous", "[cabi]") {
  const int nranks = 3;
  std::vector<std::string> failures(nranks);
  with_cabi_ranks(nranks, [&](int rank, concord_comm_t comm) {
    auto note = [&](const std::string& what) { if (failures[rank].empty()) failures[rank] = what; };
    std::vector<float> x(1001);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(rank + 1) * float(i);
    std::int64_t shape[1] = {1001};
    DLTensor t = float_tensor(x.data(), shape);
    concord_work_t work = nullptr;
    if (concord_comm_all_reduce(comm, &t, &t, CONCORD_SUM, nullptr, &work) != CONCORD_OK) note(concord_last_error());
    if (concord_work_wait(work, -1.0) != CONCORD_OK) note(concord_last_error());
    int done = 0;
    if (concord_work_test(work, &done) != CONCORD_OK || done != 1) note("work_test after wait");
    concord_work_destroy(work);
    for (std::size_t i = 0; i < x.size(); ++i)
      if (x[i] != 6.0f * float(i)) { note("all_reduce value " + std::to_string(i)); break; }

    float mine = float(rank), all[nranks] = {};
    std::int64_t one[1] = {1}, three[1] = {nranks};
    DLTensor s = float_tensor(&mine, one), g = float_tensor(all, three);
    if (concord_comm_all_gather(comm, &s, &g, nullptr, nullptr) != CONCORD_OK) note(concord_last_error());
    for (int q = 0; q < nranks; ++q) if (all[q] != float(q)) note("all_gather");

    float value = rank == 2 ? 42.0f : 0.0f;
    DLTensor b = float_tensor(&value, one);
    if (concord_comm_broadcast(comm, rank == 2 ? &b : nullptr, &b, 2, nullptr, nullptr) != CONCORD_OK) note(concord_last_error());
    if (value != 42.0f) note("broadcast");

    if (concord_comm_barrier(comm, nullptr) != CONCORD_OK) note(concord_last_error());
  });
  for (auto& f : failures) CHECK(f == "");
}

TEST_CASE("bad tensors and ops are rejected with specific messages", "[cabi][errors]") {
  with_cabi_ranks(1, [](int, concord_comm_t comm) {
    float data[6] = {};
    std::int64_t shape[2] = {2, 3}, strides[2] = {1, 2};  // column-major
    DLTensor t = float_tensor(data, shape, 2, strides);
    CHECK(concord_comm_all_reduce(comm, &t, &t, CONCORD_SUM, nullptr, nullptr) == CONCORD_ERR_INVALID_ARGUMENT);
    CHECK(std::string(concord_last_error()).find("not contiguous") != std::string::npos);
    // Both bad (an in-place call on a transposed array): the first argument
    // is named, not one the caller may never have written (it was "recv").
    for (auto call : {+[](concord_comm_t c, DLTensor* x) { return concord_comm_all_reduce(c, x, x, CONCORD_SUM, nullptr, nullptr); },
                      +[](concord_comm_t c, DLTensor* x) { return concord_comm_reduce_scatter(c, x, x, CONCORD_SUM, nullptr, nullptr); },
                      +[](concord_comm_t c, DLTensor* x) { return concord_comm_all_gather(c, x, x, nullptr, nullptr); },
                      +[](concord_comm_t c, DLTensor* x) { return concord_comm_broadcast(c, x, x, 0, nullptr, nullptr); }}) {
      CHECK(call(comm, &t) == CONCORD_ERR_INVALID_ARGUMENT);
      CHECK(std::string(concord_last_error()).rfind("send tensor is not contiguous", 0) == 0);
    }

    DLTensor ok = float_tensor(data, shape, 2);
    CHECK(concord_comm_all_reduce(comm, &ok, &ok, static_cast<concord_reduce_op>(17), nullptr, nullptr) ==
          CONCORD_ERR_INVALID_ARGUMENT);
    CHECK(std::string(concord_last_error()).find("unknown reduction op 17") != std::string::npos);

    DLTensor complex = ok;
    complex.dtype = {5, 64, 1};
    CHECK(concord_comm_all_reduce(comm, &complex, &complex, CONCORD_SUM, nullptr, nullptr) ==
          CONCORD_ERR_INVALID_ARGUMENT);
    CHECK(std::string(concord_last_error()).find("unsupported dtype") != std::string::npos);

    CHECK(concord_comm_all_reduce(comm, nullptr, &ok, CONCORD_SUM, nullptr, nullptr) == CONCORD_ERR_INVALID_ARGUMENT);
    CHECK(std::string(concord_last_error()) == "send tensor is NULL");
  });
}

TEST_CASE("split through the C ABI", "[cabi]") {
  std::vector<int> sizes(4, -1);
  with_cabi_ranks(4, [&](int rank, concord_comm_t comm) {
    concord_comm_t sub = nullptr;
    if (concord_comm_split(comm, rank == 3 ? -1 : 0, rank, &sub) != CONCORD_OK) return;
    if (sub == nullptr) { sizes[rank] = 0; return; }
    concord_comm_size(sub, &sizes[rank]);
    concord_comm_destroy(sub);
  });
  CHECK(sizes == std::vector<int>{3, 3, 3, 0});
}

TEST_CASE("option structs from an older, shorter header are filled from the defaults", "[cabi]") {
  // A caller built before `backend` and `timeout_s` existed: its struct ends
  // at `token`. The library reads what it was given and defaults the rest.
  concord_comm_options older = CONCORD_COMM_OPTIONS_INIT;
  older.struct_size = offsetof(concord_comm_options, timeout_s);
  older.rank = 0;
  older.world_size = 1;
  older.timeout_s = -123.0;          // beyond struct_size: must not be read
  older.backend = "not a backend";   // likewise
  concord_comm_t comm = nullptr;
  REQUIRE(concord_comm_init(&older, &comm) == CONCORD_OK);
  double timeout = 0;
  CHECK(concord_comm_timeout(comm, &timeout) == CONCORD_OK);
  CHECK(timeout > 0);
  const char* backend = nullptr;
  CHECK(concord_comm_backend(comm, &backend) == CONCORD_OK);
  CHECK(std::string(backend) == "shm");
  CHECK(concord_comm_destroy(comm) == CONCORD_OK);

  // Only struct_size: every field is a default.
  concord_metric_options bare = CONCORD_METRIC_OPTIONS_INIT;
  bare.struct_size = sizeof(size_t);
  bare.k = 99;  // beyond struct_size
  double state_values[2] = {0, 0};
  float values[3] = {1, 2, 3};
  std::int64_t state_shape[1] = {2}, value_shape[1] = {3};
  DLTensor state{}, v = float_tensor(values, value_shape);
  state.data = state_values;
  state.device = {kDLCPU, 0};
  state.ndim = 1;
  state.dtype = {kDLFloat, 64, 1};
  state.shape = state_shape;
  const DLTensor* inputs[] = {&v};
  CHECK(concord_metric_update("weighted_sum", &state, inputs, 1, &bare, nullptr) == CONCORD_OK);
  CHECK(state_values[0] == 6.0);
  CHECK(state_values[1] == 3.0);

  // Larger than this library knows: refused.
  concord_metric_options newer = CONCORD_METRIC_OPTIONS_INIT;
  newer.struct_size = sizeof newer + 8;
  CHECK(concord_metric_update("weighted_sum", &state, inputs, 1, &newer, nullptr) ==
        CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(std::string(concord_last_error()).rfind("options->struct_size is ", 0) == 0);
}

TEST_CASE("metric kernels are found by name", "[cabi][metrics]") {
  double state_values[1] = {0};
  std::int64_t one[1] = {1};
  DLTensor state{};
  state.data = state_values;
  state.device = {kDLCPU, 0};
  state.ndim = 1;
  state.dtype = {kDLFloat, 64, 1};
  state.shape = one;
  float value = 4.0f;
  DLTensor v = float_tensor(&value, one);
  const DLTensor* inputs[] = {&v, &v, &v};
  CHECK(concord_metric_update("max", &state, inputs, 1, nullptr, nullptr) == CONCORD_OK);
  CHECK(state_values[0] == 4.0);
  CHECK(concord_metric_update("maximum", &state, inputs, 1, nullptr, nullptr) ==
        CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(std::string(concord_last_error()).find("unknown metric kernel 'maximum'") != std::string::npos);
  CHECK(concord_metric_update("max", &state, inputs, 3, nullptr, nullptr) ==
        CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(std::string(concord_last_error()) == "max: 3 inputs given, it takes at most 1");
  CHECK(concord_metric_update(nullptr, &state, inputs, 1, nullptr, nullptr) ==
        CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(std::string(concord_last_error()) == "kernel is NULL");
}
