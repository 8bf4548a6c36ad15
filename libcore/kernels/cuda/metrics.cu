// Metric update kernels on CUDA tensors (metrics/updates.hpp semantics). The
// per-sample arithmetic is kernels/metric_functors.hpp, which the CPU
// executors (metrics/updates.cpp) run as well; inputs are decoded as there
// (float16 / bfloat16 widened exactly, bool read as nonzero).
//
// Differences from the CPU, all forced by the absence of a host sync: a
// sample the CPU would reject (a label outside its range, a binary label
// other than 0 / 1, a histogram score outside [0, 1] or NaN) is skipped and
// counted in *invalid when that is given; and sums run in another order, so
// float64 sums may differ in the last bits.
//
// Counting kernels (confusion matrices, label counts, top-k, histograms)
// share one scheme: sample(i, add) decides the cells sample i adds one to.
// With few cells, each block counts in shared memory and adds its totals
// once; with many, every sample adds to global memory directly.
#include <cstddef>
#include <cstdint>
#include <limits>

#include "kernels/codec.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/entry_points.hpp"
#include "kernels/dispatch.hpp"
#include "kernels/metric_functors.hpp"

namespace concord::cuda_exec {
namespace {

using namespace concord::metrics;

// ---- decoding ----------------------------------------------------------------------
// Through the codecs (kernels/codec.hpp), as on the CPU. The dtype is the
// same for every thread, so the dtype switch does not diverge.

// Element i of any dtype as a double (weights, values, probabilities).
__device__ __forceinline__ double load_number(const void* data, DType dtype, std::int64_t i) {
  return visit_dtype(dtype, [&](auto tag) {
    using C = Codec<decltype(tag)::value>;
    return static_cast<double>(C::load(static_cast<const typename C::Storage*>(data)[i]));
  });
}

// Element i of a label dtype (floating labels are rejected by the caller;
// -1 keeps them out of every range here).
__device__ __forceinline__ std::int64_t load_label(const void* data, DType dtype, std::int64_t i) {
  return visit_dtype(dtype, [&](auto tag) -> std::int64_t {
    constexpr DType D = decltype(tag)::value;
    using C = Codec<D>;
    if constexpr (FloatingDTypes::contains(D))
      return -1;
    else
      return static_cast<std::int64_t>(C::load(static_cast<const typename C::Storage*>(data)[i]));
  });
}

// An input tensor as the kernels read it.
struct Input {
  const void* data;
  DType dtype;
};

inline Input input_of(const DeviceTensor& t) { return {t.data, t.dtype}; }

// Positive prediction of element i, or -1 when invalid: probabilities at or
// above the threshold (NaN is negative), or 0/1 labels.
__device__ __forceinline__ std::int64_t binary_pred(Input preds, bool floating, std::int64_t i,
                                                    double threshold) {
  if (floating) return at_threshold(load_number(preds.data, preds.dtype, i), threshold) ? 1 : 0;
  const std::int64_t label = load_label(preds.data, preds.dtype, i);
  return label_in_range(label, 2) ? label : -1;
}

// ---- samples of the counting kernels ---------------------------------------------
// operator()(i, add) calls add(cell) for each cell sample i counts in and
// returns true, or returns false (adding nothing) for an invalid sample.

// confusion (C, C) from label preds (N,).
struct ConfusionLabels {
  Input preds, target;
  std::int64_t num_classes;

  template <class Add>
  __device__ bool operator()(std::int64_t i, Add& add) const {
    const std::int64_t t = load_label(target.data, target.dtype, i);
    const std::int64_t p = load_label(preds.data, preds.dtype, i);
    if (!label_in_range(t, num_classes) || !label_in_range(p, num_classes)) return false;
    add(confusion_cell(t, p, num_classes));
    return true;
  }
};

// confusion (C, C) from the argmax of score rows (N, C).
template <DType D>
struct ConfusionScores {
  const typename Codec<D>::Storage* scores;
  Input target;
  std::int64_t num_classes;

