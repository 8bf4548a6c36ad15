// The CPU executors of the metric update kernels: blocks of samples are
// decoded through the codecs, their values checked (these checks need the
// data, so they live here rather than in metrics/updates), and counted with
// the per-sample arithmetic of kernels/metric_functors.hpp, which the CUDA
// executors run as well.
#include "kernels/cpu/metrics.hpp"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "base/format.hpp"
#include "kernels/codec.hpp"
#include "kernels/cpu/clones.hpp"
#include "kernels/dispatch.hpp"
#include "kernels/metric_functors.hpp"

namespace concord::cpu {
namespace {

using namespace concord::metrics;
using plugin::DeviceTensor;
using plugin::MetricArgs;
using plugin::MetricKernel;

// ---- messages --------------------------------------------------------------

template <typename T>
std::string number_str(T value) {
  if constexpr (std::is_floating_point_v<T>) {
    char buffer[64];
    auto end = std::to_chars(buffer, buffer + sizeof buffer, value).ptr;
    return std::string(buffer, end);
  } else {
    return std::to_string(static_cast<std::int64_t>(value));
  }
}

// ---- decoding --------------------------------------------------------------
// Elements load through their codec (kernels/codec.hpp): floats in their
// own precision (float16 and bfloat16 widen to float exactly), integers as
// themselves, bool as 0 or 1.

template <class C>
const typename C::Storage* typed(const DeviceTensor& t) {
  return static_cast<const typename C::Storage*>(t.data);
}

// Compiled for AVX2 as well (kernels/cpu/clones.hpp), as are the other hot
// loops below: AVX2 widens the float16 decodes, brings 64-bit compares to
// the label checks and doubles the lanes of the argmax.
template <class C, typename Out>
CONCORD_CPU_CLONES void decode_span(const typename C::Storage* src, std::int64_t n,
                                    Out* out) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<Out>(C::load(src[i]));
}

// Elements [begin, begin + n) of `t` converted to Out.
template <typename Out>
void decode(const DeviceTensor& t, std::int64_t begin, std::int64_t n, Out* out) {
  visit_dtype(t.dtype, [&](auto tag) {
    using C = Codec<decltype(tag)::value>;
    decode_span<C>(typed<C>(t) + begin, n, out);
  });
}

// An element as stored, floats in the shortest form of their own precision.
std::string element_str(const DeviceTensor& t, std::int64_t index) {
  return visit_dtype(t.dtype, [&](auto tag) {
    using C = Codec<decltype(tag)::value>;
    return number_str(C::load(typed<C>(t)[index]));
  });
}

// ---- value checks ---------------------------------------------------------

std::string index_str(std::int64_t flat, std::int64_t row_length) {
  if (row_length == 0) return std::to_string(flat);
  return concat("(", flat / row_length, ", ", flat % row_length, ")");
}

// One branch-free pass, which vectorises; finding which element failed is
// left to the rare failure path.
template <typename T, class Valid>
CONCORD_CPU_CLONES bool all_valid(const T* values, std::int64_t n, Valid valid) {
  unsigned bad = 0;
  for (std::int64_t i = 0; i < n; ++i) bad |= !valid(values[i]);
  return bad == 0;
}

// Throws, naming the first element of block [begin, begin + n) that `valid`
// rejects; `values` are the block's decoded elements and expected() says
// what was expected, built only on failure. row_length > 0 names elements
// of a 2-D input by (row, column).
template <typename T, class Valid, class Expected>
void check_block(const char* op, const char* role, const DeviceTensor& t, std::int64_t begin,
                 std::int64_t n, const T* values, Valid valid, Expected expected,
                 std::int64_t row_length = 0) {
  if (all_valid(values, n, valid)) return;
  std::int64_t i = 0;
  while (valid(values[i])) ++i;
  invalid_argument(op, ": ", role, " holds ", element_str(t, begin + i), " at index ",
                   index_str(begin + i, row_length), ", ", expected());
}

void check_binary_labels(const char* op, const char* role, const DeviceTensor& t,
                         std::int64_t begin, std::int64_t n, const std::int64_t* labels,
                         std::int64_t row_length = 0) {
  check_block(
      op, role, t, begin, n, labels, [](std::int64_t v) { return label_in_range(v, 2); },
      [] { return "expected 0 or 1"; }, row_length);
}

void check_class_labels(const char* op, const char* role, const DeviceTensor& t,
                        std::int64_t begin, std::int64_t n, const std::int64_t* labels,
                        std::int64_t num_classes) {
  check_block(
      op, role, t, begin, n, labels,
      [num_classes](std::int64_t v) { return label_in_range(v, num_classes); },
      [num_classes] { return concat("outside [0, ", num_classes, ")"); });
}

// ---- executors -------------------------------------------------------------

// Samples (or rows) per block: the decoded block stays in L1 between its
// check and its accumulation.
constexpr std::int64_t kBlock = 1024;

// For kernels that add straight into the state: block(begin, n, sign)
// decodes and checks one block, throwing before it adds anything, then adds
// sign * its counts. When a block fails, the blocks already added are
// subtracted again, so the state ends as it started; the common path
// therefore reads each input once, not once to check and once to count.
template <class Block>
void add_blocks(std::int64_t n, Block block) {
  std::int64_t begin = 0;
  try {
    for (; begin < n; begin += kBlock) block(begin, std::min(kBlock, n - begin), 1);
  } catch (const Error&) {
    for (std::int64_t done = 0; done < begin; done += kBlock)
      block(done, std::min(kBlock, n - done), -1);
    throw;
  }
}

// Rows run side by side in vector lanes, one class at a time: within a row
// each compare needs the best score so far, while rows are independent.
// Group sizes (measured): short rows go 64 at a time, which spans a few KiB
// read as one stream; long rows go 16 at a time, since each row is a stream
// of its own and hardware prefetchers follow only about that many.
constexpr std::int64_t kArgmaxGroupMax = 64;
constexpr std::int64_t kArgmaxGroupMin = 16;
constexpr std::int64_t kArgmaxGroupBytes = 4096;

template <class C>
CONCORD_CPU_CLONES void argmax_group(const typename C::Storage* rows,
                                     std::int32_t num_classes, std::int64_t n,
                                     std::int64_t* out) {
  typename C::Compute best[kArgmaxGroupMax];
  std::int32_t cls[kArgmaxGroupMax];
  for (std::int64_t r = 0; r < n; ++r) {
    best[r] = C::load(rows[r * num_classes]);
    cls[r] = 0;
  }
  for (std::int32_t c = 1; c < num_classes; ++c)
    for (std::int64_t r = 0; r < n; ++r)
      argmax_step(C::load(rows[r * num_classes + c]), c, best[r], cls[r]);
  for (std::int64_t r = 0; r < n; ++r) out[r] = cls[r];
}

// Predicted class of rows [begin, begin + n) of (N, C) scores, n <= kBlock.
template <class C>
void argmax_rows(const DeviceTensor& scores, std::int64_t num_classes, std::int64_t begin,
                 std::int64_t n, std::int64_t* out) {
  const auto* rows = typed<C>(scores) + begin * num_classes;
  const std::int64_t row_bytes = num_classes * sizeof(typename C::Storage);
  const std::int64_t group =
      std::clamp(kArgmaxGroupBytes / row_bytes, kArgmaxGroupMin, kArgmaxGroupMax);
  for (std::int64_t r = 0; r < n; r += group)
    argmax_group<C>(rows + r * num_classes, static_cast<std::int32_t>(num_classes),
                    std::min(group, n - r), out + r);
}

// preds (N,) labels, or (N, C) scores when floating.
void confusion_matrix(const char* op, std::int64_t* cells, const std::int64_t num_classes,
                      const DeviceTensor& preds, const DeviceTensor& target) {
  const bool scores = dtype_is_floating(preds.dtype);
  add_blocks(target.numel, [&](std::int64_t begin, std::int64_t n, std::int64_t sign) {
    std::int64_t t[kBlock], p[kBlock];
    decode(target, begin, n, t);
    check_class_labels(op, "target", target, begin, n, t, num_classes);
    if (scores) {
      visit_floating(preds.dtype, [&](auto tag) {
        argmax_rows<Codec<decltype(tag)::value>>(preds, num_classes, begin, n, p);
      });
    } else {
      decode(preds, begin, n, p);
      check_class_labels(op, "preds", preds, begin, n, p, num_classes);
    }
    // A local copy: the cells written below might alias the closure, which
    // would reload num_classes from it for every sample.
    const std::int64_t classes = num_classes;
    for (std::int64_t i = 0; i < n; ++i) cells[confusion_cell(t[i], p[i], classes)] += sign;
  });
}

// Positive predictions of elements [begin, begin + n): probabilities at or
// above the threshold, or 0/1 labels. row_length > 0 for 2-D preds.
void binary_preds(const char* op, const DeviceTensor& preds, double threshold,
                  std::int64_t begin, std::int64_t n, std::int64_t* out,
                  std::int64_t row_length = 0) {
  if (dtype_is_floating(preds.dtype)) {
    double s[kBlock];
    for (std::int64_t done = 0; done < n; done += kBlock) {
      const std::int64_t m = std::min(kBlock, n - done);
      decode(preds, begin + done, m, s);
      for (std::int64_t i = 0; i < m; ++i) out[done + i] = at_threshold(s[i], threshold);
    }
  } else {
    decode(preds, begin, n, out);
    check_binary_labels(op, "preds", preds, begin, n, out, row_length);
  }
}

// Counts of a binary problem, from which every confusion cell follows.
struct BinaryCounts {
  std::int64_t samples = 0, positive_targets = 0, positive_preds = 0, true_positives = 0;

