// The CUDA plugin on a machine that may lack a GPU: it loads (when built),
// reports what it found, and CUDA tensors then fail with UnavailableError
// naming the reason, leaving the communicator usable for CPU tensors. The
// collectives themselves on a device are tested from Python on GPU machines
// (tests_py/test_gpu_*.py).
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "base/tensor_view.hpp"
#include "comm/backends.hpp"
#include "comm/communicator.hpp"
#include "concord/concord.h"
#include "plugin/cuda_plugin.hpp"
#include "plugin/metric_kernels.hpp"
#include "spawn_ranks.hpp"
#include "status_helpers.hpp"

using concord::Status;
using concord::StatusCode;
using concord::testing::contains;
using concord::testing::status_of;

namespace {

concord::TensorView cuda_view(std::int64_t numel) {
  concord::TensorView v;
  // Never dereferenced: the collective fails before touching the device.
  v.data = reinterpret_cast<void*>(std::uintptr_t{0x100000});
  v.numel = numel;
  v.dtype = concord::DType::kFloat32;
  v.device = {concord::DeviceKind::kCUDA, 0};
  return v;
}

concord::TensorView cpu_view(std::vector<float>& data) {
  concord::TensorView v;
  v.data = data.data();
  v.numel = static_cast<std::int64_t>(data.size());
  v.dtype = concord::DType::kFloat32;
  return v;
}

bool has_gpu() {
  const auto found = concord::plugin::availability();
  return found.plugin_loaded && found.probe.device_count > 0;
}

}  // namespace

TEST_CASE("build_info says whether the CUDA plugin was built and what it found", "[cuda]") {
  const std::string info = concord_build_info();
  const std::string built = concord::plugin::built() ? "true" : "false";
  CHECK(contains(info, "\"cuda\": {\"built\": " + built));
  CHECK(contains(info, "\"nccl\": {\"built\": " + built));
  const std::string gloo = concord::gloo_built() ? "true" : "false";
  CHECK(contains(info, "\"backends\": {\"shm\": true, \"gloo\": " + gloo + ", \"nccl\": " + built));
  const auto found = concord::plugin::availability();
  if (!concord::plugin::built()) {
    CHECK_FALSE(found.plugin_loaded);
    CHECK(contains(found.plugin_problem, "no CUDA support"));
    CHECK(contains(info, "\"available\": false"));
    return;
  }
  REQUIRE(found.plugin_loaded);
  CHECK(found.probe.cuda_runtime_version >= 12000);
  if (found.probe.device_count == 0) {
    CHECK(contains(info, "\"cuda\": {\"built\": true, \"available\": false"));
    CHECK(std::string(found.probe.cuda_problem).size() > 0);
  } else {
    CHECK(contains(info, "\"cuda\": {\"built\": true, \"available\": true"));
  }
  // NCCL is either found, with its version, or not, with what was tried.
  if (found.probe.nccl_version > 0) {
    CHECK(contains(info, "\"nccl\": {\"built\": true, \"available\": true, \"version\": \"2."));
    CHECK(std::string(found.probe.nccl_path).find("libnccl") != std::string::npos);
  } else {
    CHECK(contains(found.probe.nccl_problem, "libnccl.so.2"));
  }
}

TEST_CASE("CUDA tensors without a GPU fail as unavailable and the CPU keeps working",
          "[cuda][errors]") {
  if (has_gpu()) SUCCEED("this machine has a GPU; the GPU tests cover it");
  else {
    for (int nranks : {1, 2}) {
      concord::testing::spawn_ranks(nranks, [](concord::Communicator& comm) {
        const auto x = cuda_view(7);
        const Status status = status_of([&] { comm.all_reduce(x, x, concord::ReduceOp::kSum, false); });
        CHECK(status.code == StatusCode::kUnavailable);
        if (concord::plugin::built()) {
          // The plugin loaded; the driver or device is what is missing.
          CHECK(contains(status.message, "nccl: "));
        } else {
          CHECK(contains(status.message, "no CUDA support"));
        }
        // Unavailable does not break the communicator.
        std::vector<float> data(5, float(comm.rank() + 1));
        comm.all_reduce(cpu_view(data), cpu_view(data), concord::ReduceOp::kSum, false);
        const float expected = float(comm.size() * (comm.size() + 1) / 2);
        for (float v : data) CHECK(v == expected);
      });
    }
  }
}

TEST_CASE("mixing CPU and CUDA tensors is rejected before any communication", "[cuda][errors]") {
  concord::testing::spawn_ranks(1, [](concord::Communicator& comm) {
    std::vector<float> data(7, 1.0f);
    const auto on_cpu = cpu_view(data);
    const auto on_gpu = cuda_view(7);
    const Status status =
        status_of([&] { comm.all_reduce(on_cpu, on_gpu, concord::ReduceOp::kSum, false); });
    CHECK(status.code == StatusCode::kInvalidArgument);
    CHECK(status.message == "all_reduce: send is on cpu:0 but recv is on cuda:0");
    std::vector<concord::TensorView> mixed = {on_gpu, on_cpu};
    const Status multi =
        status_of([&] { comm.all_reduce_multi(mixed, concord::ReduceOp::kSum, false); });
    CHECK(multi.code == StatusCode::kInvalidArgument);
    CHECK(contains(multi.message, "tensor 1 is on cpu:0 but tensor 0 is on cuda:0"));
  });
}

TEST_CASE("the plugin's one metric entry rejects a kernel it does not know", "[cuda][metrics]") {
  if (!concord::plugin::built()) {
    SUCCEED("no CUDA plugin in this build");
    return;
  }
  // Checked before any device is touched, so it runs with or without a GPU.
  const concord::plugin::KernelsApi& api = concord::plugin::kernels();
  concord::plugin::MetricArgs args{};
  const int rc =
      api.metric_update(static_cast<concord::plugin::MetricKernel>(99), &args, nullptr);
  CHECK(rc == static_cast<int>(StatusCode::kInvalidArgument));
  CHECK(std::string(api.last_error()) == "metric_update: unknown metric kernel 99");
}
