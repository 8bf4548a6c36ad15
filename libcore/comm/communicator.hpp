// A group of ranks and the collectives over it (DESIGN.md §2).
//
// The Communicator validates every call before any communication, numbers
// the operations, keeps them in issue order (blocking calls run on the
// caller's thread when nothing asynchronous is pending, otherwise behind it
// on the progress thread) and picks the backend by device.
//
// CUDA tensors go to the nccl backend, created on the first of them: their
// collectives are enqueued on the device after the work on `stream` (the
// caller's CUDA stream; nullptr is the legacy default stream), `stream`
// waits for the result, and the call returns without waiting on the host,
// as NCCL's do. An asynchronous call's Work completes once the device is
// done. `stream` is ignored for CPU tensors.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/tensor_view.hpp"
#include "comm/backend.hpp"
#include "comm/nccl/nccl_backend.hpp"
#include "comm/work.hpp"
#include "base/reduce_op.hpp"

namespace concord {

class StoreClient;
class ProgressThread;

// all_reduce_multi packs tensors smaller than this; larger ones are reduced
// where they are.
inline constexpr std::size_t kMultiPackBelowBytes = 256u << 10;

// A store client shared by a communicator and the ones split from it; the
// client serves one call at a time.
struct SharedStore {
  std::mutex mutex;
  std::unique_ptr<StoreClient> client;
};

class Communicator {
 public:
  // Collective over `size` ranks meeting under key prefix `name` in the store.
  // `nccl`, when given, is this communicator's nccl backend (from a split).
  Communicator(std::shared_ptr<SharedStore> store, std::string name, int rank, int size,
               double timeout_s, std::unique_ptr<NcclBackend> nccl = nullptr);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  int local_rank() const noexcept { return local_rank_; }
  double timeout_s() const noexcept { return timeout_s_; }
  const char* cpu_backend_name() const noexcept;

  // Ranks passing the same color form a communicator ordered by (key, rank);
  // a negative color returns nullptr. Collective over this communicator.
  std::unique_ptr<Communicator> split(int color, int key);

  // Each returns nullptr when blocking (async == false), after completion.
  std::shared_ptr<Work> all_reduce(const TensorView& send, const TensorView& recv, ReduceOp op,
                                   bool async, void* stream = nullptr);
  std::shared_ptr<Work> all_gather(const TensorView& send, const TensorView& recv, bool async, void* stream = nullptr);
  std::shared_ptr<Work> reduce_scatter(const TensorView& send, const TensorView& recv,
                                       ReduceOp op, bool async, void* stream = nullptr);
  std::shared_ptr<Work> broadcast(const TensorView& send, const TensorView& recv, int root,
                                  bool async, void* stream = nullptr);
  std::shared_ptr<Work> barrier(bool async);
  // All-reduces every tensor in place as one operation: tensors under
  // 256 KiB are packed into one buffer per dtype; larger ones are reduced
  // in place, each in its own pipelined pass.
  std::shared_ptr<Work> all_reduce_multi(std::vector<TensorView> tensors, ReduceOp op, bool async, void* stream = nullptr);

  // Fails pending and future collectives here and on the peers.
  void abort() noexcept;

 private:
  Backend& backend_for(const Device& device, const char* op);
  std::shared_ptr<Work> run(const char* op, Device device, std::function<void(Backend&, OpLabel)> body,
                            bool async);
  void execute(const char* op, std::uint64_t seq, Backend& backend,
               const std::function<void(Backend&, OpLabel)>& body);
  void check_usable(const char* op) const;
  // Keeps the first failure that leaves the communicator unusable.
  void record_failure(const Status& status);
  NcclBackend& nccl_for(const Device& device, const char* op);
  using DeviceBody = std::function<void(NcclBackend&, OpLabel, const std::shared_ptr<Work>&)>;
  std::shared_ptr<Work> run_on_device(const char* op, const Device& device, bool async,
                                      const DeviceBody& body);

  std::shared_ptr<SharedStore> store_;
  std::string name_;
  int rank_;
  int size_;
  int local_rank_ = 0;
  double timeout_s_;
  std::unique_ptr<Backend> cpu_backend_;
  std::mutex nccl_mutex_;                 // guards the creation of nccl_
  std::unique_ptr<NcclBackend> nccl_;     // on the first CUDA tensor
  std::uint64_t nccl_attempts_ = 0;       // bootstraps of nccl_ tried
  std::uint64_t next_seq_ = 0;
  std::uint64_t splits_ = 0;

  std::mutex execute_mutex_;  // one collective executes at a time
  std::unique_ptr<ProgressThread> progress_;
  mutable std::mutex failure_mutex_;
  std::optional<Status> failure_;  // set by a timeout, a dead peer or abort
};

}  // namespace concord