  void add(const std::int64_t* t, const std::int64_t* p, std::int64_t n) {
    std::int64_t targets = 0, preds = 0, both = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      targets += t[i];
      preds += p[i];
      both += t[i] & p[i];
    }
    samples += n;
    positive_targets += targets;
    positive_preds += preds;
    true_positives += both;
  }
};

void binary_confusion(const char* op, std::int64_t* cells, const DeviceTensor& preds,
                      const DeviceTensor& target, double threshold) {
  const std::int64_t n = target.numel;
  BinaryCounts counts;
  for (std::int64_t begin = 0; begin < n; begin += kBlock) {
    const std::int64_t m = std::min(kBlock, n - begin);
    std::int64_t t[kBlock], p[kBlock];
    decode(target, begin, m, t);
    check_binary_labels(op, "target", target, begin, m, t);
    binary_preds(op, preds, threshold, begin, m, p);
    counts.add(t, p, m);
  }
  const std::int64_t fp = counts.positive_preds - counts.true_positives;
  const std::int64_t fn = counts.positive_targets - counts.true_positives;
  cells[0] += counts.samples - counts.true_positives - fp - fn;
  cells[1] += fp;
  cells[2] += fn;
  cells[3] += counts.true_positives;
}

void multilabel_counts(const char* op, std::int64_t* cells, std::int64_t labels,
                       const DeviceTensor& preds, const DeviceTensor& target, double threshold) {
  if (labels == 0) return;
  const std::int64_t rows = target.numel / labels;
  // Whole rows per block, so each label's counts run down a column.
  const std::int64_t rows_per_block = std::max<std::int64_t>(1, kBlock / labels);
  std::vector<std::int64_t> t(rows_per_block * labels), p(rows_per_block * labels);
  std::vector<std::int64_t> targets(labels), predicted(labels), both(labels);
  for (std::int64_t row = 0; row < rows; row += rows_per_block) {
    const std::int64_t m = std::min(rows_per_block, rows - row);
    const std::int64_t begin = row * labels, n = m * labels;
    decode(target, begin, n, t.data());
    check_binary_labels(op, "target", target, begin, n, t.data(), labels);
    binary_preds(op, preds, threshold, begin, n, p.data(), labels);
    for (std::int64_t r = 0; r < m; ++r) {
      const std::int64_t* tr = t.data() + r * labels;
      const std::int64_t* pr = p.data() + r * labels;
      for (std::int64_t l = 0; l < labels; ++l) {
        targets[l] += tr[l];
        predicted[l] += pr[l];
        both[l] += tr[l] & pr[l];
      }
    }
  }
  for (std::int64_t l = 0; l < labels; ++l) {
    const std::int64_t fp = predicted[l] - both[l], fn = targets[l] - both[l];
    std::int64_t* cell = cells + 4 * l;
    cell[0] += both[l];
    cell[1] += fp;
    cell[2] += fn;
    cell[3] += rows - both[l] - fp - fn;
  }
}

