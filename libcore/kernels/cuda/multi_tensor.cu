// Fused multi-tensor CUDA executors: scale, pack / unpack of fusion buffers,
// sum of squares and clipping by it. The per-element arithmetic is the
// functors of kernels/pack.hpp and kernels/clip.hpp, which the CPU
// executors (kernels/cpu/multi_tensor.cpp) run as well.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/clip.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/entry_points.hpp"
#include "kernels/dispatch.hpp"
#include "kernels/pack.hpp"

namespace concord::cuda_exec {
namespace {

// ---- kernels ----------------------------------------------------------------------

// data[t] = {in, out}: out[j] = in[j] * factor converted From -> To. In
// place (scale) when in == out: each element is read, then written, by one
// thread.
template <DType From, DType To>
__global__ void __launch_bounds__(kThreads)
    cast_kernel(const __grid_constant__ TensorTable<2> table, double factor) {
  using Cast = functors::ScaledCast<From, To>;
  const Cast cast{static_cast<typename Cast::Compute>(factor)};
  for_each_element(table, [&](int t, std::int64_t j) {
    const auto* in = static_cast<const typename Cast::In*>(table.data[t][0]);
    auto* out = static_cast<typename Cast::Out*>(table.data[t][1]);
    out[j] = cast(in[j]);
  });
}

// data[t] = {in, out}: out[j] = in[j], elements of sizeof(Word) bytes.
template <typename Word>
__global__ void __launch_bounds__(kThreads)
    copy_kernel(const __grid_constant__ TensorTable<2> table) {
  for_each_element(table, [&](int t, std::int64_t j) {
    static_cast<Word*>(table.data[t][1])[j] = static_cast<const Word*>(table.data[t][0])[j];
  });
}

// data[t] = {x}: x[j] *= clip_coefficient(*sum_sq, max_norm), in the
// tensor's compute type as scale does. The coefficient is taken on the
// device, so clipping needs no host synchronisation; a coefficient of 1
// changes nothing, as a scale by 1 on the CPU.
template <DType D>
__global__ void __launch_bounds__(kThreads)
    clip_kernel(const __grid_constant__ TensorTable<1> table, const double* sum_sq,
                double max_norm) {
  const double coefficient = functors::clip_coefficient(*sum_sq, max_norm);
  if (coefficient == 1.0) return;
  using Cast = functors::ScaledCast<D, D>;
  const Cast cast{static_cast<typename Cast::Compute>(coefficient)};
  for_each_element(table, [&](int t, std::int64_t j) {
    auto* x = static_cast<typename Cast::Out*>(table.data[t][0]);
    x[j] = cast(x[j]);
  });
}

// data[t] = {x}: *result += sum of x[j]^2 in float64; one atomic add per block.
template <DType D>
__global__ void __launch_bounds__(kThreads)
    squares_kernel(const __grid_constant__ TensorTable<1> table, double* result) {
  using Storage = typename Codec<D>::Storage;
  const functors::SquareF64<D> square;
  double sum = 0.0;
  for_each_element(table, [&](int t, std::int64_t j) {
    sum += square(static_cast<const Storage*>(table.data[t][0])[j]);
  });
  sum = block_reduce(sum, 0.0, SumOp{});
  if (threadIdx.x == 0) atomicAdd(result, sum);
}

// ---- launches -----------------------------------------------------------------------

void launch_cast(DType from, DType to, const TensorTable<2>& table, std::int64_t total,
                 double factor, std::int32_t device, cudaStream_t stream) {
  visit_floating(from, [&](auto f) {
    visit_floating(to, [&](auto t) {
      cast_kernel<decltype(f)::value, decltype(t)::value>
          <<<blocks_for(total, device), kThreads, 0, stream>>>(table, factor);
    });
  });
  check_launch("cast_kernel");
}

void launch_copy(std::size_t element_bytes, const TensorTable<2>& table, std::int64_t total,
                 std::int32_t device, cudaStream_t stream) {
  const unsigned blocks = blocks_for(total, device);
  switch (element_bytes) {
    case 1: copy_kernel<std::uint8_t><<<blocks, kThreads, 0, stream>>>(table); break;
    case 2: copy_kernel<std::uint16_t><<<blocks, kThreads, 0, stream>>>(table); break;
    case 4: copy_kernel<std::uint32_t><<<blocks, kThreads, 0, stream>>>(table); break;
    case 8: copy_kernel<std::uint64_t><<<blocks, kThreads, 0, stream>>>(table); break;
    default:
      fail(StatusCode::kInternal, "copy_kernel: unexpected element size");
  }
  check_launch("copy_kernel");
}


// Between every tensor and its run of the wire (runs follow each other in
// tensor order): into the wire when to_wire, out of it otherwise. One group
// of launches per tensor dtype; the conversion rules are cpu::pack's.
void convert_all(const DeviceTensor* tensors, std::size_t n, unsigned char* wire, DType wire_dtype,
                 double factor, bool to_wire, cudaStream_t stream) {
  if (n == 0) return;
  for (std::size_t i = 0; i < n; ++i)
    if (!is_plain_copy(tensors[i].dtype, wire_dtype, factor) &&
        !(dtype_is_floating(tensors[i].dtype) && dtype_is_floating(wire_dtype)))
      unsupported_dtype(to_wire ? "pack" : "unpack", tensors[i].dtype);
  const std::int32_t device = tensors[0].device;
  DeviceGuard guard(device);
  std::vector<std::int64_t> offsets(n);  // in wire elements
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < n; ++i) {
    offsets[i] = offset;
    offset += tensors[i].numel;
  }
  const std::size_t wire_bytes = dtype_size(wire_dtype);
  for (int d = 0; d < kNumDTypes; ++d) {
    const auto dtype = static_cast<DType>(d);
    const bool copy = is_plain_copy(dtype, wire_dtype, factor);
    auto select = [&](std::size_t i, TableEntry<2>& entry) {
      if (tensors[i].dtype != dtype) return false;
      void* own = tensors[i].data;
      void* run = wire + static_cast<std::size_t>(offsets[i]) * wire_bytes;
      entry.data[0] = to_wire ? own : run;
      entry.data[1] = to_wire ? run : own;
      entry.numel = tensors[i].numel;
      return true;
    };
    launch_tables<2>(n, select, [&](const TensorTable<2>& table, std::int64_t total) {
      if (copy)
        launch_copy(dtype_size(dtype), table, total, device, stream);
      else
        launch_cast(to_wire ? dtype : wire_dtype, to_wire ? wire_dtype : dtype, table, total,
                    factor, device, stream);
    });
  }
}

// Calls launch_for(tag, table, total) for the tensors of each floating dtype
// in turn, tag naming the dtype.
template <class LaunchFor>
void per_floating_dtype(const DeviceTensor* tensors, std::size_t n, LaunchFor&& launch_for) {
  for_each_dtype(FloatingDTypes{}, [&](auto tag) {
    constexpr DType dtype = decltype(tag)::value;
    auto select = [&](std::size_t i, TableEntry<1>& entry) {
      if (tensors[i].dtype != dtype) return false;
      entry.data[0] = tensors[i].data;
      entry.numel = tensors[i].numel;
      return true;
    };
    launch_tables<1>(n, select, [&](const TensorTable<1>& table, std::int64_t total) {
      launch_for(tag, table, total);
    });
  });
}

// The device of a device pointer (for calls with no tensor to tell it), or
// -1 when the runtime does not know it.
int device_of(const void* ptr) {
  cudaPointerAttributes attributes{};
  check_cuda(cudaPointerGetAttributes(&attributes, ptr), "cudaPointerGetAttributes");
  return attributes.device;
}

}  // namespace

