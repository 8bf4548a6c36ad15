// A group of ranks and the collectives over it.
//
// The Communicator validates every call before any communication, numbers
// the operations and hands each to the backend of its tensors' device, all
// through one path (comm/backend.hpp): CPU tensors go to the host backend
// (shm), made with the communicator; CUDA tensors to the device backend
// (nccl), made by the first of them. Which backends exist follows the
// backend choice (comm/backend_choice.hpp).
//
// Host backends finish an operation before their call returns: blocking
// calls run on the caller's thread when nothing asynchronous is pending,
// otherwise behind it on the progress thread, so operations keep their issue
// order. Device backends enqueue an operation on `stream` (the caller's CUDA
// stream; nullptr is the legacy default stream), make `stream` wait for the
// result and return without waiting on the host, as NCCL's calls do; an
// asynchronous call's Work completes once the device is done. `stream` is
// ignored for CPU tensors.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/reduce_op.hpp"
#include "base/tensor_view.hpp"
#include "comm/backend.hpp"
#include "comm/backend_choice.hpp"
#include "comm/work.hpp"

namespace concord {

struct SharedStore;
class ProgressThread;

class Communicator {
 public:
  // Collective over `size` ranks meeting under key prefix `name` in the
  // store, using the backends of `choice`. `host` is this rank's host
  // identity (comm/hosts.hpp); unset, this process's. `device_backend`, when
  // given, is this communicator's device backend, on `device` (from a split).
  Communicator(std::shared_ptr<SharedStore> store, std::string name, int rank, int size,
               double timeout_s, BackendChoice choice = BackendChoice::kAuto,
               std::optional<std::string> host = std::nullopt,
               std::unique_ptr<Backend> device_backend = nullptr, Device device = {});
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  int local_rank() const noexcept { return local_rank_; }
  double timeout_s() const noexcept { return timeout_s_; }
  BackendChoice backend_choice() const noexcept { return choice_; }
  // What CPU tensors use ("shm", "gloo", "shm+gloo"), or "nccl" for a
  // communicator that takes CUDA tensors only.
  const char* backend_name() const noexcept;

  // Ranks passing the same color form a communicator ordered by (key, rank),
  // with this one's backend choice and host identities; a negative color
  // returns nullptr.
  // Collective over this communicator.
  std::unique_ptr<Communicator> split(int color, int key);

  // Each returns nullptr when blocking (async == false), after completion.
  std::shared_ptr<Work> all_reduce(const TensorView& send, const TensorView& recv, ReduceOp op,
                                   bool async, void* stream = nullptr);
  std::shared_ptr<Work> all_gather(const TensorView& send, const TensorView& recv, bool async,
                                   void* stream = nullptr);
  std::shared_ptr<Work> reduce_scatter(const TensorView& send, const TensorView& recv,
                                       ReduceOp op, bool async, void* stream = nullptr);
  std::shared_ptr<Work> broadcast(const TensorView& send, const TensorView& recv, int root,
                                  bool async, void* stream = nullptr);
  std::shared_ptr<Work> barrier(bool async);
  // All-reduces every tensor in place as one operation (Backend::all_reduce_multi).
  std::shared_ptr<Work> all_reduce_multi(std::vector<TensorView> tensors, ReduceOp op, bool async,
                                         void* stream = nullptr);

  // Fails pending and future collectives here and on the peers.
  void abort() noexcept;

 private:
  using Body = std::function<void(Backend&, const OpContext&)>;

  // The backend of tensors on `device`; makes the device backend on first use.
  Backend& backend_for(const Device& device, const char* op);
  // The one dispatch path of every collective.
  std::shared_ptr<Work> run(const char* op, const Device& device, bool async, void* stream,
                            Signature signature, Body body);
  void execute(const OpContext& ctx, Backend& backend, const Body& body);
  // Runs `f`, recording a failure that leaves the communicator unusable.
  template <class F>
  void guarded(F&& f);
  void check_usable(const char* op) const;
  // Keeps the first failure that leaves the communicator unusable.
  void record_failure(const Status& status);

  std::shared_ptr<SharedStore> store_;
  std::string name_;
  int rank_;
  int size_;
  int local_rank_ = 0;
  double timeout_s_;
  BackendChoice choice_;
  std::vector<std::string> hosts_;  // every rank's host identity
  std::unique_ptr<Backend> host_backend_;   // nullptr when the choice takes no CPU tensors
  std::mutex device_mutex_;                 // guards the creation of device_backend_
  std::unique_ptr<Backend> device_backend_;  // made by the first CUDA tensor
  Device device_;                            // of device_backend_
  std::uint64_t device_attempts_ = 0;        // device backend creations tried
  std::uint64_t next_seq_ = 0;
  std::uint64_t splits_ = 0;

  std::mutex execute_mutex_;  // one host collective executes at a time
  std::unique_ptr<ProgressThread> progress_;
  mutable std::mutex failure_mutex_;
  std::optional<Status> failure_;  // set by a timeout, a dead peer or abort
};

}  // namespace concord