  template <class Add>
  __device__ bool operator()(std::int64_t i, Add& add) const {
    const std::int64_t t = load_label(target.data, target.dtype, i);
    if (!label_in_range(t, num_classes)) return false;
    const auto* row = scores + i * num_classes;
    const std::int32_t p = argmax_row([row](std::int32_t c) { return Codec<D>::load(row[c]); },
                                      static_cast<std::int32_t>(num_classes));
    add(confusion_cell(t, p, num_classes));
    return true;
  }
};

// confusion (2, 2) of a binary problem.
struct BinaryConfusion {
  Input preds, target;
  bool preds_floating;
  double threshold;

  template <class Add>
  __device__ bool operator()(std::int64_t i, Add& add) const {
    const std::int64_t t = load_label(target.data, target.dtype, i);
    if (!label_in_range(t, 2)) return false;
    const std::int64_t p = binary_pred(preds, preds_floating, i, threshold);
    if (p < 0) return false;
    add(confusion_cell(t, p, 2));
    return true;
  }
};

// counts (L, 4) = [tp, fp, fn, tn] per label; element i of (N, L) inputs is
// label i % L.
struct MultilabelCounts {
  Input preds, target;
  bool preds_floating;
  double threshold;
  std::int64_t num_labels;

  template <class Add>
  __device__ bool operator()(std::int64_t i, Add& add) const {
    const std::int64_t t = load_label(target.data, target.dtype, i);
    if (!label_in_range(t, 2)) return false;
    const std::int64_t p = binary_pred(preds, preds_floating, i, threshold);
    if (p < 0) return false;
    const std::int64_t column = t != 0 ? (p != 0 ? 0 : 2) : (p != 0 ? 1 : 3);
    add((i % num_labels) * 4 + column);
    return true;
  }
};

// counts (2,) = [hits, samples] of top-k membership.
template <DType D>
struct TopkCorrect {
  const typename Codec<D>::Storage* scores;
  Input target;
  std::int64_t num_classes, k;

  template <class Add>
  __device__ bool operator()(std::int64_t i, Add& add) const {
    const std::int64_t t = load_label(target.data, target.dtype, i);
    if (!label_in_range(t, num_classes)) return false;
    const auto* row = scores + i * num_classes;
    if (topk_hit([row](std::int32_t c) { return Codec<D>::load(row[c]); },
                 static_cast<std::int32_t>(num_classes), t, k))
      add(0);
    add(1);
    return true;
  }
};

// histogram (2, B): row target, bin of the score.
struct BinaryHistogram {
  Input scores, target;
  std::int64_t num_bins;

