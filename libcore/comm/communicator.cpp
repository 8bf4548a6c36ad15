#include "comm/communicator.hpp"

#include <algorithm>
#include <sstream>
#include <utility>
#include <vector>

#include "base/digest.hpp"
#include "base/format.hpp"
#include "comm/backends.hpp"
#include "comm/hosts.hpp"
#include "comm/progress_thread.hpp"
#include "rendezvous/store.hpp"

namespace concord {

namespace {

// A failure that leaves the peers in an unknown state: the communicator
// cannot be used again. Argument and mismatch errors leave it usable.
bool breaks_communicator(StatusCode code) {
  return code == StatusCode::kTimeout || code == StatusCode::kRemote ||
         code == StatusCode::kAborted || code == StatusCode::kInternal;
}

std::string device_text(const Device& device) {
  return concat(device_kind_name(device.kind), ":", device.id);
}

void check_same_device_and_dtype(const char* op, const TensorView& send, const TensorView& recv) {
  if (!(send.device == recv.device))
    invalid_argument(op, ": send is on ", device_text(send.device), " but recv is on ",
                     device_text(recv.device));
  if (send.dtype != recv.dtype)
    invalid_argument(op, ": send is ", dtype_name(send.dtype), " but recv is ",
                     dtype_name(recv.dtype));
}

// Every tensor's dtype and extents: ranks whose tensor lists differ in any
// of them get different digests.
std::uint64_t layout_digest(const std::vector<TensorView>& tensors) {
  Digest digest;
  digest.mix(tensors.size());
  for (const TensorView& t : tensors) {
    digest.mix(static_cast<std::uint64_t>(t.dtype)).mix(static_cast<std::uint64_t>(t.shape.ndim()));
    for (std::int64_t extent : t.shape) digest.mix(static_cast<std::uint64_t>(extent));
  }
  return digest.value();
}

}  // namespace

Communicator::Communicator(std::shared_ptr<SharedStore> store, std::string name, int rank,
                           int size, double timeout_s, BackendChoice choice,
                           std::optional<std::string> host,
                           std::unique_ptr<Backend> device_backend, Device device)
    : store_(std::move(store)), name_(std::move(name)), rank_(rank), size_(size),
      timeout_s_(timeout_s), choice_(choice), device_backend_(std::move(device_backend)),
      device_(device) {
  if (size < 1) invalid_argument("communicator size must be >= 1, got ", size);
  if (rank < 0 || rank >= size) invalid_argument("rank ", rank, " is outside [0, ", size, ")");
  if (!(timeout_s > 0)) invalid_argument("timeout must be positive, got ", timeout_s, " s");
  {
    std::lock_guard lock(store_->mutex);
    hosts_ = exchange_hosts(*store_->client, name_, rank_, size_, timeout_s_,
                            host ? *host : host_identity());
  }
  local_rank_ = local_rank_of(hosts_, rank_);
  host_backend_ = make_host_backend(choice_, Peers{*store_, name_, rank_, size_, timeout_s_, hosts_});
}

Communicator::~Communicator() {
  progress_.reset();        // finishes the queued collectives first
  device_backend_.reset();  // waits, at most the timeout, for work on the device
}

const char* Communicator::backend_name() const noexcept {
  return host_backend_ ? host_backend_->name() : backend_choice_name(choice_);
}

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
  // A communicator with a device backend splits it too (every rank takes
  // part, as ncclCommSplit needs); one without makes its own on first use.
  std::unique_ptr<Backend> child_device;
  {
    std::lock_guard lock(device_mutex_);
    if (device_backend_) guarded([&] { child_device = device_backend_->split(color, key); });
  }
  if (color < 0) return nullptr;
  std::sort(members.begin(), members.end());
  const auto me = std::find(members.begin(), members.end(), std::make_pair(key, rank_));
  const int new_rank = static_cast<int>(me - members.begin());
  const Device child_device_id = child_device ? device_ : Device{};
  return std::make_unique<Communicator>(store_, concat(prefix, "/c", color), new_rank,
                                        static_cast<int>(members.size()), timeout_s_, choice_,
                                        hosts_[rank_], std::move(child_device), child_device_id);
}

