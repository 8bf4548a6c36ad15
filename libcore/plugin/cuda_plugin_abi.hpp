// The boundary between libconcord and its CUDA plugin (libconcord_cuda.so):
// the plugin holds the CUDA executors (kernels/cuda/) and the NCCL backend
// (comm/nccl/), so the CPU build runs on machines without CUDA, and
// libconcord loads it with dlopen when a CUDA tensor first appears.
//
// Both sides are built from this tree by one toolchain, but nothing C++
// crosses it that could differ between them: every entry point is a C
// function pointer taking plain structs, and no exception crosses. Each
// returns a StatusCode value (0 = ok) and leaves the message of a failure in
// the plugin's thread-local last_error(). Everything is validated by
// libconcord before it calls in; the plugin checks only what the device tells
// it (CUDA and NCCL errors, timeouts).
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/dtype.hpp"
#include "base/reduce_op.hpp"

namespace concord::plugin {

// Bumped when a table below changes; libconcord refuses a plugin of another.
inline constexpr std::uint32_t kAbiVersion = 2;

// A CUDA stream (cudaStream_t) as the caller gave it: nullptr is the legacy
// default stream, as are the special handles 1 (cudaStreamLegacy) and 2
// (cudaStreamPerThread) understood by the CUDA runtime.
using Stream = void*;

// A contiguous tensor in device memory: `numel` elements of `dtype` at
// `data` on CUDA device `device`.
struct DeviceTensor {
  void* data;
  std::int64_t numel;
  DType dtype;
  std::int32_t device;
};

// ---- kernels (kernels/cuda) --------------------------------------------------

struct SgdParams {
  double lr, momentum, weight_decay;
  int nesterov;
  std::int64_t step;
};

struct AdamWParams {
  double lr, beta1, beta2, eps, weight_decay;
  std::int64_t step;
};

// The metric kernels and their arguments (plugin/metric_kernels.hpp).
enum class MetricKernel : std::int32_t;
struct MetricArgs;

// Every multi-tensor entry point makes one launch (or a fixed few) for all
// its tensors, which are on one device; n may be 0. Arguments are validated
// (counts, dtypes, devices, options) by the caller. Nothing synchronises the
// host except where a comment says so.
struct KernelsApi {
  std::uint32_t abi_version;
  const char* (*last_error)();

  // Device memory (for bucket buffers and scratch) on `device`.
  int (*device_alloc)(std::int32_t device, std::size_t bytes, void** out);
  int (*device_free)(std::int32_t device, void* ptr);
  // Blocks the host until `stream` on `device` has finished its work.
  int (*stream_synchronize)(std::int32_t device, Stream stream);
  // Copies `bytes` from device to host memory, then waits for it (the one
  // entry point that synchronises: for results the caller returns on the host).
  int (*copy_to_host)(std::int32_t device, void* host, const void* src, std::size_t bytes,
                      Stream stream);

  // tensors[i] *= factor (floating dtypes, any mix).
  int (*scale)(const DeviceTensor* tensors, std::size_t n, double factor, Stream stream);
  // The inverse pair of kernels/cpu/multi_tensor: wire = concat(tensors[i] *
  // factor) converted to wire_dtype, and back. Same dtype rules as the CPU.
  int (*pack)(const DeviceTensor* tensors, std::size_t n, void* wire, DType wire_dtype,
              double factor, Stream stream);
  int (*unpack)(const void* wire, DType wire_dtype, const DeviceTensor* tensors, std::size_t n,
                double factor, Stream stream);
  // *result (one float64 in device memory) = sum of squares of every element
  // of every floating tensor, accumulated in float64.
  int (*sum_of_squares)(const DeviceTensor* tensors, std::size_t n, double* result, Stream stream);
  // tensors[i] *= min(1, max_norm / (sqrt(*sum_sq) + 1e-6)), with *sum_sq
  // (float64, device memory) read on the device: clipping with no host sync.
  int (*clip_by_sum_of_squares)(const DeviceTensor* tensors, std::size_t n, const double* sum_sq,
                                double max_norm, Stream stream);

