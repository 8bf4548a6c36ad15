// The nccl backend on libconcord's side: a handle on one of the CUDA
// plugin's NCCL communicators. It is made on a communicator's first CUDA
// collective, bootstrapping NCCL by sharing rank 0's ncclUniqueId through
// the store, and split with ncclCommSplit.
//
// Operations are enqueued on the device and return at once (kOnDevice): the
// caller's stream waits for their results, and the Work, when given, is
// completed when the device has finished (or the plugin's watchdog failed
// the operation).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "comm/backend.hpp"
#include "plugin/cuda_plugin_abi.hpp"

namespace concord {

struct Peers;

class NcclBackend final : public Backend {
 public:
  // Collective over `peers`, each rank on its own CUDA device `device`:
  // checks the device before the rendezvous (so ranks without one fail at
  // once), shares rank 0's unique id through the store under a key of
  // `attempt`, and waits at most the timeout for the others.
  static std::unique_ptr<NcclBackend> create(const Peers& peers, int device, const char* op,
                                             std::uint64_t attempt);
  ~NcclBackend() override;  // waits (at most the timeout) for enqueued work
  NcclBackend(const NcclBackend&) = delete;
  NcclBackend& operator=(const NcclBackend&) = delete;

  const char* name() const noexcept override { return "nccl"; }
  DeviceKind device_kind() const noexcept override { return DeviceKind::kCUDA; }
  Completion completion() const noexcept override { return Completion::kOnDevice; }
  void check_device(const char* op, const Device& device) const override;

  void all_reduce(const OpContext& ctx, const void* send, void* recv, std::size_t count,
                  DType dtype, ReduceOp op) override;
  void all_gather(const OpContext& ctx, const void* send, void* recv, std::size_t bytes) override;
  void reduce_scatter(const OpContext& ctx, const void* send, void* recv, std::size_t count,
                      DType dtype, ReduceOp op) override;
  void broadcast(const OpContext& ctx, const void* send, void* recv, std::size_t bytes,
                 int root) override;
  // An all-reduce of one element of device memory, as torch's NCCL barrier
  // does; a blocking barrier then waits for it on the host (within the
  // timeout: the plugin's watchdog ends it).
  void barrier(const OpContext& ctx) override;
  // Every tensor all-reduced in place, in one NCCL group.
  void all_reduce_multi(const OpContext& ctx, std::span<const TensorView> tensors,
                        ReduceOp op) override;

  // ncclCommSplit: collective over this backend's ranks.
  std::unique_ptr<Backend> split(int color, int key) override;
  void abort(const Status& cause) noexcept override;

 private:
  NcclBackend(const plugin::NcclApi& api, void* comm, int device);
  template <class Call>
  void submit(const OpContext& ctx, Call&& call);

  const plugin::NcclApi& api_;
  void* comm_;
  int device_;
  void* barrier_buffer_ = nullptr;  // one float32 on the device, made by the first barrier
};

}  // namespace concord