void Communicator::check_usable(const char* op) const {
  std::lock_guard lock(failure_mutex_);
  if (failure_)
    fail(failure_->code, op, ": the communicator is unusable after an earlier failure: ",
         failure_->message);
}

template <class F>
void Communicator::guarded(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    if (breaks_communicator(e.code())) record_failure(e.status());
    throw;
  }
}

Backend& Communicator::backend_for(const Device& device, const char* op) {
  if (device.kind == DeviceKind::kCPU) {
    if (!host_backend_)
      invalid_argument(op, ": CPU tensors on a communicator of backend '",
                       backend_choice_name(choice_),
                       "', which takes CUDA tensors; init with backend 'auto' or 'shm' for them");
    return *host_backend_;
  }
  std::lock_guard lock(device_mutex_);
  if (device_backend_) {
    device_backend_->check_device(op, device);
    return *device_backend_;
  }
  // Collective: every rank's first CUDA collective is this one.
  guarded([&] {
    device_backend_ = make_device_backend(
        choice_, Peers{*store_, name_, rank_, size_, timeout_s_, hosts_}, device, op,
        device_attempts_++);
  });
  device_ = device;
  return *device_backend_;
}

std::shared_ptr<Work> Communicator::run(const char* op, const Device& device, bool async,
                                        void* stream, Signature signature, Body body) {
  check_usable(op);
  Backend& backend = backend_for(device, op);
  OpContext ctx{OpLabel{op, next_seq_++}, std::move(signature), nullptr, nullptr};
  if (backend.completion() == Completion::kOnDevice) {
    ctx.stream = stream;
    if (async) {
      ctx.work = std::make_shared<Work>();
      ctx.work->set_canceller([this] { abort(); });
    }
    guarded([&] { body(backend, ctx); });
    return ctx.work;
  }
  if (!async && (!progress_ || progress_->outstanding() == 0)) {
    execute(ctx, backend, body);
    return nullptr;
  }
  auto work = std::make_shared<Work>();
  // A wait given up (interrupted) aborts the communicator: the collective
  // then ends at once here and on the peers. Every Work has ended before
  // the communicator is destroyed (its destructor drains them).
  work->set_canceller([this] { abort(); });
  if (!progress_) progress_ = std::make_unique<ProgressThread>();
  progress_->submit([this, ctx = std::move(ctx), &backend, body = std::move(body), work] {
    try {
      execute(ctx, backend, body);
      work->complete(Status::Ok());
    } catch (const Error& e) {
      work->complete(e.status());
    } catch (const std::exception& e) {
      work->complete(
          {StatusCode::kInternal, concat(ctx.label.name, " #", ctx.label.seq, ": ", e.what())});
    }
  });
  if (async) return work;
  // A blocking call behind pending asynchronous ones: each of them ends
  // within its own timeout, so this wait is bounded too.
  work->wait_interruptibly(op);
  if (const Status status = work->status(); !status.ok()) throw_status(status);
  return nullptr;
}

void Communicator::execute(const OpContext& ctx, Backend& backend, const Body& body) {
  std::lock_guard lock(execute_mutex_);
  check_usable(ctx.label.name);
  guarded([&] { body(backend, ctx); });
}

void Communicator::record_failure(const Status& status) {
  std::lock_guard lock(failure_mutex_);
  if (!failure_) failure_ = status;
}

void Communicator::abort() noexcept {
  record_failure({StatusCode::kAborted, concat("rank ", rank_, " aborted the communicator")});
  const Status cause{StatusCode::kRemote, concat("rank ", rank_, " called abort")};
  if (host_backend_) host_backend_->abort(cause);
  std::lock_guard lock(device_mutex_);
  if (device_backend_) device_backend_->abort(cause);
}

// ---- collectives: validate everything, then communicate --------------------

