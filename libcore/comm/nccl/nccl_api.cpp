// The plugin's NCCL table (plugin/cuda_plugin_abi.hpp): plain functions over
// NcclComm, every body guarded so no exception leaves the plugin.
#include <cstring>
#include <string>
#include <vector>

#include "base/format.hpp"
#include "comm/nccl/nccl_comm.hpp"
#include "comm/nccl/nccl_library.hpp"
#include "plugin/cuda_plugin_abi.hpp"
#include "plugin/plugin_errors.hpp"

namespace concord::nccl {
namespace {

static_assert(sizeof(ncclUniqueId) == plugin::kUniqueIdBytes);

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return ncclFloat16;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat64: return ncclFloat64;
    case DType::kInt8: return ncclInt8;
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
    case DType::kUInt8: return ncclUint8;
    case DType::kBool: return ncclUint8;  // 0/1 bytes: max and min agree with bool's
  }
  invalid_argument("nccl: unsupported dtype");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kProd: return ncclProd;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMean: return ncclAvg;
  }
  invalid_argument("nccl: unsupported reduce op");
}

NcclComm& as_comm(void* comm) { return *static_cast<NcclComm*>(comm); }

void copy_text(char* out, std::size_t capacity, const std::string& text) {
  const std::size_t n = text.size() < capacity - 1 ? text.size() : capacity - 1;
  std::memcpy(out, text.data(), n);
  out[n] = '\0';
}

int probe(plugin::Probe* out) {
  return plugin::guarded([&] {
    *out = plugin::Probe{};
    const CudaState cuda = cuda_state();
    out->cuda_runtime_version = cuda.runtime_version;
    out->driver_version = cuda.driver_version;
    out->device_count = cuda.device_count;
    copy_text(out->cuda_problem, sizeof out->cuda_problem, cuda.problem);
    std::string problem;
    if (const Library* lib = library(&problem)) {
      out->nccl_version = lib->version;
      copy_text(out->nccl_path, sizeof out->nccl_path, lib->path);
    } else {
      copy_text(out->nccl_problem, sizeof out->nccl_problem, problem);
    }
  });
}

int unique_id(unsigned char* id) {
  return plugin::guarded([&] {
    const Library& lib = require_library();
    ncclUniqueId unique;
    const ncclResult_t result = lib.GetUniqueId(&unique);
    if (result != ncclSuccess)
      fail(StatusCode::kInternal, "ncclGetUniqueId failed: ", lib.GetErrorString(result));
    std::memcpy(id, &unique, sizeof unique);
  });
}

int comm_create(const unsigned char* id, int nranks, int rank, std::int32_t device,
                double timeout_s, void** out) {
  return plugin::guarded([&] {
    ncclUniqueId unique;
    std::memcpy(&unique, id, sizeof unique);
    *out = new NcclComm(unique, nranks, rank, device, timeout_s);
  });
}

int comm_split(void* comm, int color, int key, void** out) {
  return plugin::guarded([&] { *out = as_comm(comm).split(color, key); });
}

int comm_destroy(void* comm) {
  return plugin::guarded([&] { delete static_cast<NcclComm*>(comm); });
}

int comm_abort(void* comm, const char* reason) {
  return plugin::guarded([&] { as_comm(comm).abort(StatusCode::kAborted, reason); });
}

// ncclAllReduce and ncclReduceScatter share a signature: `count` is the
// element count of send for the one and of recv for the other.
using Reduction = decltype(&ncclAllReduce);

int reduction(Reduction Library::*which, void* comm, const char* op, std::uint64_t seq,
              const void* send, void* recv, std::size_t count, DType dtype, ReduceOp reduce,
              plugin::Stream stream, plugin::Completion done, void* user) {
  return plugin::guarded([&] {
    const ncclDataType_t type = nccl_type(dtype);
    const ncclRedOp_t red = nccl_op(reduce);
    const Reduction call = require_library().*which;
    as_comm(comm).enqueue(op, seq, stream, [&](ncclComm_t c, cudaStream_t s) {
      return call(send, recv, count, type, red, c, s);
    }, done, user);
  });
}

int all_reduce(void* comm, const char* op, std::uint64_t seq, const void* send, void* recv,
               std::size_t count, DType dtype, ReduceOp reduce, plugin::Stream stream,
               plugin::Completion done, void* user) {
  return reduction(&Library::AllReduce, comm, op, seq, send, recv, count, dtype, reduce, stream,
                   done, user);
}

int reduce_scatter(void* comm, const char* op, std::uint64_t seq, const void* send, void* recv,
                   std::size_t recv_count, DType dtype, ReduceOp reduce, plugin::Stream stream,
                   plugin::Completion done, void* user) {
  return reduction(&Library::ReduceScatter, comm, op, seq, send, recv, recv_count, dtype, reduce,
                   stream, done, user);
}

int all_gather(void* comm, const char* op, std::uint64_t seq, const void* send, void* recv,
               std::size_t bytes, plugin::Stream stream, plugin::Completion done, void* user) {
  return plugin::guarded([&] {
    const Library& lib = require_library();
    as_comm(comm).enqueue(op, seq, stream, [&](ncclComm_t c, cudaStream_t s) {
      return lib.AllGather(send, recv, bytes, ncclUint8, c, s);
    }, done, user);
  });
}

int broadcast(void* comm, const char* op, std::uint64_t seq, const void* send, void* recv,
              std::size_t bytes, int root, plugin::Stream stream, plugin::Completion done,
              void* user) {
  return plugin::guarded([&] {
    const Library& lib = require_library();
    as_comm(comm).enqueue(op, seq, stream, [&](ncclComm_t c, cudaStream_t s) {
      return lib.Broadcast(send, recv, bytes, ncclUint8, root, c, s);
    }, done, user);
  });
}

int all_reduce_group(void* comm, const char* op, std::uint64_t seq, void* const* buffers,
                     const std::size_t* counts, const DType* dtypes, std::size_t n,
                     ReduceOp reduce, plugin::Stream stream, plugin::Completion done,
                     void* user) {
  return plugin::guarded([&] {
    const ncclRedOp_t red = nccl_op(reduce);
    // Converted before the group opens: nothing may throw inside it.
    std::vector<ncclDataType_t> types(n);
    for (std::size_t i = 0; i < n; ++i) types[i] = nccl_type(dtypes[i]);
    const Library& lib = require_library();
    as_comm(comm).enqueue(op, seq, stream, [&](ncclComm_t c, cudaStream_t s) {
      ncclResult_t result = lib.GroupStart();
      if (result != ncclSuccess) return result;
      for (std::size_t i = 0; i < n; ++i) {
        if (counts[i] == 0) continue;
        result = lib.AllReduce(buffers[i], buffers[i], counts[i], types[i], red, c, s);
        if (result != ncclSuccess && result != ncclInProgress) {
          lib.GroupEnd();
          return result;
        }
      }
      return lib.GroupEnd();
    }, done, user);
  });
}

const plugin::NcclApi kApi = {
    plugin::kAbiVersion, plugin::last_error, probe,          unique_id,
    comm_create,         comm_split,         comm_destroy,   comm_abort,
    all_reduce,          all_gather,         reduce_scatter, broadcast,
    all_reduce_group,
};

}  // namespace
}  // namespace concord::nccl

extern "C" __attribute__((visibility("default"))) const concord::plugin::NcclApi*
concord_plugin_nccl(void) {
  return &concord::nccl::kApi;
}
