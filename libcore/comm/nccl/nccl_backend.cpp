#include "comm/nccl/nccl_backend.hpp"

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "base/format.hpp"
#include "comm/backends.hpp"
#include "plugin/cuda_plugin.hpp"
#include "rendezvous/store.hpp"

namespace concord {
namespace {

// The plugin calls this once an operation given a Work has ended; `user`
// owns a reference to the Work.
void complete_work(void* user, int status, const char* message) {
  auto* work = static_cast<std::shared_ptr<Work>*>(user);
  (*work)->complete(status == 0 ? Status::Ok()
                                : Status{static_cast<StatusCode>(status), message});
  delete work;
}

std::string make_unique_id(const plugin::NcclApi& api) {
  std::string id(plugin::kUniqueIdBytes, '\0');
  plugin::check(api.unique_id(reinterpret_cast<unsigned char*>(id.data())), api.last_error,
                "nccl");
  return id;
}

}  // namespace

std::unique_ptr<NcclBackend> NcclBackend::create(const Peers& peers, int device, const char* op,
                                                 std::uint64_t attempt) {
  // Checked before the rendezvous, so that ranks without a usable device
  // fail at once instead of waiting for each other.
  plugin::require_device(device, /*need_nccl=*/true, concat(op, ": nccl").c_str());
  const plugin::NcclApi& api = plugin::nccl();
  // A key per attempt: after a failed one (no device, say) a later attempt
  // must not read the id of the earlier. The store is held only for this.
  const std::string key = concat(peers.name, "/nccl/unique_id/", attempt);
  std::string id;
  if (peers.rank == 0) id = make_unique_id(api);
  {
    std::lock_guard lock(peers.store.mutex);
    if (peers.rank == 0)
      peers.store.client->set(key, id);
    else
      id = peers.store.client->get(key, std::chrono::duration<double>(peers.timeout_s));
  }
  if (id.size() != plugin::kUniqueIdBytes)
    fail(StatusCode::kInternal, "nccl: the unique id has ", id.size(), " bytes, expected ",
         plugin::kUniqueIdBytes);
  void* comm = nullptr;
  plugin::check(api.comm_create(reinterpret_cast<const unsigned char*>(id.data()), peers.size,
                                peers.rank, device, peers.timeout_s, &comm),
                api.last_error, "nccl");
  return std::unique_ptr<NcclBackend>(new NcclBackend(api, comm, device));
}

NcclBackend::NcclBackend(const plugin::NcclApi& api, void* comm, int device)
    : api_(api), comm_(comm), device_(device) {}

NcclBackend::~NcclBackend() {
  api_.comm_destroy(comm_);  // waits for enqueued work, the barriers' included
  if (barrier_buffer_ != nullptr) plugin::kernels().device_free(device_, barrier_buffer_);
}

void NcclBackend::check_device(const char* op, const Device& device) const {
  if (device.id != device_)
    invalid_argument(op, ": tensors are on cuda:", device.id, " but this communicator's nccl ",
                     "backend is on cuda:", device_,
                     "; a communicator uses one CUDA device per rank");
}

std::unique_ptr<Backend> NcclBackend::split(int color, int key) {
  void* child = nullptr;
  plugin::check(api_.comm_split(comm_, color, key, &child), api_.last_error, "split");
  if (child == nullptr) return nullptr;
  return std::unique_ptr<NcclBackend>(new NcclBackend(api_, child, device_));
}

void NcclBackend::abort(const Status& cause) noexcept {
  api_.comm_abort(comm_, cause.message.c_str());
}

template <class Call>
void NcclBackend::submit(const OpContext& ctx, Call&& call) {
  // The plugin calls complete_work exactly when the enqueue succeeded.
  auto* user = ctx.work ? new std::shared_ptr<Work>(ctx.work) : nullptr;
  const int rc = call(ctx.work ? &complete_work : plugin::Completion{nullptr}, user);
  if (rc != 0) {
    delete user;
    plugin::check(rc, api_.last_error, ctx.label.name);
  }
}

void NcclBackend::all_reduce(const OpContext& ctx, const void* send, void* recv,
                             std::size_t count, DType dtype, ReduceOp op) {
  submit(ctx, [&](plugin::Completion done, void* user) {
    return api_.all_reduce(comm_, ctx.label.name, ctx.label.seq, send, recv, count, dtype, op,
                           ctx.stream, done, user);
  });
}

void NcclBackend::all_gather(const OpContext& ctx, const void* send, void* recv,
                             std::size_t bytes) {
  submit(ctx, [&](plugin::Completion done, void* user) {
    return api_.all_gather(comm_, ctx.label.name, ctx.label.seq, send, recv, bytes, ctx.stream,
                           done, user);
  });
}

void NcclBackend::reduce_scatter(const OpContext& ctx, const void* send, void* recv,
                                 std::size_t count, DType dtype, ReduceOp op) {
  submit(ctx, [&](plugin::Completion done, void* user) {
    return api_.reduce_scatter(comm_, ctx.label.name, ctx.label.seq, send, recv, count, dtype,
                               op, ctx.stream, done, user);
  });
}

void NcclBackend::broadcast(const OpContext& ctx, const void* send, void* recv,
                            std::size_t bytes, int root) {
  submit(ctx, [&](plugin::Completion done, void* user) {
    return api_.broadcast(comm_, ctx.label.name, ctx.label.seq, send, recv, bytes, root,
                          ctx.stream, done, user);
  });
}

void NcclBackend::barrier(const OpContext& ctx) {
  if (barrier_buffer_ == nullptr) {
    const plugin::KernelsApi& kernels = plugin::kernels();
    plugin::check(kernels.device_alloc(device_, sizeof(float), &barrier_buffer_),
                  kernels.last_error, ctx.label.name);
  }
  const auto work = ctx.work ? ctx.work : std::make_shared<Work>();
  all_reduce(OpContext{ctx.label, ctx.signature, ctx.stream, work}, barrier_buffer_,
             barrier_buffer_, 1, DType::kFloat32, ReduceOp::kSum);
  if (ctx.work) return;
  // Bounded: the watchdog fails the operation once it exceeds the timeout.
  work->wait();
  if (const Status status = work->status(); !status.ok()) throw_status(status);
}

void NcclBackend::all_reduce_multi(const OpContext& ctx, std::span<const TensorView> tensors,
                                   ReduceOp op) {
  std::vector<void*> buffers;
  std::vector<std::size_t> counts;
  std::vector<DType> dtypes;
  for (const TensorView& t : tensors) {
    buffers.push_back(t.data);
    counts.push_back(static_cast<std::size_t>(t.numel));
    dtypes.push_back(t.dtype);
  }
  submit(ctx, [&](plugin::Completion done, void* user) {
    return api_.all_reduce_group(comm_, ctx.label.name, ctx.label.seq, buffers.data(),
                                 counts.data(), dtypes.data(), tensors.size(), op, ctx.stream,
                                 done, user);
  });
}

}  // namespace concord
