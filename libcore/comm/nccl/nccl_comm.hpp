// One NCCL communicator inside the CUDA plugin, with its stream and its
// watchdog.
//
// Every operation is enqueued on the communicator's own stream after the
// caller's stream (an event recorded there), and the caller's stream waits on
// an event recorded after it: the host never waits for the device. The
// watchdog thread follows these events in issue order; it completes each
// operation's callback, and it aborts the communicator (ncclCommAbort) when
// NCCL reports an asynchronous error or an operation has not finished within
// the timeout, so a lost peer ends in an error instead of a hang. After that
// every call fails with the first failure's message.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/status.hpp"
#include "comm/nccl/nccl_library.hpp"
#include "plugin/cuda_plugin_abi.hpp"

namespace concord::nccl {

class NcclComm {
 public:
  // Collective: joins the ranks sharing `id` (waits at most timeout_s).
  NcclComm(const ncclUniqueId& id, int nranks, int rank, int device, double timeout_s);
  // Waits for enqueued work (each operation at most the timeout), then
  // finalises and destroys the NCCL communicator, or aborts it.
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // ncclCommSplit; nullptr for a negative color. Collective over this one.
  NcclComm* split(int color, int key);

  // Enqueues `call(comm, stream)` (the NCCL calls of one operation) on the
  // communicator's stream between the caller's stream and its result.
  void enqueue(const char* op, std::uint64_t seq, plugin::Stream caller,
               const std::function<ncclResult_t(ncclComm_t, cudaStream_t)>& call,
               plugin::Completion done, void* user);

  // Makes this and every later call fail; pending callbacks get `reason`.
  // Interrupts a call that is waiting on NCCL.
  void abort(StatusCode code, const std::string& reason) noexcept;

 private:
  struct Pending {
    cudaEvent_t started_event;  // on the communicator's stream, before the NCCL call
    cudaEvent_t done_event;     // after it
    std::string label;          // "all_reduce #12", for messages
    plugin::Completion done;
    void* user;
    bool started = false;
    std::chrono::steady_clock::time_point since;  // when it started on the device
  };
  using Cancelled = std::deque<Pending>;

  NcclComm(ncclComm_t comm, int device, double timeout_s);  // from split()
  void create_stream_and_event();
  void start();
  // Polls a nonblocking NCCL call on `comm` until it has been issued; the
  // timeout ends it with Error(kTimeout), an abort() with Error(kAborted).
  // Needs nccl_mutex_.
  void settle(ncclComm_t comm, ncclResult_t result, const char* what);
  // Marks the communicator failed and aborts NCCL; needs nccl_mutex_. The
  // cancelled operations are returned, for notify() once the lock is free.
  Cancelled abort_locked(StatusCode code, const std::string& reason) noexcept;
  static void notify(const Cancelled& cancelled, StatusCode code, const std::string& reason);
  void check_usable() const;
  void watch();
  cudaEvent_t take_event();

  const Library& lib_;
  ncclComm_t comm_ = nullptr;
  int device_ = 0;
  double timeout_s_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_event_ = nullptr;  // recorded on the caller's stream

  // Every NCCL call on comm_ holds it: NCCL's nonblocking state is not
  // safe to poll from two threads at once.
  std::mutex nccl_mutex_;
  // An abort() asked while another thread holds nccl_mutex_ (settle()
  // reads it to give up early).
  std::atomic<bool> abort_requested_{false};

  mutable std::mutex mutex_;  // guards everything below
  std::condition_variable changed_;
  std::deque<Pending> pending_;
  std::vector<cudaEvent_t> spare_events_;
  std::optional<Status> failure_;
  std::optional<Status> abort_request_;
  bool stopping_ = false;
  std::thread watchdog_;
};

// Whether the process has a CUDA driver and devices, and why not.
struct CudaState {
  int runtime_version = 0;
  int driver_version = 0;
  int device_count = 0;
  std::string problem;
};
CudaState cuda_state();

}  // namespace concord::nccl