template <class C>
CONCORD_CPU_CLONES std::int64_t topk_hits(const DeviceTensor& scores, std::int64_t num_classes,
                                          std::int64_t begin, std::int64_t n,
                                          const std::int64_t* t, std::int64_t k) {
  const auto* rows = typed<C>(scores) + begin * num_classes;
  const auto classes = static_cast<std::int32_t>(num_classes);
  std::int64_t hits = 0;
  for (std::int64_t r = 0; r < n; ++r) {
    const auto* row = rows + r * num_classes;
    hits += topk_hit([row](std::int32_t c) { return C::load(row[c]); }, classes, t[r], k);
  }
  return hits;
}

void topk_correct(const char* op, std::int64_t* cells, std::int64_t num_classes,
                  const DeviceTensor& preds, const DeviceTensor& target, std::int64_t k) {
  const std::int64_t n = target.numel;
  std::int64_t hits = 0;
  for (std::int64_t begin = 0; begin < n; begin += kBlock) {
    const std::int64_t m = std::min(kBlock, n - begin);
    std::int64_t t[kBlock];
    decode(target, begin, m, t);
    check_class_labels(op, "target", target, begin, m, t, num_classes);
    hits += visit_floating(preds.dtype, [&](auto tag) {
      return topk_hits<Codec<decltype(tag)::value>>(preds, num_classes, begin, m, t, k);
    });
  }
  cells[0] += hits;
  cells[1] += n;
}

