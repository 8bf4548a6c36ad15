// The nccl backend on libconcord's side (DESIGN.md §3): a handle on one of
// the CUDA plugin's NCCL communicators. The Communicator creates it when its
// first CUDA tensor arrives, bootstrapping NCCL by sharing rank 0's
// ncclUniqueId through the store, and splits it with ncclCommSplit.
//
// Operations are enqueued on the device and return at once: the caller's
// stream waits for their results, and a Work, when given, completes when the
// device has finished (or the plugin's watchdog failed the operation).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "base/tensor_view.hpp"
#include "comm/backend.hpp"
#include "comm/work.hpp"
#include "base/reduce_op.hpp"
#include "plugin/cuda_plugin_abi.hpp"

namespace concord {

class NcclBackend {
 public:
  // A new ncclUniqueId (rank 0 makes it; the Communicator shares it through
  // the store).
  static std::string make_unique_id();
  // Collective over the `size` ranks given the same `unique_id`, each on its
  // own CUDA device `device`; waits at most timeout_s for the others.
  static std::unique_ptr<NcclBackend> join(const std::string& unique_id, int rank, int size,
                                           int device, double timeout_s);
  ~NcclBackend();  // waits (at most the timeout) for enqueued work
  NcclBackend(const NcclBackend&) = delete;
  NcclBackend& operator=(const NcclBackend&) = delete;

  int device() const noexcept { return device_; }

  // ncclCommSplit: collective over this backend's ranks; nullptr for a
  // negative color.
  std::unique_ptr<NcclBackend> split(int color, int key);
  void abort(const char* reason) noexcept;

  using Stream = plugin::Stream;
  // `work`, when given, is completed once the operation ended on the device.
  void all_reduce(OpLabel label, const void* send, void* recv, std::size_t count, DType dtype,
                  ReduceOp op, Stream stream, const std::shared_ptr<Work>& work);
  void all_gather(OpLabel label, const void* send, void* recv, std::size_t bytes, Stream stream,
                  const std::shared_ptr<Work>& work);
  void reduce_scatter(OpLabel label, const void* send, void* recv, std::size_t recv_count,
                      DType dtype, ReduceOp op, Stream stream, const std::shared_ptr<Work>& work);
  void broadcast(OpLabel label, const void* send, void* recv, std::size_t bytes, int root,
                 Stream stream, const std::shared_ptr<Work>& work);
  // Every tensor all-reduced in place, in one NCCL group.
  void all_reduce_group(OpLabel label, const std::vector<TensorView>& tensors, ReduceOp op,
                        Stream stream, const std::shared_ptr<Work>& work);

 private:
  NcclBackend(const plugin::NcclApi& api, void* comm, int device);
  template <class Call>
  void submit(OpLabel label, const std::shared_ptr<Work>& work, Call&& call);

  const plugin::NcclApi& api_;
  void* comm_;
  int device_;
};

}  // namespace concord
