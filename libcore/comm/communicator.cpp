#include "comm/communicator.hpp"

#include <unistd.h>

#include <algorithm>
#include <sstream>
#include <utility>
#include <vector>

#include "base/format.hpp"
#include "comm/progress_thread.hpp"
#include "comm/shm/shm_backend.hpp"
#include "kernels/cpu/multi_tensor.hpp"
#include "plugin/cuda_plugin.hpp"
#include "rendezvous/store.hpp"

namespace concord {

namespace {

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

// A failure that leaves the peers in an unknown state: the communicator
// cannot be used again. Argument and mismatch errors leave it usable.
bool breaks_communicator(StatusCode code) {
  return code == StatusCode::kTimeout || code == StatusCode::kRemote ||
         code == StatusCode::kAborted || code == StatusCode::kInternal;
}

void check_same_device_and_dtype(const char* op, const TensorView& send, const TensorView& recv) {
  if (!(send.device == recv.device))
    invalid_argument(op, ": send is on ", device_kind_name(send.device.kind), ":", send.device.id,
                     " but recv is on ", device_kind_name(recv.device.kind), ":", recv.device.id);
  if (send.dtype != recv.dtype)
    invalid_argument(op, ": send is ", dtype_name(send.dtype), " but recv is ",
                     dtype_name(recv.dtype));
}

}  // namespace

Communicator::Communicator(std::shared_ptr<SharedStore> store, std::string name, int rank,
                           int size, double timeout_s, std::unique_ptr<NcclBackend> nccl)
    : store_(std::move(store)), name_(std::move(name)), rank_(rank), size_(size),
      timeout_s_(timeout_s), nccl_(std::move(nccl)) {
  if (size < 1) invalid_argument("communicator size must be >= 1, got ", size);
  if (rank < 0 || rank >= size) invalid_argument("rank ", rank, " is outside [0, ", size, ")");
  if (!(timeout_s > 0)) invalid_argument("timeout must be positive, got ", timeout_s, " s");

  std::lock_guard lock(store_->mutex);
  StoreClient& client = *store_->client;
  const auto timeout = std::chrono::duration<double>(timeout_s);
  const std::string me = host_name();
  client.set(concat(name_, "/host/", rank_), me);
  std::string other_host;
  for (int q = 0; q < size_; ++q) {
    std::string host = q == rank_ ? me : client.get(concat(name_, "/host/", q), timeout);
    if (host == me) {
      if (q < rank_) ++local_rank_;
    } else {
      other_host = host;
    }
  }
  if (!other_host.empty())
    fail(StatusCode::kUnavailable, "ranks of communicator '", name_, "' span hosts (", me, ", ",
         other_host, "): CPU collectives across hosts need the gloo backend, not in this build");
  cpu_backend_ = std::make_unique<shm::ShmBackend>(client, name_, rank_, size_,
                                                   shm::ShmConfig::from_env(size_, timeout_s));
}

Communicator::~Communicator() {
  progress_.reset();  // finishes the queued collectives first
  nccl_.reset();      // waits, at most the timeout, for work on the device
}

const char* Communicator::cpu_backend_name() const noexcept { return cpu_backend_->name(); }


std::unique_ptr<Communicator> Communicator::split(int color, int key) {
  check_usable("split");
  const std::string prefix = concat(name_, "/split", splits_++);
  std::vector<std::pair<int, int>> members;  // (key, rank) of ranks with our color
  {
    std::lock_guard lock(store_->mutex);
    StoreClient& store = *store_->client;
    const auto timeout = std::chrono::duration<double>(timeout_s_);
    store.set(concat(prefix, "/", rank_), concat(color, " ", key));
    for (int q = 0; q < size_; ++q) {
      std::istringstream entry(store.get(concat(prefix, "/", q), timeout));
      int their_color = 0, their_key = 0;
      entry >> their_color >> their_key;
      if (their_color == color) members.emplace_back(their_key, q);
    }
  }
  // A communicator with an nccl backend splits it too (every rank takes
  // part, as ncclCommSplit needs); one without makes its own on first use.
  std::unique_ptr<NcclBackend> child_nccl;
  {
    std::lock_guard lock(nccl_mutex_);
    if (nccl_) {
      try {
        child_nccl = nccl_->split(color, key);
      } catch (const Error& e) {
        if (breaks_communicator(e.code())) record_failure(e.status());
        throw;
      }
    }
  }
  if (color < 0) return nullptr;
  std::sort(members.begin(), members.end());
  const auto me = std::find(members.begin(), members.end(), std::make_pair(key, rank_));
  const int new_rank = static_cast<int>(me - members.begin());
  return std::make_unique<Communicator>(store_, concat(prefix, "/c", color), new_rank,
                                        static_cast<int>(members.size()), timeout_s_,
                                        std::move(child_nccl));
}

void Communicator::check_usable(const char* op) const {
  std::lock_guard lock(failure_mutex_);
  if (failure_)
    fail(failure_->code, op, ": the communicator is unusable after an earlier failure: ",
         failure_->message);
}

Backend& Communicator::backend_for(const Device& device, const char* op) {
  if (device.kind == DeviceKind::kCUDA)
    fail(StatusCode::kInternal, op, ": CUDA tensors reached the CPU backend");
  return *cpu_backend_;
}

NcclBackend& Communicator::nccl_for(const Device& device, const char* op) {
  std::lock_guard lock(nccl_mutex_);
  if (!nccl_) {
    // Collective: every rank's first CUDA collective is this one. Rank 0's
    // ncclUniqueId goes through the store; the store is held only for that.
    // A key per attempt: after a failed one (no device, say) a later attempt
    // must not read the id of the earlier.
    const std::string key = concat(name_, "/nccl/unique_id/", nccl_attempts_++);
    // Checked before the rendezvous, so that ranks without a usable device
    // fail at once instead of waiting for each other.
    plugin::require_device(device.id, /*need_nccl=*/true, concat(op, ": nccl").c_str());
    std::string id;
    if (rank_ == 0) id = NcclBackend::make_unique_id();
    {
      std::lock_guard store_lock(store_->mutex);
      if (rank_ == 0)
        store_->client->set(key, id);
      else
        id = store_->client->get(key, std::chrono::duration<double>(timeout_s_));
    }
    nccl_ = NcclBackend::join(id, rank_, size_, device.id, timeout_s_);
  } else if (nccl_->device() != device.id) {
    invalid_argument(op, ": tensors are on cuda:", device.id, " but this communicator's nccl ",
                     "backend is on cuda:", nccl_->device(),
                     "; a communicator uses one CUDA device per rank");
  }
  return *nccl_;
}

std::shared_ptr<Work> Communicator::run_on_device(const char* op, const Device& device,
                                                  bool async, const DeviceBody& body) {
  check_usable(op);
  try {
    NcclBackend& nccl = nccl_for(device, op);
    const std::uint64_t seq = next_seq_++;
    auto work = async ? std::make_shared<Work>() : nullptr;
    body(nccl, OpLabel{op, seq}, work);
    return work;
  } catch (const Error& e) {
    if (breaks_communicator(e.code())) record_failure(e.status());
    throw;
  }
}

std::shared_ptr<Work> Communicator::run(const char* op, Device device,
                                        std::function<void(Backend&, OpLabel)> body, bool async) {
  check_usable(op);
  Backend& backend = backend_for(device, op);
  const std::uint64_t seq = next_seq_++;
  if (!async && (!progress_ || progress_->outstanding() == 0)) {
    execute(op, seq, backend, body);
    return nullptr;
  }
  auto work = std::make_shared<Work>();
  if (!progress_) progress_ = std::make_unique<ProgressThread>();
  progress_->submit([this, op, seq, &backend, body = std::move(body), work] {
    try {
      execute(op, seq, backend, body);
      work->complete(Status::Ok());
    } catch (const Error& e) {
      work->complete(e.status());
    } catch (const std::exception& e) {
      work->complete({StatusCode::kInternal, concat(op, " #", seq, ": ", e.what())});
    }
  });
  if (async) return work;
  // A blocking call behind pending asynchronous ones: each of them ends
  // within its own timeout, so this wait is bounded too.
  work->wait_for(std::chrono::hours(24 * 365));
  if (const Status status = work->status(); !status.ok()) throw_status(status);
  return nullptr;
}

void Communicator::execute(const char* op, std::uint64_t seq, Backend& backend,
                           const std::function<void(Backend&, OpLabel)>& body) {
  std::lock_guard lock(execute_mutex_);
  check_usable(op);
  try {
    body(backend, OpLabel{op, seq});
  } catch (const Error& e) {
    if (breaks_communicator(e.code())) record_failure(e.status());
    throw;
  }
}

void Communicator::record_failure(const Status& status) {
  std::lock_guard lock(failure_mutex_);
  if (!failure_) failure_ = status;
}

void Communicator::abort() noexcept {
  record_failure({StatusCode::kAborted, concat("rank ", rank_, " aborted the communicator")});
  const std::string reason = concat("rank ", rank_, " called abort");
  cpu_backend_->abort(reason.c_str());
  std::lock_guard lock(nccl_mutex_);
  if (nccl_) nccl_->abort(reason.c_str());
}

// ---- collectives: validate everything, then communicate --------------------

std::shared_ptr<Work> Communicator::all_reduce(const TensorView& send, const TensorView& recv,
                                               ReduceOp op, bool async, void* stream) {
  check_same_device_and_dtype("all_reduce", send, recv);
  check_reduce_op(op, send.dtype);
  if (recv.numel != send.numel)
    invalid_argument("all_reduce: recv holds ", recv.numel, " elements, send holds ", send.numel);
  if (send.device.kind == DeviceKind::kCUDA)
    return run_on_device("all_reduce", send.device, async,
                         [&](NcclBackend& b, OpLabel label, const std::shared_ptr<Work>& work) {
      b.all_reduce(label, send.data, recv.data, static_cast<std::size_t>(send.numel), send.dtype,
                   op, stream, work);
    });
  return run("all_reduce", send.device, [send, recv, op](Backend& b, OpLabel label) {
    b.all_reduce(label, send.data, recv.data, static_cast<std::size_t>(send.numel), send.dtype, op);
  }, async);
}

std::shared_ptr<Work> Communicator::all_gather(const TensorView& send, const TensorView& recv,
                                               bool async, void* stream) {
  check_same_device_and_dtype("all_gather", send, recv);
  if (recv.numel != send.numel * size_)
    invalid_argument("all_gather: recv holds ", recv.numel, " elements, expected ", size_, " x ",
                     send.numel, " = ", send.numel * size_);
  if (send.device.kind == DeviceKind::kCUDA)
    return run_on_device("all_gather", send.device, async,
                         [&](NcclBackend& b, OpLabel label, const std::shared_ptr<Work>& work) {
      b.all_gather(label, send.data, recv.data, send.nbytes(), stream, work);
    });
  return run("all_gather", send.device, [send, recv](Backend& b, OpLabel label) {
    b.all_gather(label, send.data, recv.data, send.nbytes());
  }, async);
}

std::shared_ptr<Work> Communicator::reduce_scatter(const TensorView& send, const TensorView& recv,
                                                   ReduceOp op, bool async, void* stream) {
  check_same_device_and_dtype("reduce_scatter", send, recv);
  check_reduce_op(op, send.dtype);
  if (send.numel != recv.numel * size_)
    invalid_argument("reduce_scatter: send holds ", send.numel, " elements, expected ", size_,
                     " x ", recv.numel, " = ", recv.numel * size_);
  if (send.device.kind == DeviceKind::kCUDA)
    return run_on_device("reduce_scatter", send.device, async,
                         [&](NcclBackend& b, OpLabel label, const std::shared_ptr<Work>& work) {
      b.reduce_scatter(label, send.data, recv.data, static_cast<std::size_t>(recv.numel),
                       send.dtype, op, stream, work);
    });
  return run("reduce_scatter", send.device, [send, recv, op](Backend& b, OpLabel label) {
    b.reduce_scatter(label, send.data, recv.data, static_cast<std::size_t>(recv.numel),
                     send.dtype, op);
  }, async);
}

std::shared_ptr<Work> Communicator::broadcast(const TensorView& send, const TensorView& recv,
                                              int root, bool async, void* stream) {
  if (root < 0 || root >= size_)
    invalid_argument("broadcast: root ", root, " is outside [0, ", size_, ")");
  check_same_device_and_dtype("broadcast", send, recv);
  if (recv.numel != send.numel)
    invalid_argument("broadcast: recv holds ", recv.numel, " elements, send holds ", send.numel);
  if (recv.device.kind == DeviceKind::kCUDA)
    return run_on_device("broadcast", recv.device, async,
                         [&](NcclBackend& b, OpLabel label, const std::shared_ptr<Work>& work) {
      b.broadcast(label, send.data, recv.data, recv.nbytes(), root, stream, work);
    });
  return run("broadcast", recv.device, [send, recv, root](Backend& b, OpLabel label) {
    b.broadcast(label, send.data, recv.data, recv.nbytes(), root);
  }, async);
}

std::shared_ptr<Work> Communicator::barrier(bool async) {
  return run("barrier", Device{}, [](Backend& b, OpLabel label) { b.barrier(label); }, async);
}

std::shared_ptr<Work> Communicator::all_reduce_multi(std::vector<TensorView> tensors, ReduceOp op,
                                                     bool async, void* stream) {
  const Device device = tensors.empty() ? Device{} : tensors.front().device;
  std::vector<DType> dtypes;  // in order of first appearance, the same on every rank
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorView& t = tensors[i];
    if (!(t.device == device))
      invalid_argument("all_reduce_multi: tensor ", i, " is on ", device_kind_name(t.device.kind),
                       ":", t.device.id, " but tensor 0 is on ", device_kind_name(device.kind), ":",
                       device.id);
    check_reduce_op(op, t.dtype);
    if (std::find(dtypes.begin(), dtypes.end(), t.dtype) == dtypes.end()) dtypes.push_back(t.dtype);
  }
  if (device.kind == DeviceKind::kCUDA)
    return run_on_device("all_reduce_multi", device, async,
                         [&](NcclBackend& b, OpLabel label, const std::shared_ptr<Work>& work) {
      b.all_reduce_group(label, tensors, op, stream, work);
    });
  return run("all_reduce_multi", device, [tensors = std::move(tensors), dtypes, op](Backend& b, OpLabel label) {
    // Small tensors are packed so they cost one synchronisation together;
    // large ones are reduced where they are, since packing would only add
    // two copies to a transfer that is already pipelined.
    auto packed_here = [](const TensorView& t) {
      return t.numel != 0 && t.nbytes() < kMultiPackBelowBytes;
    };
    for (const TensorView& t : tensors)
      if (t.nbytes() >= kMultiPackBelowBytes)
        b.all_reduce(label, t.data, t.data, static_cast<std::size_t>(t.numel), t.dtype, op);
    for (DType dtype : dtypes) {
      std::vector<TensorView> packed;
      std::size_t numel = 0;
      for (const TensorView& t : tensors)
        if (t.dtype == dtype && packed_here(t)) {
          packed.push_back(t);
          numel += static_cast<std::size_t>(t.numel);
        }
      if (numel == 0) continue;
      auto buffer = std::make_unique_for_overwrite<unsigned char[]>(numel * dtype_size(dtype));
      cpu::pack(packed, buffer.get(), dtype, 1.0);
      b.all_reduce(label, buffer.get(), buffer.get(), numel, dtype, op);
      cpu::unpack(buffer.get(), dtype, packed, 1.0);
    }
  }, async);
}

}  // namespace concord
