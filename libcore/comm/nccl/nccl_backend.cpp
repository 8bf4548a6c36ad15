#include "comm/nccl/nccl_backend.hpp"

#include <string>

#include "base/format.hpp"
#include "plugin/cuda_plugin.hpp"

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

}  // namespace

std::string NcclBackend::make_unique_id() {
  const plugin::NcclApi& api = plugin::nccl();
  std::string id(plugin::kUniqueIdBytes, '\0');
  plugin::check(api.unique_id(reinterpret_cast<unsigned char*>(id.data())), api.last_error,
                "nccl");
  return id;
}

std::unique_ptr<NcclBackend> NcclBackend::join(const std::string& unique_id, int rank, int size,
                                               int device, double timeout_s) {
  const plugin::NcclApi& api = plugin::nccl();
  if (unique_id.size() != plugin::kUniqueIdBytes)
    fail(StatusCode::kInternal, "nccl: the unique id has ", unique_id.size(), " bytes, expected ",
         plugin::kUniqueIdBytes);
  void* comm = nullptr;
  plugin::check(api.comm_create(reinterpret_cast<const unsigned char*>(unique_id.data()), size,
                                rank, device, timeout_s, &comm),
                api.last_error, "nccl");
  return std::unique_ptr<NcclBackend>(new NcclBackend(api, comm, device));
}

NcclBackend::NcclBackend(const plugin::NcclApi& api, void* comm, int device)
    : api_(api), comm_(comm), device_(device) {}

NcclBackend::~NcclBackend() { api_.comm_destroy(comm_); }

std::unique_ptr<NcclBackend> NcclBackend::split(int color, int key) {
  void* child = nullptr;
  plugin::check(api_.comm_split(comm_, color, key, &child), api_.last_error, "split");
  if (child == nullptr) return nullptr;
  return std::unique_ptr<NcclBackend>(new NcclBackend(api_, child, device_));
}

void NcclBackend::abort(const char* reason) noexcept { api_.comm_abort(comm_, reason); }

template <class Call>
void NcclBackend::submit(OpLabel label, const std::shared_ptr<Work>& work, Call&& call) {
  // The plugin calls complete_work exactly when the enqueue succeeded.
  auto* user = work ? new std::shared_ptr<Work>(work) : nullptr;
  const int rc = call(work ? &complete_work : plugin::Completion{nullptr}, user);
  if (rc != 0) {
    delete user;
    plugin::check(rc, api_.last_error, label.name);
  }
}

void NcclBackend::all_reduce(OpLabel label, const void* send, void* recv, std::size_t count,
                             DType dtype, ReduceOp op, Stream stream,
                             const std::shared_ptr<Work>& work) {
  submit(label, work, [&](plugin::Completion done, void* user) {
    return api_.all_reduce(comm_, label.name, label.seq, send, recv, count, dtype, op, stream,
                           done, user);
  });
}

void NcclBackend::all_gather(OpLabel label, const void* send, void* recv, std::size_t bytes,
                             Stream stream, const std::shared_ptr<Work>& work) {
  submit(label, work, [&](plugin::Completion done, void* user) {
    return api_.all_gather(comm_, label.name, label.seq, send, recv, bytes, stream, done, user);
  });
}

void NcclBackend::reduce_scatter(OpLabel label, const void* send, void* recv,
                                 std::size_t recv_count, DType dtype, ReduceOp op, Stream stream,
                                 const std::shared_ptr<Work>& work) {
  submit(label, work, [&](plugin::Completion done, void* user) {
    return api_.reduce_scatter(comm_, label.name, label.seq, send, recv, recv_count, dtype, op,
                               stream, done, user);
  });
}

void NcclBackend::broadcast(OpLabel label, const void* send, void* recv, std::size_t bytes,
                            int root, Stream stream, const std::shared_ptr<Work>& work) {
  submit(label, work, [&](plugin::Completion done, void* user) {
    return api_.broadcast(comm_, label.name, label.seq, send, recv, bytes, root, stream, done,
                          user);
  });
}

void NcclBackend::all_reduce_group(OpLabel label, const std::vector<TensorView>& tensors,
                                   ReduceOp op, Stream stream, const std::shared_ptr<Work>& work) {
  std::vector<void*> buffers;
  std::vector<std::size_t> counts;
  std::vector<DType> dtypes;
  for (const TensorView& t : tensors) {
    buffers.push_back(t.data);
    counts.push_back(static_cast<std::size_t>(t.numel));
    dtypes.push_back(t.dtype);
  }
  submit(label, work, [&](plugin::Completion done, void* user) {
    return api_.all_reduce_group(comm_, label.name, label.seq, buffers.data(), counts.data(),
                                 dtypes.data(), tensors.size(), op, stream, done, user);
  });
}

}  // namespace concord
