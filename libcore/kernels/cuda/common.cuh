// Shared pieces of the CUDA executors (plugin side): CUDA error checking,
// the device guard, launch configuration, block reductions, and the
// multi-tensor launch scheme.
//
// Multi-tensor launches: a kernel receives a TensorTable by value as a
// __grid_constant__ parameter, so the table travels with the launch itself
// (no device buffer to fill, no host memory to keep alive) and is read in
// place from parameter space. A table lists up to kTableCapacity tensors;
// launch_tables() walks any number of tensors and makes one launch per full
// table, so a few launches cover hundreds of tensors. Inside the kernel,
// for_each_element() runs a grid-stride loop over the concatenation of the
// table's tensors.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "base/dtype.hpp"
#include "base/status.hpp"
#include "base/format.hpp"
#include "plugin/cuda_errors.hpp"
#include "plugin/cuda_plugin_abi.hpp"
#include "plugin/plugin_errors.hpp"

namespace concord::cuda_exec {

// ---- errors and devices -------------------------------------------------------

using plugin::check_cuda;
using plugin::DeviceGuard;

// After a launch: launch errors (bad configuration, no kernel image for the
// device) show up here, not at the <<< >>> itself.
inline void check_launch(const char* kernel) {
  check_cuda(cudaGetLastError(), (std::string("launching ") + kernel).c_str());
}

inline cudaStream_t to_cuda(plugin::Stream stream) { return static_cast<cudaStream_t>(stream); }

[[noreturn]] inline void unsupported_dtype(const char* kernel, DType dtype) {
  invalid_argument(kernel, ": dtype ", dtype_name(dtype), " is not supported here");
}

// Raises unless every tensor is floating: checked before the first launch,
// so a call that fails launches nothing.
inline void require_floating(const char* kernel, const plugin::DeviceTensor* tensors,
                             std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (!dtype_is_floating(tensors[i].dtype)) unsupported_dtype(kernel, tensors[i].dtype);
}

// ---- launch configuration -------------------------------------------------------

inline constexpr int kThreads = 256;  // threads per block; a multiple of the warp size

// Blocks for a grid-stride loop over `work` items on `device` (the current
// device): one thread per item up to what keeps every multiprocessor full.
inline unsigned blocks_for(std::int64_t work, std::int32_t device) {
  int sms = 0;
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
             "cudaDeviceGetAttribute(MultiProcessorCount)");
  const std::int64_t full = static_cast<std::int64_t>(std::max(sms, 1)) * (2048 / kThreads);
  const std::int64_t needed = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::max<std::int64_t>(1, std::min(needed, full)));
}

// ---- multi-tensor tables -----------------------------------------------------------

inline constexpr int kTableCapacity = 64;

// kLists parallel pointers per tensor (e.g. param, grad, exp_avg, exp_avg_sq)
// and the running element count: tensor t holds elements
// [end[t - 1], end[t]) of the table's concatenation (end[-1] = 0). At most
// 64 * (8 * 4 + 8) + 8 bytes, well inside the 4 KiB of kernel parameters.
template <int kLists>
struct TensorTable {
  void* data[kTableCapacity][kLists];
  std::int64_t end[kTableCapacity];
  int count;
};

template <int kLists>
struct TableEntry {
  void* data[kLists];
  std::int64_t numel;
};

// Fills tables from tensors 0..n-1 and calls launch(table, total_elements)
// for each full table and for the rest. select(i, entry) fills `entry` for
// tensor i and returns whether tensor i belongs to this launch; empty
// tensors are left out, so launch() never sees an empty table.
template <int kLists, class Select, class Launch>
void launch_tables(std::size_t n, Select&& select, Launch&& launch) {
  TensorTable<kLists> table{};
  std::int64_t total = 0;
  for (std::size_t i = 0; i < n; ++i) {
    TableEntry<kLists> entry{};
    if (!select(i, entry) || entry.numel <= 0) continue;
    for (int l = 0; l < kLists; ++l) table.data[table.count][l] = entry.data[l];
    total += entry.numel;
    table.end[table.count] = total;
    if (++table.count == kTableCapacity) {
      launch(table, total);
      table.count = 0;
      total = 0;
    }
  }
  if (table.count > 0) launch(table, total);
}

#if defined(__CUDACC__)

// Calls body(t, j) for element j of tensor t of the table, for every element
// of every tensor, spread over the whole grid. The element index only grows
// within a thread, so the tensor index only moves forward.
template <int kLists, class Body>
__device__ __forceinline__ void for_each_element(const TensorTable<kLists>& table, Body&& body) {
  const std::int64_t total = table.end[table.count - 1];
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  int t = 0;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < total; i += stride) {
    while (i >= table.end[t]) ++t;  // i < total = end[count - 1], so t < count
    const std::int64_t begin = t == 0 ? 0 : table.end[t - 1];
    body(t, i - begin);
  }
}

// The index of this thread in a grid-stride loop, and the stride.
__device__ __forceinline__ std::int64_t grid_first() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t grid_stride() {
  return static_cast<std::int64_t>(gridDim.x) * blockDim.x;
}

// ---- block reductions ----------------------------------------------------------------

struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};

// Combines `value` of every thread of the block with op (identity: the
// value that leaves any other unchanged); the result is valid in thread 0.
// Every thread of the block must call it (it synchronises), and blockDim.x
// must be a multiple of 32. It may be called again right after: it ends
// with a barrier, so its scratch is free again.
template <typename T, class Op>
__device__ T block_reduce(T value, T identity, Op op) {
  __shared__ T partial[32];
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  for (int offset = 16; offset > 0; offset >>= 1)
    value = op(value, __shfl_down_sync(0xFFFFFFFFu, value, offset));
  if (lane == 0) partial[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < (blockDim.x >> 5) ? partial[lane] : identity;
    for (int offset = 16; offset > 0; offset >>= 1)
      value = op(value, __shfl_down_sync(0xFFFFFFFFu, value, offset));
  }
  __syncthreads();
  return value;
}

// *cell += amount for an int64 counter (two's complement: the unsigned
// addition is the signed one).
__device__ __forceinline__ void atomic_add_int64(std::int64_t* cell, std::uint64_t amount) {
  atomicAdd(reinterpret_cast<unsigned long long*>(cell), static_cast<unsigned long long>(amount));
}

#endif  // __CUDACC__

}  // namespace concord::cuda_exec