  // torch.optim semantics, as kernels/optim.hpp (float32 or float64, one
  // dtype for all). momentum_buffers is null when momentum == 0.
  int (*sgd_step)(const SgdParams* options, const DeviceTensor* params, const DeviceTensor* grads,
                  const DeviceTensor* momentum_buffers, std::size_t n, Stream stream);
  int (*adamw_step)(const AdamWParams* options, const DeviceTensor* params,
                    const DeviceTensor* grads, const DeviceTensor* exp_avg,
                    const DeviceTensor* exp_avg_sq, std::size_t n, Stream stream);

  // A metric update (plugin/metric_kernels.hpp), validated by the caller:
  // the state and inputs are device memory of the dtypes and shapes the
  // kernel needs. Values the CPU would reject (labels out of range, scores
  // outside [0, 1] for the histogram) cannot raise without a host sync:
  // those samples are skipped and counted in *args->invalid (when not null).
  // A kernel this plugin does not know fails with InvalidArgument.
  int (*metric_update)(MetricKernel kernel, const MetricArgs* args, Stream stream);
};

// ---- NCCL backend (comm/nccl) -----------------------------------------------

// What the plugin finds on this machine; filled without initialising a
// CUDA context beyond the driver query.
struct Probe {
  int cuda_runtime_version;  // CUDART_VERSION the plugin was built with
  int driver_version;        // 0: no driver
  int device_count;          // 0: no device (or no driver)
  int nccl_version;          // ncclGetVersion's code; 0: NCCL not loaded
  char nccl_path[512];       // the NCCL library loaded, or ""
  char cuda_problem[512];    // why CUDA is unavailable, or ""
  char nccl_problem[1024];   // why NCCL is unavailable (what was looked for), or ""
};

inline constexpr std::size_t kUniqueIdBytes = 128;  // sizeof(ncclUniqueId)

// Called by the plugin's watchdog thread when an enqueued operation ends:
// status 0, or the code of its failure with `message`.
using Completion = void (*)(void* user, int status, const char* message);

struct NcclApi {
  std::uint32_t abi_version;
  const char* (*last_error)();
  int (*probe)(Probe* out);

  int (*unique_id)(unsigned char* id /* kUniqueIdBytes */);
  // Collective over the ranks sharing `id`: rank `rank` of `nranks` on CUDA
  // device `device`. Ends (with an abort) after timeout_s if peers miss it.
  int (*comm_create)(const unsigned char* id, int nranks, int rank, std::int32_t device,
                     double timeout_s, void** comm);
  // ncclCommSplit; *out is null for a negative color.
  int (*comm_split)(void* comm, int color, int key, void** out);
  // Waits up to the timeout for enqueued work, then destroys (or aborts).
  int (*comm_destroy)(void* comm);
  int (*comm_abort)(void* comm, const char* reason);

  // Every collective is enqueued on the communicator's stream after the
  // work already on `stream`, and `stream` waits for its result; the host
  // does not wait. The watchdog then watches it: an asynchronous NCCL error
  // or the timeout aborts the communicator, and every later call fails with
  // a message naming `op` and `seq`. When `done` is given, it is called once
  // the operation ended (or failed). Reductions on bool run as uint8
  // (max / min only); kMean is NCCL's avg.
  int (*all_reduce)(void* comm, const char* op, std::uint64_t seq, const void* send, void* recv,
                    std::size_t count, DType dtype, ReduceOp reduce, Stream stream,
                    Completion done, void* user);
  int (*all_gather)(void* comm, const char* op, std::uint64_t seq, const void* send, void* recv,
                    std::size_t bytes, Stream stream, Completion done, void* user);
  int (*reduce_scatter)(void* comm, const char* op, std::uint64_t seq, const void* send,
                        void* recv, std::size_t recv_count, DType dtype, ReduceOp reduce,
                        Stream stream, Completion done, void* user);
  int (*broadcast)(void* comm, const char* op, std::uint64_t seq, const void* send, void* recv,
                   std::size_t bytes, int root, Stream stream, Completion done, void* user);
  // In-place all-reduce of every buffer, in one NCCL group.
  int (*all_reduce_group)(void* comm, const char* op, std::uint64_t seq, void* const* buffers,
                          const std::size_t* counts, const DType* dtypes, std::size_t n,
                          ReduceOp reduce, Stream stream, Completion done, void* user);
};

}  // namespace concord::plugin

// The plugin's two exported entry points.
extern "C" {
typedef const concord::plugin::KernelsApi* (*concord_plugin_kernels_fn)(void);
typedef const concord::plugin::NcclApi* (*concord_plugin_nccl_fn)(void);
}
