// Metric update kernels on CUDA tensors (plugin/metric_kernels.hpp). The
// per-sample arithmetic is kernels/metric_functors.hpp, which the CPU
// executor (kernels/cpu/metrics.cpp) runs as well; inputs are decoded as
// there, through the codecs.
//
// Differences from the CPU, all forced by the absence of a host sync: a
// sample the CPU would reject (a label outside its range, a binary label
// other than 0 / 1, a histogram score outside [0, 1] or NaN) is skipped and
// counted in *invalid (MetricArgs) when that is given; and sums run in another order, so
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
#include "plugin/metric_kernels.hpp"

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
// One per kernel, on the inputs and scalars of its MetricArgs, on the
// state's device.

// The counts of `sample` over n samples into the state's num_cells cells.
template <class Sample>
void launch_count(const MetricArgs& a, const Sample& sample, std::int64_t n,
                  std::int64_t num_cells, cudaStream_t stream) {
  const std::int32_t device = a.state.device;
  DeviceGuard guard(device);
  const std::size_t shared =
      num_cells <= kSharedCells ? static_cast<std::size_t>(num_cells) * sizeof(unsigned long long)
                                : 0;
  count_kernel<Sample><<<blocks_for(n, device), kThreads, shared, stream>>>(
      sample, n, static_cast<std::int64_t*>(a.state.data), num_cells, a.invalid);
  check_launch("count_kernel");
}

double* state_of(const MetricArgs& a) { return static_cast<double*>(a.state.data); }

void weighted_sum(const MetricArgs& a, cudaStream_t stream) {
  const DeviceTensor& values = a.inputs[0];
  const std::int64_t n = values.numel;
  if (n == 0) return;
  DeviceGuard guard(a.state.device);
  const Input w = a.num_inputs > 1 ? input_of(a.inputs[1]) : Input{nullptr, DType::kFloat64};
  weighted_sum_kernel<<<blocks_for(n, a.state.device), kThreads, 0, stream>>>(input_of(values), w,
                                                                               n, state_of(a));
  check_launch("weighted_sum_kernel");
}

template <class Op>
void extremum(const MetricArgs& a, Op op, cudaStream_t stream) {
  const DeviceTensor& values = a.inputs[0];
  const std::int64_t n = values.numel;
  if (n == 0) return;
  DeviceGuard guard(a.state.device);
  extremum_kernel<<<blocks_for(n, a.state.device), kThreads, 0, stream>>>(input_of(values), n,
                                                                           state_of(a), op);
  check_launch("extremum_kernel");
}

// preds (N,) labels, or (N, C) scores when floating.
void confusion_matrix(const MetricArgs& a, cudaStream_t stream) {
  const DeviceTensor &preds = a.inputs[0], &target = a.inputs[1];
  const std::int64_t n = target.numel, num_classes = a.num_classes;
  if (n == 0) return;
  const std::int64_t cells = num_classes * num_classes;
  if (!dtype_is_floating(preds.dtype)) {
    const ConfusionLabels sample{input_of(preds), input_of(target), num_classes};
    return launch_count(a, sample, n, cells, stream);
  }
  visit_floating(preds.dtype, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    const ConfusionScores<D> sample{static_cast<const typename Codec<D>::Storage*>(preds.data),
                                    input_of(target), num_classes};
    launch_count(a, sample, n, cells, stream);
  });
}

void binary_confusion(const MetricArgs& a, cudaStream_t stream) {
  const DeviceTensor &preds = a.inputs[0], &target = a.inputs[1];
  if (target.numel == 0) return;
  const BinaryConfusion sample{input_of(preds), input_of(target), dtype_is_floating(preds.dtype),
                               a.threshold};
  launch_count(a, sample, target.numel, 4, stream);
}

void multilabel_counts(const MetricArgs& a, cudaStream_t stream) {
  const DeviceTensor &preds = a.inputs[0], &target = a.inputs[1];
  const std::int64_t n = target.numel;  // N * num_labels
  if (n == 0 || a.num_labels <= 0) return;
  const MultilabelCounts sample{input_of(preds), input_of(target),
                                dtype_is_floating(preds.dtype), a.threshold, a.num_labels};
  launch_count(a, sample, n, a.num_labels * 4, stream);
}

void topk_correct(const MetricArgs& a, cudaStream_t stream) {
  const DeviceTensor &preds = a.inputs[0], &target = a.inputs[1];
  if (target.numel == 0) return;
  visit_floating(preds.dtype, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    const TopkCorrect<D> sample{static_cast<const typename Codec<D>::Storage*>(preds.data),
                                input_of(target), a.num_classes, a.k};
    launch_count(a, sample, target.numel, 2, stream);
  });
}

void binary_histogram(const MetricArgs& a, cudaStream_t stream) {
  const DeviceTensor &scores = a.inputs[0], &target = a.inputs[1];
  if (target.numel == 0) return;
  const BinaryHistogram sample{input_of(scores), input_of(target), a.num_bins};
  launch_count(a, sample, target.numel, 2 * a.num_bins, stream);
}

}  // namespace

// ---- the entry point ------------------------------------------------------------------

int metric_update(MetricKernel kernel, const MetricArgs* args, Stream stream) noexcept {
  return plugin::guarded([&] {
    const MetricArgs& a = *args;
    const cudaStream_t s = to_cuda(stream);
    switch (kernel) {
      case MetricKernel::kWeightedSum: return weighted_sum(a, s);
      case MetricKernel::kMax: return extremum(a, MaxSkippingNaN{}, s);
      case MetricKernel::kMin: return extremum(a, MinSkippingNaN{}, s);
      case MetricKernel::kConfusionMatrix: return confusion_matrix(a, s);
      case MetricKernel::kBinaryConfusion: return binary_confusion(a, s);
      case MetricKernel::kMultilabelCounts: return multilabel_counts(a, s);
      case MetricKernel::kTopkCorrect: return topk_correct(a, s);
      case MetricKernel::kBinaryHistogram: return binary_histogram(a, s);
    }
    invalid_argument("metric_update: unknown metric kernel ", static_cast<int>(kernel));
  });
}

}  // namespace concord::cuda_exec