void binary_histogram(const char* op, std::int64_t* cells, const std::int64_t num_bins,
                      const DeviceTensor& scores, const DeviceTensor& target) {
  add_blocks(target.numel, [&](std::int64_t begin, std::int64_t n, std::int64_t sign) {
    std::int64_t t[kBlock];
    double s[kBlock];
    decode(target, begin, n, t);
    check_binary_labels(op, "target", target, begin, n, t);
    decode(scores, begin, n, s);
    check_block(op, "scores", scores, begin, n, s, in_unit_interval,
                [] { return "outside [0, 1]"; });
    const std::int64_t bins = num_bins;  // a local copy, as in confusion_matrix
    for (std::int64_t i = 0; i < n; ++i) cells[t[i] * bins + histogram_bin(s[i], bins)] += sign;
  });
}

// Independent accumulators, so the additions of a block run in parallel
// lanes instead of one dependent chain.
constexpr std::int64_t kLanes = 8;

// weights null: 1 for every value.
void weighted_sum(double* state, const DeviceTensor& values, const DeviceTensor* weights) {
  const std::int64_t n = values.numel;
  WeightedAccumulator lanes[kLanes];
  for (std::int64_t begin = 0; begin < n; begin += kBlock) {
    const std::int64_t m = std::min(kBlock, n - begin);
    double v[kBlock], w[kBlock];
    decode(values, begin, m, v);
    if (weights != nullptr) {
      decode(*weights, begin, m, w);
    } else {
      std::fill_n(w, m, 1.0);
    }
    std::int64_t i = 0;
    for (; i + kLanes <= m; i += kLanes)
      for (std::int64_t j = 0; j < kLanes; ++j) lanes[j].add(v[i + j], w[i + j]);
    for (; i < m; ++i) lanes[0].add(v[i], w[i]);
  }
  WeightedAccumulator total{state[0], state[1]};
  for (const auto& lane : lanes) total.merge(lane);
  state[0] = total.weighted;
  state[1] = total.weight;
}

// NaN is the identity of both ops (it is skipped), so lanes start there.
template <class Op>
void extremum(double* state, const DeviceTensor& values, Op op) {
  const std::int64_t n = values.numel;
  double lanes[kLanes];
  std::fill_n(lanes, kLanes, std::numeric_limits<double>::quiet_NaN());
  for (std::int64_t begin = 0; begin < n; begin += kBlock) {
    const std::int64_t m = std::min(kBlock, n - begin);
    double v[kBlock];
    decode(values, begin, m, v);
    std::int64_t i = 0;
    for (; i + kLanes <= m; i += kLanes)
      for (std::int64_t j = 0; j < kLanes; ++j) lanes[j] = op(v[i + j], lanes[j]);
    for (; i < m; ++i) lanes[0] = op(v[i], lanes[0]);
  }
  for (double lane : lanes) state[0] = op(lane, state[0]);
}

template <typename T>
T* state_of(const MetricArgs& args) {
  return static_cast<T*>(args.state.data);
}

}  // namespace

void metric_update(MetricKernel kernel, const MetricArgs& args) {
  const char* op = plugin::metric_kernel_name(kernel);
  const DeviceTensor& first = args.inputs[0];
  const DeviceTensor& second = args.inputs[1];
  switch (kernel) {
    case MetricKernel::kWeightedSum:
      return weighted_sum(state_of<double>(args), first, args.num_inputs > 1 ? &second : nullptr);
    case MetricKernel::kMax: return extremum(state_of<double>(args), first, MaxSkippingNaN{});
    case MetricKernel::kMin: return extremum(state_of<double>(args), first, MinSkippingNaN{});
    case MetricKernel::kConfusionMatrix:
      return confusion_matrix(op, state_of<std::int64_t>(args), args.num_classes, first, second);
    case MetricKernel::kBinaryConfusion:
      return binary_confusion(op, state_of<std::int64_t>(args), first, second, args.threshold);
    case MetricKernel::kMultilabelCounts:
      return multilabel_counts(op, state_of<std::int64_t>(args), args.num_labels, first, second,
                               args.threshold);
    case MetricKernel::kTopkCorrect:
      return topk_correct(op, state_of<std::int64_t>(args), args.num_classes, first, second,
                          args.k);
    case MetricKernel::kBinaryHistogram:
      return binary_histogram(op, state_of<std::int64_t>(args), args.num_bins, first, second);
  }
}

}  // namespace concord::cpu
