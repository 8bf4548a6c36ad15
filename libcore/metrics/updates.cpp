#include "metrics/updates.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "base/format.hpp"
#include "kernels/cpu/clones.hpp"
#include "kernels/cuda/launch.hpp"
#include "kernels/codec.hpp"
#include "kernels/dispatch.hpp"
#include "kernels/front.hpp"
#include "kernels/metric_functors.hpp"

namespace concord::metrics {
namespace {

using kernels::device_str;

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
const typename C::Storage* typed(const TensorView& t) {
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
void decode(const TensorView& t, std::int64_t begin, std::int64_t n, Out* out) {
  visit_dtype(t.dtype, [&](auto tag) {
    using C = Codec<decltype(tag)::value>;
    decode_span<C>(typed<C>(t) + begin, n, out);
  });
}

// An element as stored, floats in the shortest form of their own precision.
std::string element_str(const TensorView& t, std::int64_t index) {
  return visit_dtype(t.dtype, [&](auto tag) {
    using C = Codec<decltype(tag)::value>;
    return number_str(C::load(typed<C>(t)[index]));
  });
}

// ---- validation ------------------------------------------------------------

constexpr const char* kLabelDTypes = "int8, int32, int64, uint8 or bool";
constexpr const char* kScoreDTypes = "float16, bfloat16, float32 or float64";

void check_label_dtype(const char* op, const char* role, const TensorView& t) {
  if (dtype_is_floating(t.dtype))
    invalid_argument(op, ": ", role, " has dtype ", dtype_name(t.dtype),
                     ", expected integer labels (", kLabelDTypes, ")");
}

void check_score_dtype(const char* op, const char* role, const TensorView& t) {
  if (!dtype_is_floating(t.dtype))
    invalid_argument(op, ": ", role, " has dtype ", dtype_name(t.dtype),
                     ", expected scores (", kScoreDTypes, ")");
}

void check_dtype(const char* op, const char* role, const TensorView& t, DType expected) {
  if (t.dtype != expected)
    invalid_argument(op, ": ", role, " has dtype ", dtype_name(t.dtype), ", expected ",
                     dtype_name(expected));
}

void check_shape(const char* op, const char* role, const TensorView& t,
                 const Shape& expected, const char* why = "") {
  if (t.shape != expected)
    invalid_argument(op, ": ", role, " has shape ", t.shape.str(), ", expected ",
                     expected.str(), why);
}

// Every input must sit with the state; the state's device picks the
// executor (on_cuda).
void check_devices(const char* op, const char* state_role, const TensorView& state,
                   std::initializer_list<std::pair<const char*, const TensorView*>> inputs) {
  for (const auto& [role, input] : inputs)
    if (input->device != state.device)
      invalid_argument(op, ": ", role, " is on ", device_str(input->device), " but ",
                       state_role, " is on ", device_str(state.device),
                       "; pass tensors on one device");
}

bool on_cuda(const TensorView& state) { return state.device.kind == DeviceKind::kCUDA; }

void check_threshold(const char* op, double threshold) {
  if (std::isnan(threshold)) invalid_argument(op, ": threshold is nan, expected a number");
}

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
void check_block(const char* op, const char* role, const TensorView& t, std::int64_t begin,
                 std::int64_t n, const T* values, Valid valid, Expected expected,
                 std::int64_t row_length = 0) {
  if (all_valid(values, n, valid)) return;
  std::int64_t i = 0;
  while (valid(values[i])) ++i;
  invalid_argument(op, ": ", role, " holds ", element_str(t, begin + i), " at index ",
                   index_str(begin + i, row_length), ", ", expected());
}

void check_binary_labels(const char* op, const char* role, const TensorView& t,
                         std::int64_t begin, std::int64_t n, const std::int64_t* labels,
                         std::int64_t row_length = 0) {
  check_block(
      op, role, t, begin, n, labels, [](std::int64_t v) { return label_in_range(v, 2); },
      [] { return "expected 0 or 1"; }, row_length);
}

void check_class_labels(const char* op, const char* role, const TensorView& t,
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
void argmax_rows(const TensorView& scores, std::int64_t num_classes, std::int64_t begin,
                 std::int64_t n, std::int64_t* out) {
  const auto* rows = typed<C>(scores) + begin * num_classes;
  const std::int64_t row_bytes = num_classes * sizeof(typename C::Storage);
  const std::int64_t group =
      std::clamp(kArgmaxGroupBytes / row_bytes, kArgmaxGroupMin, kArgmaxGroupMax);
  for (std::int64_t r = 0; r < n; r += group)
    argmax_group<C>(rows + r * num_classes, static_cast<std::int32_t>(num_classes),
                        std::min(group, n - r), out + r);
}

void confusion_matrix_cpu(std::int64_t* cells, const std::int64_t num_classes,
                          const TensorView& preds, const TensorView& target) {
  constexpr const char* op = "confusion_matrix";
  const bool scores = preds.shape.ndim() == 2;
  // num_classes by value: a reference could alias the cells written below,
  // which would reload it for every sample.
  add_blocks(target.shape[0], [&, num_classes](std::int64_t begin, std::int64_t n,
                                               std::int64_t sign) {
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
    for (std::int64_t i = 0; i < n; ++i) cells[confusion_cell(t[i], p[i], num_classes)] += sign;
  });
}

// Positive predictions of elements [begin, begin + n): probabilities at or
// above the threshold, or 0/1 labels. row_length > 0 for 2-D preds.
void binary_preds(const char* op, const TensorView& preds, double threshold, std::int64_t begin,
                  std::int64_t n, std::int64_t* out, std::int64_t row_length = 0) {
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

void binary_confusion_cpu(std::int64_t* cells, const TensorView& preds, const TensorView& target,
                          double threshold) {
  constexpr const char* op = "binary_confusion";
  const std::int64_t n = target.shape[0];
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

void multilabel_counts_cpu(std::int64_t* cells, std::int64_t labels, const TensorView& preds,
                           const TensorView& target, double threshold) {
  constexpr const char* op = "multilabel_counts";
  const std::int64_t rows = target.shape[0];
  // Whole rows per block, so each label's counts run down a column.
  const std::int64_t rows_per_block =
      std::max<std::int64_t>(1, kBlock / std::max<std::int64_t>(labels, 1));
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
CONCORD_CPU_CLONES std::int64_t topk_hits(const TensorView& scores, std::int64_t num_classes,
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

void topk_correct_cpu(std::int64_t* cells, const TensorView& preds, const TensorView& target,
                      std::int64_t k) {
  const std::int64_t n = target.shape[0], num_classes = preds.shape[1];
  std::int64_t hits = 0;
  for (std::int64_t begin = 0; begin < n; begin += kBlock) {
    const std::int64_t m = std::min(kBlock, n - begin);
    std::int64_t t[kBlock];
    decode(target, begin, m, t);
    check_class_labels("topk_correct", "target", target, begin, m, t, num_classes);
    hits += visit_floating(preds.dtype, [&](auto tag) {
      return topk_hits<Codec<decltype(tag)::value>>(preds, num_classes, begin, m, t, k);
    });
  }
  cells[0] += hits;
  cells[1] += n;
}

void binary_histogram_cpu(std::int64_t* cells, const std::int64_t num_bins,
                          const TensorView& scores, const TensorView& target) {
  constexpr const char* op = "binary_histogram";
  add_blocks(target.shape[0], [&, num_bins](std::int64_t begin, std::int64_t n,
                                            std::int64_t sign) {
    std::int64_t t[kBlock];
    double s[kBlock];
    decode(target, begin, n, t);
    check_binary_labels(op, "target", target, begin, n, t);
    decode(scores, begin, n, s);
    check_block(op, "scores", scores, begin, n, s, in_unit_interval,
                [] { return "outside [0, 1]"; });
    for (std::int64_t i = 0; i < n; ++i)
      cells[t[i] * num_bins + histogram_bin(s[i], num_bins)] += sign;
  });
}

// Independent accumulators, so the additions of a block run in parallel
// lanes instead of one dependent chain.
constexpr std::int64_t kLanes = 8;

void weighted_sum_cpu(double* state, const TensorView& values, const TensorView* weights) {
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
void extremum_cpu(double* state, const TensorView& values, Op op) {
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

std::int64_t* cells_of(const TensorView& state) {
  return static_cast<std::int64_t*>(state.data);
}
double* values_of(const TensorView& state) { return static_cast<double*>(state.data); }

void check_extremum(const char* op, const TensorView& state, const TensorView& values) {
  check_dtype(op, "state", state, DType::kFloat64);
  check_shape(op, "state", state, {1});
  check_devices(op, "state", state, {{"values", &values}});
}

}  // namespace

// ---- validation and dispatch -----------------------------------------------

void weighted_sum(const TensorView& state, const TensorView& values, const TensorView* weights,
                  plugin::Stream stream) {
  constexpr const char* op = "weighted_sum";
  check_dtype(op, "state", state, DType::kFloat64);
  check_shape(op, "state", state, {2});
  if (weights != nullptr) {
    check_shape(op, "weights", *weights, values.shape, " to match values");
    check_devices(op, "state", state, {{"values", &values}, {"weights", weights}});
  } else {
    check_devices(op, "state", state, {{"values", &values}});
  }
  if (on_cuda(state))
    cuda::metric_weighted_sum(state, values,
                              weights != nullptr ? weights : nullptr, stream);
  else
    weighted_sum_cpu(values_of(state), values, weights);
}

void max_value(const TensorView& state, const TensorView& values, plugin::Stream stream) {
  check_extremum("max", state, values);
  if (on_cuda(state))
    cuda::metric_max(state, values, stream);
  else
    extremum_cpu(values_of(state), values, MaxSkippingNaN{});
}

void min_value(const TensorView& state, const TensorView& values, plugin::Stream stream) {
  check_extremum("min", state, values);
  if (on_cuda(state))
    cuda::metric_min(state, values, stream);
  else
    extremum_cpu(values_of(state), values, MinSkippingNaN{});
}

void confusion_matrix(const TensorView& confusion, const TensorView& preds,
                      const TensorView& target, plugin::Stream stream) {
  constexpr const char* op = "confusion_matrix";
  check_dtype(op, "confusion", confusion, DType::kInt64);
  const auto& cm = confusion.shape;
  if (cm.ndim() != 2 || cm[0] != cm[1] || cm[0] < 1)
    invalid_argument(op, ": confusion has shape ", cm.str(),
                     ", expected (C, C) with C >= 1 classes");
  const std::int64_t num_classes = cm[0];
  const auto& ps = preds.shape;
  const bool labels = ps.ndim() == 1, scores = ps.ndim() == 2 && ps[1] == num_classes;
  if (!labels && !scores)
    invalid_argument(op, ": preds has shape ", ps.str(), " but the confusion matrix is ",
                     num_classes, " x ", num_classes, ": expected (N, ", num_classes,
                     ") scores or (N,) labels");
  if (labels && dtype_is_floating(preds.dtype))
    invalid_argument(op, ": preds (N,) are labels and need an integer dtype (", kLabelDTypes,
                     "), got ", dtype_name(preds.dtype), "; pass (N, ", num_classes,
                     ") scores for an argmax");
  if (scores) check_score_dtype(op, "preds", preds);
  check_shape(op, "target", target, {ps[0]}, " to match preds");
  check_label_dtype(op, "target", target);
  check_devices(op, "confusion", confusion, {{"preds", &preds}, {"target", &target}});
  if (on_cuda(confusion))
    cuda::metric_confusion_matrix(confusion, num_classes, preds, target, stream);
  else
    confusion_matrix_cpu(cells_of(confusion), num_classes, preds, target);
}

void binary_confusion(const TensorView& confusion, const TensorView& preds,
                      const TensorView& target, double threshold, plugin::Stream stream) {
  constexpr const char* op = "binary_confusion";
  check_dtype(op, "confusion", confusion, DType::kInt64);
  check_shape(op, "confusion", confusion, {2, 2});
  if (preds.shape.ndim() != 1)
    invalid_argument(op, ": preds has shape ", preds.shape.str(),
                     ", expected (N,) probabilities or labels");
  check_shape(op, "target", target, preds.shape, " to match preds");
  check_label_dtype(op, "target", target);
  check_threshold(op, threshold);
  check_devices(op, "confusion", confusion, {{"preds", &preds}, {"target", &target}});
  if (on_cuda(confusion))
    cuda::metric_binary_confusion(confusion, preds, target, threshold, stream);
  else
    binary_confusion_cpu(cells_of(confusion), preds, target, threshold);
}

void multilabel_counts(const TensorView& counts, const TensorView& preds,
                       const TensorView& target, double threshold, plugin::Stream stream) {
  constexpr const char* op = "multilabel_counts";
  check_dtype(op, "counts", counts, DType::kInt64);
  if (counts.shape.ndim() != 2 || counts.shape[1] != 4)
    invalid_argument(op, ": counts has shape ", counts.shape.str(),
                     ", expected (L, 4): tp, fp, fn, tn per label");
  const std::int64_t labels = counts.shape[0];
  if (preds.shape.ndim() != 2 || preds.shape[1] != labels)
    invalid_argument(op, ": preds has shape ", preds.shape.str(), ", expected (N, ", labels,
                     ") to match counts ", counts.shape.str());
  check_shape(op, "target", target, preds.shape, " to match preds");
  check_label_dtype(op, "target", target);
  check_threshold(op, threshold);
  check_devices(op, "counts", counts, {{"preds", &preds}, {"target", &target}});
  if (on_cuda(counts))
    cuda::metric_multilabel_counts(counts, labels, preds, target, threshold, stream);
  else
    multilabel_counts_cpu(cells_of(counts), labels, preds, target, threshold);
}

void topk_correct(const TensorView& counts, const TensorView& preds, const TensorView& target,
                  std::int64_t k, plugin::Stream stream) {
  constexpr const char* op = "topk_correct";
  check_dtype(op, "counts", counts, DType::kInt64);
  check_shape(op, "counts", counts, {2});
  if (preds.shape.ndim() != 2 || preds.shape[1] < 1)
    invalid_argument(op, ": preds has shape ", preds.shape.str(),
                     ", expected (N, C) scores with C >= 1");
  check_score_dtype(op, "preds", preds);
  const std::int64_t num_classes = preds.shape[1];
  if (k < 1 || k > num_classes)
    invalid_argument(op, ": k is ", k, ", expected 1 <= k <= ", num_classes,
                     " (the number of classes)");
  check_shape(op, "target", target, {preds.shape[0]}, " to match preds");
  check_label_dtype(op, "target", target);
  check_devices(op, "counts", counts, {{"preds", &preds}, {"target", &target}});
  if (on_cuda(counts))
    cuda::metric_topk_correct(counts, num_classes, preds, target, k, stream);
  else
    topk_correct_cpu(cells_of(counts), preds, target, k);
}

void binary_histogram(const TensorView& histogram, const TensorView& scores,
                      const TensorView& target, plugin::Stream stream) {
  constexpr const char* op = "binary_histogram";
  check_dtype(op, "histogram", histogram, DType::kInt64);
  const auto& hs = histogram.shape;
  if (hs.ndim() != 2 || hs[0] != 2 || hs[1] < 1)
    invalid_argument(op, ": histogram has shape ", hs.str(),
                     ", expected (2, B) with B >= 1 bins");
  if (scores.shape.ndim() != 1)
    invalid_argument(op, ": scores has shape ", scores.shape.str(), ", expected (N,)");
  check_score_dtype(op, "scores", scores);
  check_shape(op, "target", target, scores.shape, " to match scores");
  check_label_dtype(op, "target", target);
  check_devices(op, "histogram", histogram, {{"scores", &scores}, {"target", &target}});
  if (on_cuda(histogram))
    cuda::metric_binary_histogram(histogram, hs[1], scores, target, stream);
  else
    binary_histogram_cpu(cells_of(histogram), hs[1], scores, target);
}

}  // namespace concord::metrics