  template <class Add>
  __device__ bool operator()(std::int64_t i, Add& add) const {
    const std::int64_t t = load_label(target.data, target.dtype, i);
    const double s = load_number(scores.data, scores.dtype, i);
    if (!label_in_range(t, 2) || !in_unit_interval(s)) return false;
    add(t * num_bins + histogram_bin(s, num_bins));
    return true;
  }
};

// ---- kernels ----------------------------------------------------------------------

// Cells counted per block in shared memory (16 KiB) when there are at most this many.
constexpr std::int64_t kSharedCells = 2048;

// cells[c] += the samples of [0, n) that count in c; *invalid (if given) +=
// the samples skipped.
template <class Sample>
__global__ void __launch_bounds__(kThreads)
    count_kernel(const __grid_constant__ Sample sample, std::int64_t n, std::int64_t* cells,
                 std::int64_t num_cells, std::int64_t* invalid) {
  extern __shared__ unsigned long long block_cells[];
  const bool in_block = num_cells <= kSharedCells;  // the same for every thread
  if (in_block) {
    for (std::int64_t c = threadIdx.x; c < num_cells; c += blockDim.x) block_cells[c] = 0;
    __syncthreads();
  }
  auto add = [&](std::int64_t cell) {
    if (in_block)
      atomicAdd(&block_cells[cell], 1ull);
    else
      atomic_add_int64(cells + cell, 1);
  };
  unsigned long long skipped = 0;
  for (std::int64_t i = grid_first(); i < n; i += grid_stride())
    if (!sample(i, add)) ++skipped;
  if (in_block) {
    __syncthreads();
    for (std::int64_t c = threadIdx.x; c < num_cells; c += blockDim.x)
      if (block_cells[c] != 0) atomic_add_int64(cells + c, block_cells[c]);
  }
  if (invalid != nullptr && skipped != 0) atomic_add_int64(invalid, skipped);
}

// state[0] += sum(values * weights), state[1] += sum(weights); weights.data
// null means a weight of 1 for every value.
__global__ void __launch_bounds__(kThreads)
    weighted_sum_kernel(Input values, Input weights, std::int64_t n, double* state) {
  WeightedAccumulator sum;
  for (std::int64_t i = grid_first(); i < n; i += grid_stride())
    sum.add(load_number(values.data, values.dtype, i),
            weights.data != nullptr ? load_number(weights.data, weights.dtype, i) : 1.0);
  const double weighted = block_reduce(sum.weighted, 0.0, SumOp{});
  const double weight = block_reduce(sum.weight, 0.0, SumOp{});
  if (threadIdx.x == 0) {
    atomicAdd(state, weighted);
    atomicAdd(state + 1, weight);
  }
}

// *state = op(value, *state), atomically: a compare-and-swap loop on the
// double's bits, which ends once the state needs no change or the swap
// went through.
template <class Op>
__device__ void atomic_update(double* state, double value, Op op) {
  auto* bits = reinterpret_cast<unsigned long long*>(state);
  unsigned long long seen = *reinterpret_cast<volatile unsigned long long*>(bits);
  while (true) {
    const auto next = static_cast<unsigned long long>(
        __double_as_longlong(op(value, __longlong_as_double(static_cast<long long>(seen)))));
    if (next == seen) return;
    const unsigned long long prior = atomicCAS(bits, seen, next);
    if (prior == seen) return;
    seen = prior;
  }
}

// *state = op over *state and every value, op skipping NaN (NaN is its
// identity, so a block that saw only NaN leaves the state alone).
template <class Op>
__global__ void __launch_bounds__(kThreads)
    extremum_kernel(Input values, std::int64_t n, double* state, Op op) {
  const double nan = __longlong_as_double(0x7FF8000000000000LL);
  double best = nan;
  for (std::int64_t i = grid_first(); i < n; i += grid_stride())
    best = op(load_number(values.data, values.dtype, i), best);
  best = block_reduce(best, nan, op);
  if (threadIdx.x == 0 && best == best) atomic_update(state, best, op);
}

// ---- launches -----------------------------------------------------------------------

template <class Sample>
void launch_count(const char* kernel, const Sample& sample, std::int64_t n, std::int64_t* cells,
                  std::int64_t num_cells, std::int64_t* invalid, std::int32_t device,
                  cudaStream_t stream) {
  const std::size_t shared =
      num_cells <= kSharedCells ? static_cast<std::size_t>(num_cells) * sizeof(unsigned long long)
                                : 0;
  count_kernel<Sample><<<blocks_for(n, device), kThreads, shared, stream>>>(sample, n, cells,
                                                                            num_cells, invalid);
  check_launch(kernel);
}

template <class Op>
int extremum(double* state, const DeviceTensor& values, Op op, Stream stream) noexcept {
  return plugin::guarded([&] {
    const std::int64_t n = values.numel;
    if (n == 0) return;
    DeviceGuard guard(values.device);
    extremum_kernel<<<blocks_for(n, values.device), kThreads, 0, to_cuda(stream)>>>(
        input_of(values), n, state, op);
    check_launch("extremum_kernel");
  });
}

}  // namespace

// ---- entry points ---------------------------------------------------------------------

int metric_weighted_sum(double* state, DeviceTensor values, const DeviceTensor* weights,
                        Stream stream) noexcept {
  return plugin::guarded([&] {
    const std::int64_t n = values.numel;
    if (n == 0) return;
    DeviceGuard guard(values.device);
    const Input w = weights != nullptr ? input_of(*weights) : Input{nullptr, DType::kFloat64};
    weighted_sum_kernel<<<blocks_for(n, values.device), kThreads, 0, to_cuda(stream)>>>(
        input_of(values), w, n, state);
    check_launch("weighted_sum_kernel");
  });
}

int metric_max(double* state, DeviceTensor values, Stream stream) noexcept {
  return extremum(state, values, MaxSkippingNaN{}, stream);
}

int metric_min(double* state, DeviceTensor values, Stream stream) noexcept {
  return extremum(state, values, MinSkippingNaN{}, stream);
}

int metric_confusion_matrix(std::int64_t* confusion, std::int64_t num_classes, DeviceTensor preds,
                            DeviceTensor target, std::int64_t* invalid, Stream stream) noexcept {
  return plugin::guarded([&] {
    const std::int64_t n = target.numel;
    if (n == 0) return;
    const std::int32_t device = target.device;
    DeviceGuard guard(device);
    const std::int64_t cells = num_classes * num_classes;
    if (!dtype_is_floating(preds.dtype)) {
      const ConfusionLabels sample{input_of(preds), input_of(target), num_classes};
      launch_count("confusion_matrix", sample, n, confusion, cells, invalid, device,
                   to_cuda(stream));
      return;
    }
    visit_floating(preds.dtype, [&](auto tag) {
      constexpr DType D = decltype(tag)::value;
      const ConfusionScores<D> sample{
          static_cast<const typename Codec<D>::Storage*>(preds.data), input_of(target),
          num_classes};
      launch_count("confusion_matrix", sample, n, confusion, cells, invalid, device,
                   to_cuda(stream));
    });
  });
}

int metric_binary_confusion(std::int64_t* confusion, DeviceTensor preds, DeviceTensor target,
                            double threshold, std::int64_t* invalid, Stream stream) noexcept {
  return plugin::guarded([&] {
    const std::int64_t n = target.numel;
    if (n == 0) return;
    DeviceGuard guard(target.device);
    const BinaryConfusion sample{input_of(preds), input_of(target), dtype_is_floating(preds.dtype),
                                 threshold};
    launch_count("binary_confusion", sample, n, confusion, 4, invalid, target.device,
                 to_cuda(stream));
  });
}

int metric_multilabel_counts(std::int64_t* counts, std::int64_t num_labels, DeviceTensor preds,
                             DeviceTensor target, double threshold, std::int64_t* invalid,
                             Stream stream) noexcept {
  return plugin::guarded([&] {
    const std::int64_t n = target.numel;  // N * num_labels
    if (n == 0 || num_labels <= 0) return;
    DeviceGuard guard(target.device);
    const MultilabelCounts sample{input_of(preds), input_of(target),
                                  dtype_is_floating(preds.dtype), threshold, num_labels};
    launch_count("multilabel_counts", sample, n, counts, num_labels * 4, invalid, target.device,
                 to_cuda(stream));
  });
}

int metric_topk_correct(std::int64_t* counts, std::int64_t num_classes, DeviceTensor preds,
                        DeviceTensor target, std::int64_t k, std::int64_t* invalid,
                        Stream stream) noexcept {
  return plugin::guarded([&] {
    const std::int64_t n = target.numel;
    if (n == 0) return;
    DeviceGuard guard(target.device);
    visit_floating(preds.dtype, [&](auto tag) {
      constexpr DType D = decltype(tag)::value;
      const TopkCorrect<D> sample{static_cast<const typename Codec<D>::Storage*>(preds.data),
                                  input_of(target), num_classes, k};
      launch_count("topk_correct", sample, n, counts, 2, invalid, target.device, to_cuda(stream));
    });
  });
}

int metric_binary_histogram(std::int64_t* histogram, std::int64_t num_bins, DeviceTensor scores,
                            DeviceTensor target, std::int64_t* invalid, Stream stream) noexcept {
  return plugin::guarded([&] {
    const std::int64_t n = target.numel;
    if (n == 0) return;
    DeviceGuard guard(target.device);
    const BinaryHistogram sample{input_of(scores), input_of(target), num_bins};
    launch_count("binary_histogram", sample, n, histogram, 2 * num_bins, invalid, target.device,
                 to_cuda(stream));
  });
}

}  // namespace concord::cuda_exec
