// What a backend implements: shm, nccl (and later gloo, shm+gloo) behind one
// interface, so the Communicator has one dispatch path. The Communicator
// validates arguments, numbers the operations and orders them; a backend
// only moves and reduces bytes of already-validated buffers. Gloo's split of
// algorithms from transports.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "base/dtype.hpp"
#include "base/reduce_op.hpp"
#include "base/tensor_view.hpp"
#include "comm/work.hpp"

namespace concord {

// Identifies one collective in error messages: "all_reduce #12".
struct OpLabel {
  const char* name;
  std::uint64_t seq;
};

// How a backend's operations end.
enum class Completion {
  // The call returns when the operation has finished on this rank (shm):
  // the Communicator runs it on the caller's thread or behind earlier
  // asynchronous work on its progress thread, and completes the Work.
  kOnReturn,
  // The call enqueues the operation on a device stream and returns (nccl):
  // the caller's stream waits for the result, and the backend completes
  // OpContext::work, when given, once the device has finished.
  kOnDevice,
};

// What every rank must pass alike to a collective, besides its kind and
// sequence number. Backends compare it across ranks before they touch any
// data (shm: in the descriptors of an operation's first step) and fail with
// Mismatch, naming what each rank called, when it differs: ranks that
// disagree get an error, never reinterpreted bytes.
struct Signature {
  int dtype = -1;    // a DType, or -1 (barrier, all_reduce_multi)
  int op = -1;       // a ReduceOp, or -1
  int root = -1;     // broadcast's root, or -1
  Shape shape;       // of each rank's tensor (the send tensor; broadcast: recv)
  // all_reduce_multi: a digest of every tensor's dtype and shape, in order.
  std::uint64_t layout = 0;
};

// One collective call, besides its buffers.
struct OpContext {
  OpLabel label;
  Signature signature;
  // kOnDevice backends: the caller's CUDA stream (nullptr: the legacy
  // default stream) and the Work to complete (nullptr for a blocking call).
  // Always null for kOnReturn backends.
  void* stream = nullptr;
  std::shared_ptr<Work> work;
};

// all_reduce_multi packs tensors smaller than this; larger ones are reduced
// where they are.
inline constexpr std::size_t kMultiPackBelowBytes = 256u << 10;

class Backend {
 public:
  virtual ~Backend() = default;
  // "shm", "nccl": what Communicator::backend_name() reports.
  virtual const char* name() const noexcept = 0;
  // The kind of memory its buffers live in.
  virtual DeviceKind device_kind() const noexcept = 0;
  virtual Completion completion() const noexcept = 0;
  // Throws InvalidArgument unless this backend can take tensors on `device`
  // (of its kind): an nccl backend serves one CUDA device per rank.
  virtual void check_device(const char* op, const Device& device) const;

  // recv[i] = op over ranks of send[i], count elements.
  virtual void all_reduce(const OpContext& ctx, const void* send, void* recv, std::size_t count,
                          DType dtype, ReduceOp op) = 0;
  // recv = every rank's `bytes` bytes of send, in rank order.
  virtual void all_gather(const OpContext& ctx, const void* send, void* recv,
                          std::size_t bytes) = 0;
  // send holds size() blocks of `count` elements; recv = op over ranks of block rank().
  virtual void reduce_scatter(const OpContext& ctx, const void* send, void* recv,
                              std::size_t count, DType dtype, ReduceOp op) = 0;
  // recv = root's send (`bytes` bytes); send is read on root only.
  virtual void broadcast(const OpContext& ctx, const void* send, void* recv, std::size_t bytes,
                         int root) = 0;
  virtual void barrier(const OpContext& ctx) = 0;
  // Every tensor all-reduced in place, as one operation. This default, for
  // host memory, packs the tensors under kMultiPackBelowBytes into one
  // buffer per dtype (one synchronisation for all of them) and reduces
  // larger ones where they are (packing would only add two copies to a
  // transfer that is already pipelined).
  virtual void all_reduce_multi(const OpContext& ctx, std::span<const TensorView> tensors,
                                ReduceOp op);

  // The backend of the ranks of this one that pass the same `color`,
  // ordered by (key, rank); collective over every rank of this one. nullptr
  // for a negative color, and for backends that are made afresh for a new
  // communicator instead (the default).
  virtual std::unique_ptr<Backend> split(int color, int key);

  // Makes pending and future operations here and on the peers fail. `cause`
  // is the root cause the peers report: kTimeout when this rank gave up
  // waiting, kRemote when it saw a peer die or was told to abort.
  virtual void abort(const Status& cause) noexcept = 0;
};

}  // namespace concord