// ---- entry points ---------------------------------------------------------------------

int scale(const DeviceTensor* tensors, std::size_t n, double factor, Stream stream) noexcept {
  return plugin::guarded([&] {
    if (n == 0 || factor == 1.0) return;  // as cpu::scale: a factor of 1 writes nothing
    require_floating("scale", tensors, n);
    const std::int32_t device = tensors[0].device;
    DeviceGuard guard(device);
    for_each_dtype(FloatingDTypes{}, [&](auto tag) {
      constexpr DType dtype = decltype(tag)::value;
      auto select = [&](std::size_t i, TableEntry<2>& entry) {
        if (tensors[i].dtype != dtype) return false;
        entry.data[0] = entry.data[1] = tensors[i].data;
        entry.numel = tensors[i].numel;
        return true;
      };
      launch_tables<2>(n, select, [&](const TensorTable<2>& table, std::int64_t total) {
        launch_cast(dtype, dtype, table, total, factor, device, to_cuda(stream));
      });
    });
  });
}

int pack(const DeviceTensor* tensors, std::size_t n, void* wire, DType wire_dtype, double factor,
         Stream stream) noexcept {
  return plugin::guarded([&] {
    convert_all(tensors, n, static_cast<unsigned char*>(wire), wire_dtype, factor,
                /*to_wire=*/true, to_cuda(stream));
  });
}

int unpack(const void* wire, DType wire_dtype, const DeviceTensor* tensors, std::size_t n,
           double factor, Stream stream) noexcept {
  return plugin::guarded([&] {
    // Only read through: the table's pointers are untyped.
    auto* source = const_cast<unsigned char*>(static_cast<const unsigned char*>(wire));
    convert_all(tensors, n, source, wire_dtype, factor, /*to_wire=*/false, to_cuda(stream));
  });
}

int sum_of_squares(const DeviceTensor* tensors, std::size_t n, double* result,
                   Stream stream) noexcept {
  return plugin::guarded([&] {
    require_floating("sum_of_squares", tensors, n);
    std::int32_t device = n != 0 ? tensors[0].device : device_of(result);
    if (device < 0) check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    DeviceGuard guard(device);
    const cudaStream_t s = to_cuda(stream);
    check_cuda(cudaMemsetAsync(result, 0, sizeof(double), s), "sum_of_squares: cudaMemsetAsync");
    per_floating_dtype(tensors, n, [&](auto tag, const TensorTable<1>& table,
                                       std::int64_t total) {
      squares_kernel<decltype(tag)::value>
          <<<blocks_for(total, device), kThreads, 0, s>>>(table, result);
      check_launch("squares_kernel");
    });
  });
}

int clip_by_sum_of_squares(const DeviceTensor* tensors, std::size_t n, const double* sum_sq,
                           double max_norm, Stream stream) noexcept {
  return plugin::guarded([&] {
    if (n == 0) return;
    require_floating("clip_by_sum_of_squares", tensors, n);
    const std::int32_t device = tensors[0].device;
    DeviceGuard guard(device);
    const cudaStream_t s = to_cuda(stream);
    per_floating_dtype(tensors, n, [&](auto tag, const TensorTable<1>& table,
                                       std::int64_t total) {
      clip_kernel<decltype(tag)::value>
          <<<blocks_for(total, device), kThreads, 0, s>>>(table, sum_sq, max_norm);
      check_launch("clip_kernel");
    });
  });
}

}  // namespace concord::cuda_exec
