// The backend choice of init(backend=...): honoured end to end, and an
// unknown or unusable backend is a clear error before any communication.
#include <catch2/catch.hpp>

#include <string>

#include "comm/backend_choice.hpp"
#include "comm/backends.hpp"
#include "comm/communicator.hpp"
#include "comm/world.hpp"
#include "plugin/cuda_plugin.hpp"
#include "spawn_ranks.hpp"
#include "status_helpers.hpp"

using namespace concord;
using concord::testing::contains;
using concord::testing::spawn_ranks;
using concord::testing::status_of;

namespace {

bool cuda_usable() {
  const plugin::Availability found = plugin::availability();
  return found.plugin_loaded && found.probe.device_count > 0 && found.probe.nccl_version > 0;
}

World world_of_one(BackendChoice backend) {
  WorldOptions options;
  options.bootstrap.rank = 0;
  options.bootstrap.world_size = 1;
  options.timeout_s = 30.0;
  options.backend = backend;
  return init_world(options);
}

}  // namespace

TEST_CASE("backend names map to choices and back", "[backend_choice]") {
  for (const char* name : {"auto", "shm", "gloo", "nccl"})
    CHECK(std::string(backend_choice_name(backend_choice_from_name(name))) == name);
  const Status unknown = status_of([] { backend_choice_from_name("mpi"); });
  CHECK(unknown.code == StatusCode::kInvalidArgument);
  CHECK(unknown.message == "unknown backend 'mpi'; choose 'auto', 'shm', 'gloo' or 'nccl'");
}

TEST_CASE("auto and shm give CPU tensors the shm backend", "[backend_choice]") {
  for (BackendChoice choice : {BackendChoice::kAuto, BackendChoice::kShm}) {
    World world = world_of_one(choice);
    CHECK(std::string(world.comm->backend_name()) == "shm");
    CHECK(world.comm->backend_choice() == choice);
    float x[3] = {1, 2, 3};
    world.comm->all_reduce(TensorView::flat(x, 3, DType::kFloat32),
                           TensorView::flat(x, 3, DType::kFloat32), ReduceOp::kSum, false);
    CHECK(x[2] == 3.0f);
  }
}

TEST_CASE("a backend that cannot serve this process fails init before communicating",
          "[backend_choice][errors]") {
  if (gloo_built()) {
    World world = world_of_one(BackendChoice::kGloo);
    CHECK(std::string(world.comm->backend_name()) == "gloo");
  } else {
    const Status gloo = status_of([] { world_of_one(BackendChoice::kGloo); });
    CHECK(gloo.code == StatusCode::kUnavailable);
    CHECK(gloo.message == "backend 'gloo' is not in this build");
  }
  if (cuda_usable()) return;  // a machine with a GPU can init nccl
  const Status nccl = status_of([] { world_of_one(BackendChoice::kNccl); });
  CHECK(nccl.code == StatusCode::kUnavailable);
  CHECK(contains(nccl.message, "backend 'nccl': "));
}

TEST_CASE("a CPU backend refuses CUDA tensors, an nccl one CPU tensors, naming the backend",
          "[backend_choice][errors]") {
  float x[4] = {};
  const TensorView on_cpu = TensorView::flat(x, 4, DType::kFloat32);
  const TensorView on_gpu = TensorView::flat(x, 4, DType::kFloat32, {DeviceKind::kCUDA, 0});
  spawn_ranks(2, [&](Communicator& comm) {
    const Status status = status_of(
        [&] { comm.all_reduce(on_gpu, on_gpu, ReduceOp::kSum, false); });
    CHECK(status.code == StatusCode::kInvalidArgument);
    CHECK(status.message ==
          "all_reduce: CUDA tensors on a communicator of backend 'shm', which takes CPU "
          "tensors; init with backend 'auto' or 'nccl' for them");
    comm.barrier(false);  // still usable
  }, 30.0, BackendChoice::kShm);
  // Made directly (init would refuse nccl on a machine without CUDA): the
  // host side exists only as the rendezvous, so CPU tensors are refused.
  spawn_ranks(2, [&](Communicator& comm) {
    CHECK(std::string(comm.backend_name()) == "nccl");
    const Status status = status_of([&] { comm.broadcast(on_cpu, on_cpu, 0, false); });
    CHECK(status.code == StatusCode::kInvalidArgument);
    CHECK(status.message ==
          "broadcast: CPU tensors on a communicator of backend 'nccl', which takes CUDA "
          "tensors; init with backend 'auto' or 'shm' for them");
    auto child = comm.split(0, comm.rank());
    CHECK(child->backend_choice() == BackendChoice::kNccl);
    CHECK(std::string(child->backend_name()) == "nccl");
  }, 30.0, BackendChoice::kNccl);
}

TEST_CASE("split keeps the backend choice", "[backend_choice]") {
  spawn_ranks(3, [](Communicator& comm) {
    auto child = comm.split(comm.rank() % 2, 0);
    CHECK(child->backend_choice() == BackendChoice::kShm);
    CHECK(std::string(child->backend_name()) == "shm");
    float x[1] = {1.0f};
    child->all_reduce(TensorView::flat(x, 1, DType::kFloat32),
                      TensorView::flat(x, 1, DType::kFloat32), ReduceOp::kSum, false);
    CHECK(x[0] == static_cast<float>(child->size()));
  }, 30.0, BackendChoice::kShm);
}