std::shared_ptr<Work> Communicator::all_reduce(const TensorView& send, const TensorView& recv,
                                               ReduceOp op, bool async, void* stream) {
  check_same_device_and_dtype("all_reduce", send, recv);
  check_reduce_op(op, send.dtype);
  if (recv.numel != send.numel)
    invalid_argument("all_reduce: recv holds ", recv.numel, " elements, send holds ", send.numel);
  return run("all_reduce", send.device, async, stream,
             Signature{int(send.dtype), int(op), -1, send.shape},
             [send, recv, op](Backend& b, const OpContext& ctx) {
               b.all_reduce(ctx, send.data, recv.data, static_cast<std::size_t>(send.numel),
                            send.dtype, op);
             });
}

std::shared_ptr<Work> Communicator::all_gather(const TensorView& send, const TensorView& recv,
                                               bool async, void* stream) {
  check_same_device_and_dtype("all_gather", send, recv);
  if (recv.numel != send.numel * size_)
    invalid_argument("all_gather: recv holds ", recv.numel, " elements, expected ", size_, " x ",
                     send.numel, " = ", send.numel * size_);
  return run("all_gather", send.device, async, stream,
             Signature{int(send.dtype), -1, -1, send.shape},
             [send, recv](Backend& b, const OpContext& ctx) {
               b.all_gather(ctx, send.data, recv.data, send.nbytes());
             });
}

std::shared_ptr<Work> Communicator::reduce_scatter(const TensorView& send, const TensorView& recv,
                                                   ReduceOp op, bool async, void* stream) {
  check_same_device_and_dtype("reduce_scatter", send, recv);
  check_reduce_op(op, send.dtype);
  if (send.numel != recv.numel * size_)
    invalid_argument("reduce_scatter: send holds ", send.numel, " elements, expected ", size_,
                     " x ", recv.numel, " = ", recv.numel * size_);
  return run("reduce_scatter", send.device, async, stream,
             Signature{int(send.dtype), int(op), -1, send.shape},
             [send, recv, op](Backend& b, const OpContext& ctx) {
               b.reduce_scatter(ctx, send.data, recv.data, static_cast<std::size_t>(recv.numel),
                                send.dtype, op);
             });
}

std::shared_ptr<Work> Communicator::broadcast(const TensorView& send, const TensorView& recv,
                                              int root, bool async, void* stream) {
  if (root < 0 || root >= size_)
    invalid_argument("broadcast: root ", root, " is outside [0, ", size_, ")");
  check_same_device_and_dtype("broadcast", send, recv);
  if (recv.numel != send.numel)
    invalid_argument("broadcast: recv holds ", recv.numel, " elements, send holds ", send.numel);
  return run("broadcast", recv.device, async, stream,
             Signature{int(recv.dtype), -1, root, recv.shape},
             [send, recv, root](Backend& b, const OpContext& ctx) {
               b.broadcast(ctx, send.data, recv.data, recv.nbytes(), root);
             });
}

std::shared_ptr<Work> Communicator::barrier(bool async) {
  // On the host backend; a communicator with none (nccl only) synchronises
  // through its device backend, on the device it uses, or else the one of
  // its local rank (one device per local rank, as launchers arrange).
  Device device;
  if (!host_backend_) {
    std::lock_guard lock(device_mutex_);
    device = device_backend_ ? device_ : Device{DeviceKind::kCUDA, local_rank_};
  }
  return run("barrier", device, async, nullptr, Signature{},
             [](Backend& b, const OpContext& ctx) { b.barrier(ctx); });
}

std::shared_ptr<Work> Communicator::all_reduce_multi(std::vector<TensorView> tensors, ReduceOp op,
                                                     bool async, void* stream) {
  const Device device = tensors.empty() ? Device{} : tensors.front().device;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorView& t = tensors[i];
    if (!(t.device == device))
      invalid_argument("all_reduce_multi: tensor ", i, " is on ", device_text(t.device),
                       " but tensor 0 is on ", device_text(device));
    check_reduce_op(op, t.dtype);
  }
  Signature signature{-1, int(op), -1, Shape{}, layout_digest(tensors)};
  return run("all_reduce_multi", device, async, stream, std::move(signature),
             [tensors = std::move(tensors), op](Backend& b, const OpContext& ctx) {
               b.all_reduce_multi(ctx, tensors, op);
             });
}

}  // namespace concord
