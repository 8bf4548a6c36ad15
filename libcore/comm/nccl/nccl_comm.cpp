#include "comm/nccl/nccl_comm.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "base/deadline.hpp"
#include "base/format.hpp"
#include "plugin/cuda_errors.hpp"

namespace concord::nccl {
namespace {

using Clock = std::chrono::steady_clock;

using plugin::check_cuda;
using plugin::DeviceGuard;

// NCCL failures caused by the network or a peer leave the other ranks to
// blame; the rest are bugs or misuse here.
StatusCode code_of(ncclResult_t result) {
  return (result == ncclRemoteError || result == ncclSystemError) ? StatusCode::kRemote
                                                                  : StatusCode::kInternal;
}


}  // namespace

CudaState cuda_state() {
  CudaState state;
  cudaRuntimeGetVersion(&state.runtime_version);
  if (cudaDriverGetVersion(&state.driver_version) != cudaSuccess || state.driver_version == 0) {
    state.problem = "no CUDA driver (libcuda.so.1) was found";
    return state;
  }
  const cudaError_t error = cudaGetDeviceCount(&state.device_count);
  if (error != cudaSuccess) {
    state.device_count = 0;
    state.problem = std::string("the CUDA driver reports no usable device: ") +
                    cudaGetErrorString(error);
  } else if (state.device_count == 0) {
    state.problem = "the CUDA driver reports no device";
  }
  return state;
}

NcclComm::NcclComm(const ncclUniqueId& id, int nranks, int rank, int device, double timeout_s)
    : lib_(require_library()), device_(device), timeout_s_(timeout_s) {
  const CudaState cuda = cuda_state();
  if (cuda.device_count == 0) fail(StatusCode::kUnavailable, "nccl: ", cuda.problem);
  if (device < 0 || device >= cuda.device_count)
    invalid_argument("nccl: cuda:", device, " does not exist (", cuda.device_count, " devices)");
  DeviceGuard guard(device_);
  create_stream_and_event();
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so that a missing peer ends in a timeout, not a hang
  ncclUniqueId unique = id;
  try {
    std::lock_guard nccl_lock(nccl_mutex_);
    const ncclResult_t result = lib_.CommInitRankConfig(&comm_, nranks, unique, rank, &config);
    settle(comm_, result, "ncclCommInitRankConfig");
  } catch (...) {
    if (comm_ != nullptr) lib_.CommAbort(comm_);
    cudaEventDestroy(ready_event_);
    cudaStreamDestroy(stream_);
    throw;
  }
  start();
}

NcclComm::NcclComm(ncclComm_t comm, int device, double timeout_s)
    : lib_(require_library()), comm_(comm), device_(device), timeout_s_(timeout_s) {
  DeviceGuard guard(device_);
  create_stream_and_event();
  start();
}

void NcclComm::create_stream_and_event() {
  check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  const cudaError_t error = cudaEventCreateWithFlags(&ready_event_, cudaEventDisableTiming);
  if (error != cudaSuccess) {
    cudaStreamDestroy(stream_);
    check_cuda(error, "cudaEventCreate");
  }
}

void NcclComm::start() { watchdog_ = std::thread([this] { watch(); }); }

NcclComm::~NcclComm() {
  // Pending operations get the timeout to finish; one that has not even
  // started by then (its caller's stream is stuck) is aborted with the rest,
  // so destruction never waits forever.
  bool drained = true;
  {
    std::unique_lock lock(mutex_);
    stopping_ = true;
    changed_.notify_all();
    drained = changed_.wait_until(lock, deadline_after(timeout_s_),
                                  [this] { return pending_.empty(); });
  }
  if (!drained)
    abort(StatusCode::kAborted, "the nccl communicator was destroyed with operations that did "
                                "not finish within " + concat(timeout_s_, " s"));
  if (watchdog_.joinable()) watchdog_.join();
  try {
    DeviceGuard guard(device_);
    std::lock_guard nccl_lock(nccl_mutex_);
    if (comm_ != nullptr) {
      bool finalized = false;
      try {
        settle(comm_, lib_.CommFinalize(comm_), "ncclCommFinalize");
        finalized = true;
      } catch (const Error&) {
      }
      // Destroy and abort are blocking calls even on a nonblocking communicator.
      if (finalized)
        lib_.CommDestroy(comm_);
      else
        lib_.CommAbort(comm_);
      comm_ = nullptr;
    }
    for (cudaEvent_t event : spare_events_) cudaEventDestroy(event);
    if (ready_event_ != nullptr) cudaEventDestroy(ready_event_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  } catch (...) {
    // Destruction never throws; the device is gone or the context broken.
  }
}

void NcclComm::settle(ncclComm_t comm, ncclResult_t result, const char* what) {
  const auto deadline = deadline_after(timeout_s_);
  ncclResult_t state = result;
  while (true) {
    if (state == ncclSuccess || state == ncclInProgress) {
      if (comm == nullptr) return;
      if (lib_.CommGetAsyncError(comm, &state) != ncclSuccess) state = ncclInternalError;
      if (state == ncclSuccess) return;
    }
    if (state != ncclInProgress) {
      const char* detail = lib_.GetLastError(comm);
      throw Error(code_of(state), std::string(what) + " failed: " + lib_.GetErrorString(state) +
                                      (detail && *detail ? std::string(" (") + detail + ")" : ""));
    }
    if (abort_requested_.load(std::memory_order_acquire)) {
      std::lock_guard lock(mutex_);
      const Status request = abort_request_.value_or(Status{StatusCode::kAborted, "aborted"});
      throw Error(request.code, request.message);
    }
    if (Clock::now() > deadline)
      throw Error(StatusCode::kTimeout, std::string(what) + " did not finish within " +
                                            concat(timeout_s_, " s") +
                                            " (a peer is missing or stuck)");
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void NcclComm::check_usable() const {
  std::lock_guard lock(mutex_);
  if (failure_)
    throw Error(failure_->code,
                "the nccl communicator is unusable after an earlier failure: " + failure_->message);
}

cudaEvent_t NcclComm::take_event() {
  {
    std::lock_guard lock(mutex_);
    if (!spare_events_.empty()) {
      cudaEvent_t event = spare_events_.back();
      spare_events_.pop_back();
      return event;
    }
  }
  cudaEvent_t event = nullptr;
  check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
  return event;
}

NcclComm* NcclComm::split(int color, int key) {
  Cancelled cancelled;
  std::optional<Error> failed;
  NcclComm* result = nullptr;
  {
    std::lock_guard nccl_lock(nccl_mutex_);
    check_usable();
    if (lib_.CommSplit == nullptr)
      fail(StatusCode::kUnavailable, "split: NCCL ", version_string(lib_.version),
           " has no ncclCommSplit (NCCL 2.18 or newer)");
    DeviceGuard guard(device_);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t child = nullptr;
    try {
      const ncclResult_t result_code =
          lib_.CommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config);
      settle(comm_, result_code, "ncclCommSplit");
      if (child != nullptr) settle(child, ncclSuccess, "ncclCommSplit");
    } catch (const Error& e) {
      // Aborting the parent first stops NCCL's background split job, which
      // would otherwise still write `child` after this frame is gone.
      cancelled = abort_locked(e.code(), e.what());
      if (child != nullptr) lib_.CommAbort(child);
      failed.emplace(e);
    }
    if (!failed && child != nullptr) {
      try {
        result = new NcclComm(child, device_, timeout_s_);
      } catch (...) {
        lib_.CommAbort(child);
        throw;
      }
    }
  }
  if (failed) {
    notify(cancelled, failed->code(), failed->what());
    throw *failed;
  }
  return result;
}

void NcclComm::enqueue(const char* op, std::uint64_t seq, plugin::Stream caller,
                       const std::function<ncclResult_t(ncclComm_t, cudaStream_t)>& call,
                       plugin::Completion done, void* user) {
  const std::string label = std::string(op) + " #" + std::to_string(seq);
  Cancelled cancelled;
  std::optional<Error> failed;
  {
    std::lock_guard nccl_lock(nccl_mutex_);
    check_usable();
    DeviceGuard guard(device_);
    const auto caller_stream = static_cast<cudaStream_t>(caller);
    check_cuda(cudaEventRecord(ready_event_, caller_stream),
               "cudaEventRecord on the caller's stream");
    check_cuda(cudaStreamWaitEvent(stream_, ready_event_, 0), "cudaStreamWaitEvent");
    cudaEvent_t started = take_event();
    cudaEvent_t finished = nullptr;
    try {
      check_cuda(cudaEventRecord(started, stream_), "cudaEventRecord");
      settle(comm_, call(comm_, stream_), label.c_str());
      // From here on the operation is on the stream: a failure must not
      // leave it untracked, so it aborts the communicator.
      finished = take_event();
      check_cuda(cudaEventRecord(finished, stream_), "cudaEventRecord");
      check_cuda(cudaStreamWaitEvent(caller_stream, finished, 0),
                 "cudaStreamWaitEvent on the caller's stream");
    } catch (const Error& e) {
      {
        std::lock_guard lock(mutex_);
        spare_events_.push_back(started);
        if (finished != nullptr) spare_events_.push_back(finished);
      }
      cancelled = abort_locked(e.code(), label + ": " + e.what());
      failed.emplace(e.code(), label + ": " + e.what());
    }
    if (!failed) {
      std::lock_guard lock(mutex_);
      pending_.push_back(Pending{started, finished, label, done, user, false, Clock::now()});
    }
  }
  if (failed) {
    notify(cancelled, failed->code(), failed->what());
    throw *failed;
  }
  changed_.notify_all();
}

void NcclComm::abort(StatusCode code, const std::string& reason) noexcept {
  {
    std::lock_guard lock(mutex_);
    if (!abort_request_) abort_request_ = Status{code, reason};
  }
  abort_requested_.store(true, std::memory_order_release);
  Cancelled cancelled;
  {
    std::lock_guard nccl_lock(nccl_mutex_);
    cancelled = abort_locked(code, reason);
  }
  notify(cancelled, code, reason);
}

NcclComm::Cancelled NcclComm::abort_locked(StatusCode code, const std::string& reason) noexcept {
  Cancelled cancelled;
  {
    std::lock_guard lock(mutex_);
    if (failure_) return cancelled;
    failure_ = Status{code, reason};
    cancelled.swap(pending_);
    for (const Pending& p : cancelled) {
      spare_events_.push_back(p.started_event);
      spare_events_.push_back(p.done_event);
    }
  }
  changed_.notify_all();
  if (comm_ != nullptr) {
    try {
      DeviceGuard guard(device_);  // ncclCommAbort sets the device and leaves it so
      lib_.CommAbort(comm_);       // makes the kernels of this communicator return
    } catch (...) {
      lib_.CommAbort(comm_);
    }
    comm_ = nullptr;
  }
  return cancelled;
}

void NcclComm::notify(const Cancelled& cancelled, StatusCode code, const std::string& reason) {
  for (const Pending& p : cancelled)
    if (p.done != nullptr) p.done(p.user, static_cast<int>(code), reason.c_str());
}

void NcclComm::watch() {
  if (cudaSetDevice(device_) != cudaSuccess) {
    abort(StatusCode::kInternal, "nccl: the watchdog could not select cuda:" +
                                     std::to_string(device_) + "; the communicator was aborted");
    return;
  }
  // Polling backs off from 20 us to 1 ms while the oldest operation runs,
  // so a short collective completes its Work quickly and a long one costs
  // little CPU.
  auto pause = std::chrono::microseconds(20);
  std::unique_lock lock(mutex_);
  while (true) {
    changed_.wait(lock, [this] { return stopping_ || !pending_.empty(); });
    if (pending_.empty()) return;  // stopping, nothing left to follow
    Pending& oldest = pending_.front();
    const cudaEvent_t started_event = oldest.started_event;
    const cudaEvent_t done_event = oldest.done_event;
    const bool started = oldest.started;
    lock.unlock();
    const cudaError_t start_state = started ? cudaSuccess : cudaEventQuery(started_event);
    const cudaError_t state = cudaEventQuery(done_event);
    lock.lock();
    if (pending_.empty() || pending_.front().done_event != done_event) continue;  // aborted
    Pending& front = pending_.front();
    if (state == cudaSuccess) {
      Pending finished = std::move(front);
      pending_.pop_front();
      spare_events_.push_back(finished.started_event);
      spare_events_.push_back(finished.done_event);
      changed_.notify_all();  // a destructor may be waiting for the queue to drain
      lock.unlock();
      if (finished.done != nullptr) finished.done(finished.user, 0, "");
      pause = std::chrono::microseconds(20);
      lock.lock();
      continue;
    }
    // The clock of an operation runs from when the device reached it, not
    // from when it was enqueued behind the caller's own work.
    if (!front.started && start_state == cudaSuccess) {
      front.started = true;
      front.since = Clock::now();
    }
    const std::string label = front.label;  // a copy: abort() may drop the entry
    const bool overdue =
        front.started && Clock::now() - front.since > std::chrono::duration<double>(timeout_s_);
    lock.unlock();
    std::optional<Status> failure;
    if (state != cudaErrorNotReady) {
      failure = Status{StatusCode::kInternal,
                       label + " failed on cuda:" + std::to_string(device_) + ": " +
                           cudaGetErrorString(state) + "; the communicator was aborted"};
    } else {
      // Checked only when no other thread is in an NCCL call on comm_.
      std::unique_lock nccl_lock(nccl_mutex_, std::try_to_lock);
      if (nccl_lock.owns_lock() && comm_ != nullptr) {
        ncclResult_t async = ncclSuccess;
        if (lib_.CommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess &&
            async != ncclInProgress)
          failure = Status{code_of(async), label + " failed: NCCL reported " +
                                               lib_.GetErrorString(async) +
                                               "; the communicator was aborted"};
      }
    }
    if (!failure && overdue)
      failure = Status{StatusCode::kTimeout,
                       label + " did not finish within " + concat(timeout_s_, " s") +
                           " on nccl (cuda:" + std::to_string(device_) +
                           "); a peer is missing or stuck; the communicator was aborted"};
    if (failure) {
      abort(failure->code, failure->message);
    } else {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
    lock.lock();
  }
}

}  // namespace concord::nccl
