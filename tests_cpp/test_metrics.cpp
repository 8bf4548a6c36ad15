// Metric update kernels against scalar references written here from the
// metrics' definitions, on fresh random data (fixed seeds): every input
// dtype, N in {0, 1, 7, 1000, 100003} (the largest spans many blocks and is
// no multiple of any block size), C in {2, 3, 10}, incremental updates,
// exact error messages, state left untouched by a failed update, and every
// kernel once more through the C ABI.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/status.hpp"
#include "base/tensor_view.hpp"
#include "concord/concord.h"
#include "kernels/metric_functors.hpp"
#include "metrics/updates.hpp"

#include "host_tensor.hpp"
#include "metric_update.hpp"
#include "plugin_helpers.hpp"

namespace metrics = concord::metrics;
using concord::DType;
using concord::StatusCode;
using concord::TensorView;
using concord::testing::HostTensor;
using concord::testing::update_metric;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

const std::int64_t kSizes[] = {0, 1, 7, 1000, 100003};
const std::int64_t kClasses[] = {2, 3, 10};
const DType kLabelTypes[] = {DType::kInt8, DType::kInt32, DType::kInt64, DType::kUInt8};
const DType kFloatTypes[] = {DType::kFloat16, DType::kBFloat16, DType::kFloat32,
                             DType::kFloat64};
const DType kAllTypes[] = {DType::kFloat16, DType::kBFloat16, DType::kFloat32,
                           DType::kFloat64,  DType::kInt8,     DType::kInt32,
                           DType::kInt64,    DType::kUInt8,    DType::kBool};

// ---- encoding test data ------------------------------------------------------
// Test values are chosen exactly representable in every dtype they are stored
// in, so the references below compute on the very values the kernels see.

std::uint16_t fp16_bits(double v) {
  if (std::isnan(v)) return 0x7E00;
  const std::uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  if (v == 0) return sign;
  int e;
  const double f = std::frexp(std::fabs(v), &e);  // |v| = f * 2^e, f in [0.5, 1)
  const int exponent = e - 1 + 15;
  const double mantissa = (2 * f - 1) * 1024;
  if (exponent < 1 || exponent > 30 || mantissa != std::floor(mantissa))
    throw std::logic_error("test value is not a normal float16");
  return sign | static_cast<std::uint16_t>(exponent << 10) | static_cast<std::uint16_t>(mantissa);
}

std::uint16_t bf16_bits(double v) {
  const float f = static_cast<float>(v);
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if (!std::isnan(v) && (u & 0xFFFFu) != 0)
    throw std::logic_error("test value is not exact in bfloat16");
  return static_cast<std::uint16_t>(u >> 16);
}

template <typename T>
void put(std::vector<unsigned char>& bytes, std::size_t i, T value) {
  std::memcpy(bytes.data() + i * sizeof(T), &value, sizeof(T));
}

HostTensor make(DType dtype, std::vector<std::int64_t> shape, const std::vector<double>& values) {
  HostTensor a;
  a.dtype = dtype;
  a.shape = std::move(shape);
  if (static_cast<std::size_t>(a.numel()) != values.size())
    throw std::logic_error("shape and values disagree");
  a.bytes.resize(values.size() * concord::dtype_size(dtype));
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double v = values[i];
    switch (dtype) {
      case DType::kFloat16: put(a.bytes, i, fp16_bits(v)); break;
      case DType::kBFloat16: put(a.bytes, i, bf16_bits(v)); break;
      case DType::kFloat32: put(a.bytes, i, static_cast<float>(v)); break;
      case DType::kFloat64: put(a.bytes, i, v); break;
      case DType::kInt8: put(a.bytes, i, static_cast<std::int8_t>(v)); break;
      case DType::kInt32: put(a.bytes, i, static_cast<std::int32_t>(v)); break;
      case DType::kInt64: put(a.bytes, i, static_cast<std::int64_t>(v)); break;
      case DType::kUInt8: put(a.bytes, i, static_cast<std::uint8_t>(v)); break;
      case DType::kBool: put(a.bytes, i, static_cast<std::uint8_t>(v != 0)); break;
    }
  }
  return a;
}

HostTensor int64_state(std::vector<std::int64_t> shape, const std::vector<std::int64_t>& values) {
  HostTensor a;
  a.dtype = DType::kInt64;
  a.shape = std::move(shape);
  a.bytes.resize(values.size() * 8);
  std::memcpy(a.bytes.data(), values.data(), a.bytes.size());
  return a;
}

HostTensor zeros_int64(std::vector<std::int64_t> shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return int64_state(std::move(shape), std::vector<std::int64_t>(n, 0));
}

HostTensor float64_state(std::vector<double> values) {
  const auto n = static_cast<std::int64_t>(values.size());
  return make(DType::kFloat64, {n}, values);
}

// Rows [begin, end) of `a` (along dim 0) as a new array.
HostTensor rows(const HostTensor& a, std::int64_t begin, std::int64_t end) {
  HostTensor out = a;
  const std::int64_t row_bytes =
      a.shape[0] == 0 ? 0 : static_cast<std::int64_t>(a.bytes.size()) / a.shape[0];
  out.shape[0] = end - begin;
  out.bytes.assign(a.bytes.begin() + begin * row_bytes, a.bytes.begin() + end * row_bytes);
  return out;
}

// ---- random data --------------------------------------------------------------

std::vector<double> random_ints(std::mt19937_64& rng, std::int64_t n, std::int64_t lo,
                                std::int64_t hi) {
  std::uniform_int_distribution<std::int64_t> dist(lo, hi);
  std::vector<double> out(n);
  for (auto& v : out) v = static_cast<double>(dist(rng));
  return out;
}

// k / scale for integer k in [lo, hi]: with |k| < 256 exact in bfloat16 too.
std::vector<double> random_steps(std::mt19937_64& rng, std::int64_t n, std::int64_t lo,
                                 std::int64_t hi, double scale) {
  auto out = random_ints(rng, n, lo, hi);
  for (auto& v : out) v /= scale;
  return out;
}

// Scores k/64 with k in [-255, 255]: few distinct values, so rows of ten
// classes often tie.
std::vector<double> random_scores(std::mt19937_64& rng, std::int64_t n) {
  return random_steps(rng, n, -255, 255, 64.0);
}

// Probabilities k/256 in [0, 1], endpoints included.
std::vector<double> random_probs(std::mt19937_64& rng, std::int64_t n) {
  return random_steps(rng, n, 0, 256, 256.0);
}

void sprinkle_nan(std::mt19937_64& rng, std::vector<double>& values, double fraction) {
  std::bernoulli_distribution pick(fraction);
  for (auto& v : values)
    if (pick(rng)) v = kNaN;
}

// ---- references, from the definitions -----------------------------------------

// First maximum; NaN counts as the largest score (first NaN wins).
std::int64_t ref_argmax(const double* row, std::int64_t num_classes) {
  std::int64_t best = 0;
  for (std::int64_t c = 1; c < num_classes; ++c) {
    if (std::isnan(row[best])) break;
    if (std::isnan(row[c]) || row[c] > row[best]) best = c;
  }
  return best;
}

std::vector<std::int64_t> ref_confusion(std::int64_t num_classes, const std::vector<double>& preds,
                                        bool scores, const std::vector<double>& target) {
  std::vector<std::int64_t> cm(num_classes * num_classes, 0);
  for (std::size_t i = 0; i < target.size(); ++i) {
    const std::int64_t p = scores ? ref_argmax(&preds[i * num_classes], num_classes)
                                  : static_cast<std::int64_t>(preds[i]);
    cm[static_cast<std::int64_t>(target[i]) * num_classes + p] += 1;
  }
  return cm;
}

bool ref_positive(double pred, bool probabilities, double threshold) {
  return probabilities ? pred >= threshold : pred != 0;
}

std::vector<std::int64_t> ref_binary(const std::vector<double>& preds, bool probabilities,
                                     const std::vector<double>& target, double threshold) {
  std::vector<std::int64_t> cm(4, 0);
  for (std::size_t i = 0; i < target.size(); ++i)
    cm[2 * (target[i] != 0) + ref_positive(preds[i], probabilities, threshold)] += 1;
  return cm;
}

std::vector<std::int64_t> ref_multilabel(std::int64_t labels, const std::vector<double>& preds,
                                         bool probabilities, const std::vector<double>& target,
                                         double threshold) {
  std::vector<std::int64_t> counts(labels * 4, 0);
  for (std::size_t i = 0; i < target.size(); ++i) {
    const std::int64_t l = static_cast<std::int64_t>(i) % labels;
    const bool t = target[i] != 0, p = ref_positive(preds[i], probabilities, threshold);
    counts[4 * l + (t && p ? 0 : !t && p ? 1 : t && !p ? 2 : 3)] += 1;
  }
  return counts;
}

std::vector<std::int64_t> ref_topk(std::int64_t num_classes, const std::vector<double>& scores,
                                   const std::vector<double>& target, std::int64_t k) {
  std::int64_t hits = 0;
  for (std::size_t i = 0; i < target.size(); ++i) {
    const double* row = &scores[i * num_classes];
    const double mine = row[static_cast<std::int64_t>(target[i])];
    std::int64_t greater = 0;
    for (std::int64_t c = 0; c < num_classes; ++c)
      greater += (std::isnan(row[c]) && !std::isnan(mine)) || row[c] > mine;
    hits += greater < k;
  }
  return {hits, static_cast<std::int64_t>(target.size())};
}

std::vector<std::int64_t> ref_histogram(std::int64_t bins, const std::vector<double>& scores,
                                        const std::vector<double>& target) {
  std::vector<std::int64_t> h(2 * bins, 0);
  for (std::size_t i = 0; i < target.size(); ++i) {
    const auto bin = std::min<std::int64_t>(static_cast<std::int64_t>(std::floor(scores[i] * bins)),
                                            bins - 1);
    h[static_cast<std::int64_t>(target[i]) * bins + bin] += 1;
  }
  return h;
}

// ---- the kernels, through the generic front -----------------------------------

using metrics::MetricKernel;

void update(MetricKernel kernel, const TensorView& state, std::initializer_list<TensorView> inputs,
            const metrics::MetricOptions& options = {}) {
  metrics::update(kernel, state, {inputs.begin(), inputs.size()}, options);
}

void weighted_sum(const TensorView& state, const TensorView& values, const TensorView* weights) {
  if (weights != nullptr)
    update(MetricKernel::kWeightedSum, state, {values, *weights});
  else
    update(MetricKernel::kWeightedSum, state, {values});
}
void max_value(const TensorView& state, const TensorView& values) {
  update(MetricKernel::kMax, state, {values});
}
void min_value(const TensorView& state, const TensorView& values) {
  update(MetricKernel::kMin, state, {values});
}
void confusion_matrix(const TensorView& confusion, const TensorView& preds,
                      const TensorView& target) {
  update(MetricKernel::kConfusionMatrix, confusion, {preds, target});
}
void binary_confusion(const TensorView& confusion, const TensorView& preds,
                      const TensorView& target, double threshold) {
  update(MetricKernel::kBinaryConfusion, confusion, {preds, target}, {threshold, 0});
}
void multilabel_counts(const TensorView& counts, const TensorView& preds,
                       const TensorView& target, double threshold) {
  update(MetricKernel::kMultilabelCounts, counts, {preds, target}, {threshold, 0});
}
void topk_correct(const TensorView& counts, const TensorView& preds, const TensorView& target,
                  std::int64_t k) {
  update(MetricKernel::kTopkCorrect, counts, {preds, target}, {0.0, k});
}
void binary_histogram(const TensorView& histogram, const TensorView& scores,
                      const TensorView& target) {
  update(MetricKernel::kBinaryHistogram, histogram, {scores, target});
}

// ---- error checks ----------------------------------------------------------------

template <class Fn>
void require_error(Fn fn, StatusCode code, const std::string& message) {
  try {
    fn();
  } catch (const concord::Error& e) {
    CHECK(e.code() == code);
    CHECK(std::string(e.what()) == message);
    return;
  }
  FAIL("expected an error: " << message);
}

// A failed update must leave the state byte for byte as it was.
template <class Fn>
void require_invalid_untouched(HostTensor& state, Fn fn, const std::string& message) {
  const auto before = state.bytes;
  require_error(fn, StatusCode::kInvalidArgument, message);
  CHECK(state.bytes == before);
}

std::vector<std::int64_t> random_counts(std::mt19937_64& rng, std::int64_t n) {
  std::uniform_int_distribution<std::int64_t> dist(0, 1000000);
  std::vector<std::int64_t> out(n);
  for (auto& v : out) v = dist(rng);
  return out;
}

std::vector<std::int64_t> plus(std::vector<std::int64_t> a, const std::vector<std::int64_t>& b) {
  for (std::size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  return a;
}

}  // namespace

// ---- shared functors ---------------------------------------------------------------

TEST_CASE("metric functors: argmax, top-k, bins and thresholds", "[metrics]") {
  auto row_of = [](const std::vector<float>& row) {
    return [&row](std::int32_t c) { return row[c]; };
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> tie{1, 3, 3, 2};
  std::vector<float> late_nan{1, 3, nan, nan};
  std::vector<float> single{-5};
  CHECK(metrics::argmax_row(row_of(tie), 4) == 1);       // first of tied maxima
  CHECK(metrics::argmax_row(row_of(late_nan), 4) == 2);  // NaN ranks above, first NaN wins
  CHECK(metrics::argmax_row(row_of(single), 1) == 0);

  // The per-row form (for executors with a thread per row) against the
  // reference, on rows full of ties and NaN.
  std::mt19937_64 rng(11);
  const std::int64_t C = 10, n = 1000;
  auto scores = random_scores(rng, n * C);
  sprinkle_nan(rng, scores, 0.05);
  for (std::int64_t r = 0; r < n; ++r) {
    const double* row = &scores[r * C];
    CHECK(metrics::argmax_row([row](std::int32_t c) { return row[c]; }, C) == ref_argmax(row, C));
  }

  CHECK(metrics::topk_hit(row_of(tie), 4, 2, 1));   // tied with the best: nothing strictly above
  CHECK(!metrics::topk_hit(row_of(tie), 4, 3, 2));  // 3 and 3 above 2
  CHECK(metrics::topk_hit(row_of(tie), 4, 3, 3));
  CHECK(!metrics::topk_hit(row_of(late_nan), 4, 1, 2));  // two NaN rank above 3
  CHECK(metrics::topk_hit(row_of(late_nan), 4, 3, 1));   // NaN target: nothing ranks above it

  CHECK(metrics::histogram_bin(0.0, 10) == 0);
  CHECK(metrics::histogram_bin(0.1, 10) == 1);
  CHECK(metrics::histogram_bin(0.99, 10) == 9);
  CHECK(metrics::histogram_bin(1.0, 10) == 9);  // 1 joins the last bin
  CHECK(metrics::histogram_bin(1.0, 1) == 0);
  CHECK(metrics::in_unit_interval(0.0));
  CHECK(metrics::in_unit_interval(1.0));
  CHECK(!metrics::in_unit_interval(-0.0001));
  CHECK(!metrics::in_unit_interval(kNaN));

  CHECK(metrics::at_threshold(0.5, 0.5));
  CHECK(!metrics::at_threshold(std::nextafter(0.5, 0.0), 0.5));
  CHECK(!metrics::at_threshold(kNaN, 0.5));
  CHECK(metrics::label_in_range(0, 3));
  CHECK(!metrics::label_in_range(3, 3));
  CHECK(!metrics::label_in_range(-1, 3));
}

// ---- confusion_matrix ------------------------------------------------------------

TEST_CASE("confusion_matrix counts integer label predictions", "[metrics]") {
  std::mt19937_64 rng(101);
  for (std::int64_t C : kClasses)
    for (std::int64_t n : kSizes)
      for (DType pred_type : kLabelTypes)
        for (DType target_type : kLabelTypes) {
          CAPTURE(C, n, concord::dtype_name(pred_type), concord::dtype_name(target_type));
          const auto p = random_ints(rng, n, 0, C - 1), t = random_ints(rng, n, 0, C - 1);
          HostTensor preds = make(pred_type, {n}, p), target = make(target_type, {n}, t);
          const auto start = random_counts(rng, C * C);
          HostTensor cm = int64_state({C, C}, start);
          confusion_matrix(cm.view(), preds.view(), target.view());
          CHECK(cm.as<std::int64_t>() == plus(start, ref_confusion(C, p, false, t)));
        }
}

TEST_CASE("confusion_matrix takes bool labels for two classes", "[metrics]") {
  std::mt19937_64 rng(102);
  const std::int64_t n = 1000;
  const auto p = random_ints(rng, n, 0, 1), t = random_ints(rng, n, 0, 1);
  HostTensor preds = make(DType::kBool, {n}, p), target = make(DType::kBool, {n}, t);
  target.bytes[3] = 7;  // any nonzero byte is true
  auto expected_t = t;
  expected_t[3] = 1;
  HostTensor cm = zeros_int64({2, 2});
  confusion_matrix(cm.view(), preds.view(), target.view());
  CHECK(cm.as<std::int64_t>() == ref_confusion(2, p, false, expected_t));
}

TEST_CASE("confusion_matrix takes the argmax of scores, ties to the first, NaN highest",
          "[metrics]") {
  std::mt19937_64 rng(103);
  for (std::int64_t C : kClasses)
    for (std::int64_t n : kSizes)
      for (DType score_type : kFloatTypes) {
        CAPTURE(C, n, concord::dtype_name(score_type));
        auto s = random_scores(rng, n * C);
        sprinkle_nan(rng, s, 0.02);
        const auto t = random_ints(rng, n, 0, C - 1);
        HostTensor scores = make(score_type, {n, C}, s), target = make(DType::kInt64, {n}, t);
        HostTensor cm = zeros_int64({C, C});
        confusion_matrix(cm.view(), scores.view(), target.view());
        CHECK(cm.as<std::int64_t>() == ref_confusion(C, s, true, t));
      }
}

TEST_CASE("confusion_matrix argmax over many classes", "[metrics]") {
  std::mt19937_64 rng(104);
  for (std::int64_t C : {17, 100, 1000}) {
    const std::int64_t n = 333;
    CAPTURE(C);
    auto s = random_scores(rng, n * C);
    sprinkle_nan(rng, s, 0.0005);
    const auto t = random_ints(rng, n, 0, C - 1);
    HostTensor scores = make(DType::kFloat32, {n, C}, s), target = make(DType::kInt32, {n}, t);
    HostTensor cm = zeros_int64({C, C});
    confusion_matrix(cm.view(), scores.view(), target.view());
    CHECK(cm.as<std::int64_t>() == ref_confusion(C, s, true, t));
  }
}

TEST_CASE("confusion_matrix: two updates equal one on the concatenation", "[metrics]") {
  std::mt19937_64 rng(105);
  for (bool scores : {false, true}) {
    const std::int64_t C = 10, n = 100003;
    const auto p = scores ? random_scores(rng, n * C) : random_ints(rng, n, 0, C - 1);
    const auto t = random_ints(rng, n, 0, C - 1);
    HostTensor preds = scores ? make(DType::kBFloat16, {n, C}, p) : make(DType::kUInt8, {n}, p);
    HostTensor target = make(DType::kInt8, {n}, t);
    HostTensor whole = zeros_int64({C, C}), split = zeros_int64({C, C});
    confusion_matrix(whole.view(), preds.view(), target.view());
    for (auto [begin, end] : {std::pair<std::int64_t, std::int64_t>{0, 4099}, {4099, n}}) {
      HostTensor pr = rows(preds, begin, end), tr = rows(target, begin, end);
      confusion_matrix(split.view(), pr.view(), tr.view());
    }
    CHECK(split.as<std::int64_t>() == whole.as<std::int64_t>());
  }
}

TEST_CASE("confusion_matrix rejects bad shapes and dtypes with exact messages", "[metrics]") {
  HostTensor cm = zeros_int64({5, 5});
  HostTensor preds = make(DType::kInt64, {4}, {0, 1, 2, 3});
  HostTensor scores = make(DType::kFloat32, {4, 3}, std::vector<double>(12, 0.0));
  HostTensor target5 = make(DType::kInt64, {5}, {0, 1, 2, 3, 4});
  HostTensor target = make(DType::kInt64, {4}, {0, 1, 2, 3});
  auto call = [&](HostTensor& c, HostTensor& p, HostTensor& t) {
    return [&] { confusion_matrix(c.view(), p.view(), t.view()); };
  };
  require_invalid_untouched(cm, call(cm, preds, target5),
                            "confusion_matrix: target has shape (5,), expected (4,) to match "
                            "preds");
  require_invalid_untouched(cm, call(cm, scores, target),
                            "confusion_matrix: preds has shape (4, 3) but the confusion matrix is "
                            "5 x 5: expected (N, 5) scores or (N,) labels");
  HostTensor cube = make(DType::kFloat32, {1, 1, 5}, std::vector<double>(5, 0.0));
  HostTensor one = make(DType::kInt64, {1}, {0});
  require_invalid_untouched(cm, call(cm, cube, one),
                            "confusion_matrix: preds has shape (1, 1, 5) but the confusion matrix "
                            "is 5 x 5: expected (N, 5) scores or (N,) labels");
  HostTensor float_labels = make(DType::kFloat32, {4}, {0, 1, 2, 3});
  require_invalid_untouched(cm, call(cm, float_labels, target),
                            "confusion_matrix: preds (N,) are labels and need an integer dtype "
                            "(int8, int32, int64, uint8 or bool), got float32; pass (N, 5) scores "
                            "for an argmax");
  HostTensor int_scores = make(DType::kInt32, {4, 5}, std::vector<double>(20, 0.0));
  require_invalid_untouched(cm, call(cm, int_scores, target),
                            "confusion_matrix: preds has dtype int32, expected scores (float16, "
                            "bfloat16, float32 or float64)");
  HostTensor float_target = make(DType::kFloat64, {4}, {0, 1, 2, 3});
  require_invalid_untouched(cm, call(cm, preds, float_target),
                            "confusion_matrix: target has dtype float64, expected integer labels "
                            "(int8, int32, int64, uint8 or bool)");
  HostTensor rect = zeros_int64({5, 4});
  require_invalid_untouched(rect, call(rect, preds, target),
                            "confusion_matrix: confusion has shape (5, 4), expected (C, C) with C "
                            ">= 1 classes");
  HostTensor cm32 = make(DType::kInt32, {5, 5}, std::vector<double>(25, 0.0));
  require_invalid_untouched(cm32, call(cm32, preds, target),
                            "confusion_matrix: confusion has dtype int32, expected int64");
}

TEST_CASE("confusion_matrix rejects out-of-range labels and leaves the state untouched",
          "[metrics]") {
  std::mt19937_64 rng(106);
  const std::int64_t C = 5, n = 100003;
  const auto start = random_counts(rng, C * C);

  // Late in the input: the blocks before it were already counted and must be
  // taken back.
  auto t = random_ints(rng, n, 0, C - 1);
  auto p = random_ints(rng, n, 0, C - 1);
  t[77777] = 7;
  HostTensor cm = int64_state({C, C}, start);
  HostTensor preds = make(DType::kInt32, {n}, p), target = make(DType::kInt32, {n}, t);
  require_invalid_untouched(
      cm, [&] { confusion_matrix(cm.view(), preds.view(), target.view()); },
      "confusion_matrix: target holds 7 at index 77777, outside [0, 5)");

  t[77777] = 0;
  p[5000] = -1;
  HostTensor bad_preds = make(DType::kInt8, {n}, p), good_target = make(DType::kInt64, {n}, t);
  require_invalid_untouched(
      cm, [&] { confusion_matrix(cm.view(), bad_preds.view(), good_target.view()); },
      "confusion_matrix: preds holds -1 at index 5000, outside [0, 5)");

  // A bad target under scores: the argmax path rolls back as well.
  auto s = random_scores(rng, n * C);
  t[n - 1] = 255;
  HostTensor scores = make(DType::kFloat16, {n, C}, s), target_u8 = make(DType::kUInt8, {n}, t);
  require_invalid_untouched(
      cm, [&] { confusion_matrix(cm.view(), scores.view(), target_u8.view()); },
      "confusion_matrix: target holds 255 at index 100002, outside [0, 5)");
  CHECK(cm.as<std::int64_t>() == start);
}

TEST_CASE("metric updates on CUDA tensors: one device, and the CUDA plugin", "[metrics]") {
  HostTensor cm = zeros_int64({2, 2});
  HostTensor preds = make(DType::kInt64, {2}, {0, 1}), target = make(DType::kInt64, {2}, {1, 1});
  cm.device = preds.device = target.device = {kDLCUDA, 0};
  if (!concord::testing::cuda_kernels_run_here()) {
    // Host memory posing as CUDA tensors must never reach a GPU; without a
    // usable plugin the update is unavailable, after validation passed.
    try {
      confusion_matrix(cm.view(), preds.view(), target.view());
      FAIL("expected an error");
    } catch (const concord::Error& e) {
      CHECK(e.code() == StatusCode::kUnavailable);
      CHECK(std::string(e.what()).rfind("confusion_matrix: ", 0) == 0);
    }
  }
  // Validation runs for CUDA tensors as for CPU ones.
  HostTensor scores = make(DType::kFloat32, {2, 3}, {0, 1, 2, 3, 4, 5});
  scores.device = cm.device;
  require_error([&] { confusion_matrix(cm.view(), scores.view(), target.view()); },
                StatusCode::kInvalidArgument,
                "confusion_matrix: preds has shape (2, 3) but the confusion matrix is 2 x 2: "
                "expected (N, 2) scores or (N,) labels");
  target.device = {kDLCPU, 0};
  require_error([&] { confusion_matrix(cm.view(), preds.view(), target.view()); },
                StatusCode::kInvalidArgument,
                "confusion_matrix: target is on cpu but confusion is on cuda:0; pass tensors on "
                "one device");
  HostTensor state = float64_state({0, 0});
  HostTensor values = make(DType::kFloat32, {1}, {1});
  values.device = {kDLCUDA, 1};
  require_error([&] { weighted_sum(state.view(), values.view(), nullptr); },
                StatusCode::kInvalidArgument,
                "weighted_sum: values is on cuda:1 but state is on cpu; pass tensors on one "
                "device");
}

// ---- binary_confusion --------------------------------------------------------------

TEST_CASE("binary_confusion thresholds probabilities with >=", "[metrics]") {
  std::mt19937_64 rng(201);
  for (double threshold : {0.5, 0.3, 0.0, 1.0})
    for (std::int64_t n : kSizes)
      for (DType pred_type : kFloatTypes)
        for (DType target_type : {DType::kInt64, DType::kUInt8, DType::kBool}) {
          CAPTURE(threshold, n, concord::dtype_name(pred_type), concord::dtype_name(target_type));
          auto p = random_probs(rng, n);
          sprinkle_nan(rng, p, 0.01);
          const auto t = random_ints(rng, n, 0, 1);
          HostTensor preds = make(pred_type, {n}, p), target = make(target_type, {n}, t);
          const auto start = random_counts(rng, 4);
          HostTensor cm = int64_state({2, 2}, start);
          binary_confusion(cm.view(), preds.view(), target.view(), threshold);
          CHECK(cm.as<std::int64_t>() == plus(start, ref_binary(p, true, t, threshold)));
        }
}

TEST_CASE("binary_confusion counts 0/1 label predictions", "[metrics]") {
  std::mt19937_64 rng(202);
  for (std::int64_t n : kSizes)
    for (DType pred_type : {DType::kInt8, DType::kInt32, DType::kInt64, DType::kUInt8,
                            DType::kBool}) {
      CAPTURE(n, concord::dtype_name(pred_type));
      const auto p = random_ints(rng, n, 0, 1), t = random_ints(rng, n, 0, 1);
      HostTensor preds = make(pred_type, {n}, p), target = make(DType::kInt32, {n}, t);
      HostTensor cm = zeros_int64({2, 2});
      binary_confusion(cm.view(), preds.view(), target.view(), 0.5);
      CHECK(cm.as<std::int64_t>() == ref_binary(p, false, t, 0.5));
    }
}

TEST_CASE("binary_confusion: incremental updates and errors", "[metrics]") {
  std::mt19937_64 rng(203);
  const std::int64_t n = 100003;
  const auto p = random_probs(rng, n);
  auto t = random_ints(rng, n, 0, 1);
  HostTensor preds = make(DType::kFloat32, {n}, p), target = make(DType::kInt8, {n}, t);
  HostTensor whole = zeros_int64({2, 2}), split = zeros_int64({2, 2});
  binary_confusion(whole.view(), preds.view(), target.view(), 0.25);
  for (auto [begin, end] : {std::pair<std::int64_t, std::int64_t>{0, 1}, {1, n}}) {
    HostTensor pr = rows(preds, begin, end), tr = rows(target, begin, end);
    binary_confusion(split.view(), pr.view(), tr.view(), 0.25);
  }
  CHECK(split.as<std::int64_t>() == whole.as<std::int64_t>());

  auto call = [&](HostTensor& c, HostTensor& pr, HostTensor& tr, double threshold) {
    return [&, threshold] { binary_confusion(c.view(), pr.view(), tr.view(), threshold); };
  };
  t[90000] = 2;
  HostTensor bad_target = make(DType::kInt64, {n}, t);
  require_invalid_untouched(whole, call(whole, preds, bad_target, 0.5),
                            "binary_confusion: target holds 2 at index 90000, expected 0 or 1");
  HostTensor label_preds = make(DType::kInt32, {3}, {0, 1, -3});
  HostTensor three = make(DType::kInt32, {3}, {0, 1, 1});
  require_invalid_untouched(whole, call(whole, label_preds, three, 0.5),
                            "binary_confusion: preds holds -3 at index 2, expected 0 or 1");
  HostTensor column = make(DType::kFloat32, {3, 1}, {0.1, 0.2, 0.3});
  require_invalid_untouched(whole, call(whole, column, three, 0.5),
                            "binary_confusion: preds has shape (3, 1), expected (N,) probabilities "
                            "or labels");
  HostTensor short_target = make(DType::kInt32, {2}, {0, 1});
  HostTensor probs = make(DType::kFloat32, {3}, {0.1, 0.2, 0.3});
  require_invalid_untouched(whole, call(whole, probs, short_target, 0.5),
                            "binary_confusion: target has shape (2,), expected (3,) to match "
                            "preds");
  require_invalid_untouched(whole, call(whole, probs, three, kNaN),
                            "binary_confusion: threshold is nan, expected a number");
  HostTensor wide = zeros_int64({2, 3});
  require_invalid_untouched(wide, call(wide, probs, three, 0.5),
                            "binary_confusion: confusion has shape (2, 3), expected (2, 2)");
}

// ---- multilabel_counts -------------------------------------------------------------

TEST_CASE("multilabel_counts counts tp, fp, fn, tn per label", "[metrics]") {
  std::mt19937_64 rng(301);
  for (std::int64_t labels : {1, 3, 10, 2000})
    for (std::int64_t n : {0, 1, 7, 1000, 10007})
      for (DType pred_type : {DType::kFloat16, DType::kBFloat16, DType::kFloat32,
                              DType::kFloat64, DType::kInt64, DType::kBool}) {
        if (labels * n > 2000000) continue;
        CAPTURE(labels, n, concord::dtype_name(pred_type));
        const bool probabilities = concord::dtype_is_floating(pred_type);
        auto p = probabilities ? random_probs(rng, n * labels) : random_ints(rng, n * labels, 0, 1);
        if (probabilities) sprinkle_nan(rng, p, 0.01);
        const auto t = random_ints(rng, n * labels, 0, 1);
        HostTensor preds = make(pred_type, {n, labels}, p), target = make(DType::kUInt8, {n, labels}, t);
        const auto start = random_counts(rng, labels * 4);
        HostTensor counts = int64_state({labels, 4}, start);
        multilabel_counts(counts.view(), preds.view(), target.view(), 0.375);
        CHECK(counts.as<std::int64_t>() == plus(start, ref_multilabel(labels, p, probabilities, t, 0.375)));
      }
}

TEST_CASE("multilabel_counts: incremental updates and errors", "[metrics]") {
  std::mt19937_64 rng(302);
  const std::int64_t n = 100003, labels = 3;
  const auto p = random_probs(rng, n * labels);
  auto t = random_ints(rng, n * labels, 0, 1);
  HostTensor preds = make(DType::kFloat64, {n, labels}, p), target = make(DType::kInt64, {n, labels}, t);
  HostTensor whole = zeros_int64({labels, 4}), split = zeros_int64({labels, 4});
  multilabel_counts(whole.view(), preds.view(), target.view(), 0.5);
  for (auto [begin, end] : {std::pair<std::int64_t, std::int64_t>{0, 50000}, {50000, n}}) {
    HostTensor pr = rows(preds, begin, end), tr = rows(target, begin, end);
    multilabel_counts(split.view(), pr.view(), tr.view(), 0.5);
  }
  CHECK(split.as<std::int64_t>() == whole.as<std::int64_t>());

  auto call = [&](HostTensor& c, HostTensor& pr, HostTensor& tr) {
    return [&] { multilabel_counts(c.view(), pr.view(), tr.view(), 0.5); };
  };
  t[3 * 60000 + 2] = 5;
  HostTensor bad_target = make(DType::kInt64, {n, labels}, t);
  require_invalid_untouched(whole, call(whole, preds, bad_target),
                            "multilabel_counts: target holds 5 at index (60000, 2), expected 0 "
                            "or 1");
  HostTensor label_preds = make(DType::kInt8, {2, 3}, {0, 1, 0, 1, 9, 0});
  HostTensor small_target = make(DType::kInt8, {2, 3}, {0, 1, 0, 1, 1, 0});
  require_invalid_untouched(whole, call(whole, label_preds, small_target),
                            "multilabel_counts: preds holds 9 at index (1, 1), expected 0 or 1");
  HostTensor narrow = make(DType::kFloat32, {4, 2}, std::vector<double>(8, 0.5));
  require_invalid_untouched(whole, call(whole, narrow, small_target),
                            "multilabel_counts: preds has shape (4, 2), expected (N, 3) to match "
                            "counts (3, 4)");
  HostTensor probs = make(DType::kFloat32, {2, 3}, std::vector<double>(6, 0.5));
  HostTensor transposed = make(DType::kInt8, {3, 2}, std::vector<double>(6, 1));
  require_invalid_untouched(whole, call(whole, probs, transposed),
                            "multilabel_counts: target has shape (3, 2), expected (2, 3) to match "
                            "preds");
  HostTensor flat = zeros_int64({12});
  require_invalid_untouched(flat, call(flat, probs, small_target),
                            "multilabel_counts: counts has shape (12,), expected (L, 4): tp, fp, "
                            "fn, tn per label");
}

// ---- topk_correct ------------------------------------------------------------------

TEST_CASE("topk_correct counts targets among the top k, ties in the target's favour",
          "[metrics]") {
  std::mt19937_64 rng(401);
  for (std::int64_t C : kClasses)
    for (std::int64_t n : kSizes)
      for (DType score_type : kFloatTypes)
        for (std::int64_t k : {std::int64_t{1}, std::int64_t{2}, C}) {
          if (k > C) continue;
          CAPTURE(C, n, k, concord::dtype_name(score_type));
          auto s = random_scores(rng, n * C);
          sprinkle_nan(rng, s, 0.01);
          const auto t = random_ints(rng, n, 0, C - 1);
          HostTensor scores = make(score_type, {n, C}, s), target = make(DType::kInt32, {n}, t);
          HostTensor counts = int64_state({2}, {5, 9});
          topk_correct(counts.view(), scores.view(), target.view(), k);
          CHECK(counts.as<std::int64_t>() == plus({5, 9}, ref_topk(C, s, t, k)));
        }
}

TEST_CASE("topk_correct: incremental updates and errors", "[metrics]") {
  std::mt19937_64 rng(402);
  const std::int64_t n = 100003, C = 10;
  const auto s = random_scores(rng, n * C);
  auto t = random_ints(rng, n, 0, C - 1);
  HostTensor scores = make(DType::kFloat32, {n, C}, s), target = make(DType::kInt64, {n}, t);
  HostTensor whole = zeros_int64({2}), split = zeros_int64({2});
  topk_correct(whole.view(), scores.view(), target.view(), 3);
  for (auto [begin, end] : {std::pair<std::int64_t, std::int64_t>{0, 1024}, {1024, n}}) {
    HostTensor sr = rows(scores, begin, end), tr = rows(target, begin, end);
    topk_correct(split.view(), sr.view(), tr.view(), 3);
  }
  CHECK(split.as<std::int64_t>() == whole.as<std::int64_t>());

  auto call = [&](HostTensor& c, HostTensor& sc, HostTensor& tr, std::int64_t k) {
    return [&, k] { topk_correct(c.view(), sc.view(), tr.view(), k); };
  };
  t[99999] = -2;
  HostTensor bad_target = make(DType::kInt64, {n}, t);
  require_invalid_untouched(whole, call(whole, scores, bad_target, 1),
                            "topk_correct: target holds -2 at index 99999, outside [0, 10)");
  HostTensor small = make(DType::kFloat32, {2, 3}, std::vector<double>(6, 0.0));
  HostTensor two = make(DType::kInt64, {2}, {0, 1});
  require_invalid_untouched(whole, call(whole, small, two, 0),
                            "topk_correct: k is 0, expected 1 <= k <= 3 (the number of classes)");
  require_invalid_untouched(whole, call(whole, small, two, 4),
                            "topk_correct: k is 4, expected 1 <= k <= 3 (the number of classes)");
  HostTensor labels = make(DType::kFloat32, {2}, {0, 1});
  require_invalid_untouched(whole, call(whole, labels, two, 1),
                            "topk_correct: preds has shape (2,), expected (N, C) scores with C "
                            ">= 1");
  HostTensor three = make(DType::kInt64, {3}, {0, 1, 2});
  require_invalid_untouched(whole, call(whole, small, three, 1),
                            "topk_correct: target has shape (3,), expected (2,) to match preds");
}

// ---- binary_histogram --------------------------------------------------------------

TEST_CASE("binary_histogram bins scores by class", "[metrics]") {
  std::mt19937_64 rng(501);
  for (std::int64_t bins : {1, 10, 10000})
    for (std::int64_t n : kSizes)
      for (DType score_type : kFloatTypes) {
        CAPTURE(bins, n, concord::dtype_name(score_type));
        const auto s = random_probs(rng, n);
        const auto t = random_ints(rng, n, 0, 1);
        HostTensor scores = make(score_type, {n}, s), target = make(DType::kBool, {n}, t);
        const auto start = random_counts(rng, 2 * bins);
        HostTensor h = int64_state({2, bins}, start);
        binary_histogram(h.view(), scores.view(), target.view());
        CHECK(h.as<std::int64_t>() == plus(start, ref_histogram(bins, s, t)));
      }
}

TEST_CASE("binary_histogram: incremental updates and errors", "[metrics]") {
  std::mt19937_64 rng(502);
  const std::int64_t n = 100003, bins = 100;
  auto s = random_probs(rng, n);
  auto t = random_ints(rng, n, 0, 1);
  HostTensor scores = make(DType::kFloat32, {n}, s), target = make(DType::kInt32, {n}, t);
  HostTensor whole = zeros_int64({2, bins}), split = zeros_int64({2, bins});
  binary_histogram(whole.view(), scores.view(), target.view());
  for (auto [begin, end] : {std::pair<std::int64_t, std::int64_t>{0, 0}, {0, 7}, {7, n}}) {
    HostTensor sr = rows(scores, begin, end), tr = rows(target, begin, end);
    binary_histogram(split.view(), sr.view(), tr.view());
  }
  CHECK(split.as<std::int64_t>() == whole.as<std::int64_t>());

  auto call = [&](HostTensor& h, HostTensor& sc, HostTensor& tr) {
    return [&] { binary_histogram(h.view(), sc.view(), tr.view()); };
  };
  s[88888] = 1.5;
  HostTensor high = make(DType::kFloat32, {n}, s);
  require_invalid_untouched(whole, call(whole, high, target),
                            "binary_histogram: scores holds 1.5 at index 88888, outside [0, 1]");
  s[88888] = 0.5;
  s[2000] = kNaN;
  HostTensor nan_scores = make(DType::kFloat64, {n}, s);
  require_invalid_untouched(whole, call(whole, nan_scores, target),
                            "binary_histogram: scores holds nan at index 2000, outside [0, 1]");
  HostTensor fp16_neg = make(DType::kFloat16, {2}, {0.5, -0.25});
  HostTensor two = make(DType::kInt32, {2}, {0, 1});
  require_invalid_untouched(whole, call(whole, fp16_neg, two),
                            "binary_histogram: scores holds -0.25 at index 1, outside [0, 1]");
  HostTensor f32 = make(DType::kFloat32, {2}, {0.1, 0.0});
  require_invalid_untouched(whole, call(whole, f32, f32),
                            "binary_histogram: target has dtype float32, expected integer labels "
                            "(int8, int32, int64, uint8 or bool)");
  HostTensor f32_target = make(DType::kFloat32, {2}, {0.1, 0.0});
  HostTensor bad_t = make(DType::kInt32, {2}, {0, 3});
  require_invalid_untouched(whole, call(whole, f32_target, bad_t),
                            "binary_histogram: target holds 3 at index 1, expected 0 or 1");
  HostTensor int_scores = make(DType::kInt32, {2}, {0, 1});
  require_invalid_untouched(whole, call(whole, int_scores, two),
                            "binary_histogram: scores has dtype int32, expected scores (float16, "
                            "bfloat16, float32 or float64)");
  HostTensor three_rows = zeros_int64({3, bins});
  require_invalid_untouched(three_rows, call(three_rows, f32, two),
                            "binary_histogram: histogram has shape (3, 100), expected (2, B) "
                            "with B >= 1 bins");
}

// ---- weighted_sum, max, min ----------------------------------------------------------

TEST_CASE("weighted_sum accumulates sum(values * weights) and sum(weights)", "[metrics]") {
  std::mt19937_64 rng(601);
  // Values k/4 with |k| < 256 and small integer weights: every product and
  // partial sum is exact in double, so any summation order gives the
  // reference bit for bit.
  auto values_for = [&](DType dtype, std::int64_t n) {
    if (concord::dtype_is_floating(dtype)) return random_steps(rng, n, -255, 255, 4.0);
    if (dtype == DType::kBool) return random_ints(rng, n, 0, 1);
    if (dtype == DType::kUInt8) return random_ints(rng, n, 0, 255);
    return random_ints(rng, n, -128, 127);
  };
  for (std::int64_t n : kSizes)
    for (DType value_type : kAllTypes)
      for (int weighting = 0; weighting < 3; ++weighting) {
        const DType weight_type = weighting == 1 ? DType::kFloat16 : DType::kInt32;
        const bool weighted = weighting > 0;
        CAPTURE(n, concord::dtype_name(value_type), weighted, concord::dtype_name(weight_type));
        const auto v = values_for(value_type, n);
        const auto w = weighted ? random_ints(rng, n, 0, 100) : std::vector<double>(n, 1.0);
        HostTensor values = make(value_type, {n}, v), weights = make(weight_type, {n}, w);
        HostTensor state = float64_state({1.5, 2.0});
        const TensorView weight_view = weights.view();
        weighted_sum(state.view(), values.view(), weighted ? &weight_view : nullptr);
        double sum = 1.5, total = 2.0;
        for (std::int64_t i = 0; i < n; ++i) {
          sum += v[i] * w[i];
          total += w[i];
        }
        CHECK(state.as<double>() == std::vector<double>{sum, total});
      }
}

TEST_CASE("weighted_sum: shape errors, NaN, bool bytes, 0-d values, accumulation", "[metrics]") {
  HostTensor state = float64_state({0, 0});
  HostTensor matrix = make(DType::kFloat32, {2, 3}, {1, 2, 3, 4, 5, 6});
  HostTensor weights = make(DType::kFloat32, {2, 3}, {1, 1, 1, 0, 0, 2});
  const TensorView weight_view = weights.view();
  weighted_sum(state.view(), matrix.view(), &weight_view);
  CHECK(state.as<double>() == std::vector<double>{18, 5});

  HostTensor flat = make(DType::kFloat32, {6}, {1, 1, 1, 1, 1, 1});
  const TensorView flat_view = flat.view();
  require_invalid_untouched(
      state, [&] { weighted_sum(state.view(), matrix.view(), &flat_view); },
      "weighted_sum: weights has shape (6,), expected (2, 3) to match values");
  HostTensor three = float64_state({0, 0, 0});
  require_invalid_untouched(
      three, [&] { weighted_sum(three.view(), flat.view(), nullptr); },
      "weighted_sum: state has shape (3,), expected (2,)");
  HostTensor f32_state = make(DType::kFloat32, {2}, {0, 0});
  require_invalid_untouched(
      f32_state, [&] { weighted_sum(f32_state.view(), flat.view(), nullptr); },
      "weighted_sum: state has dtype float32, expected float64");

  HostTensor with_nan = make(DType::kBFloat16, {3}, {1, kNaN, 2});
  HostTensor fresh = float64_state({0, 0});
  weighted_sum(fresh.view(), with_nan.view(), nullptr);
  CHECK(std::isnan(fresh.as<double>()[0]));  // NaN propagates, as in a sum
  CHECK(fresh.as<double>()[1] == 3);

  HostTensor bools = make(DType::kBool, {3}, {1, 0, 1});
  bools.bytes[2] = 9;  // any nonzero byte is true
  HostTensor counted = float64_state({0, 0});
  weighted_sum(counted.view(), bools.view(), nullptr);
  CHECK(counted.as<double>() == std::vector<double>{2, 3});

  HostTensor scalar = make(DType::kInt64, {}, {7});
  weighted_sum(counted.view(), scalar.view(), nullptr);
  CHECK(counted.as<double>() == std::vector<double>{9, 4});
}

TEST_CASE("max and min skip NaN and keep the state on empty input", "[metrics]") {
  std::mt19937_64 rng(701);
  for (std::int64_t n : kSizes)
    for (DType dtype : kAllTypes) {
      CAPTURE(n, concord::dtype_name(dtype));
      const bool floating = concord::dtype_is_floating(dtype);
      auto v = floating ? random_steps(rng, n, -255, 255, 4.0)
               : dtype == DType::kBool  ? random_ints(rng, n, 0, 1)
               : dtype == DType::kUInt8 ? random_ints(rng, n, 0, 255)
                                        : random_ints(rng, n, -128, 127);
      if (floating) sprinkle_nan(rng, v, 0.1);
      HostTensor values = make(dtype, {n}, v);
      for (double start : {-kNaN, -1000.0, 0.5, 1000.0}) {
        HostTensor hi = float64_state({start}), lo = float64_state({start});
        max_value(hi.view(), values.view());
        min_value(lo.view(), values.view());
        double ref_hi = start, ref_lo = start;
        for (double x : v) {
          if (std::isnan(x)) continue;
          if (std::isnan(ref_hi) || x > ref_hi) ref_hi = x;
          if (std::isnan(ref_lo) || x < ref_lo) ref_lo = x;
        }
        if (std::isnan(ref_hi)) {
          CHECK(std::isnan(hi.as<double>()[0]));
          CHECK(std::isnan(lo.as<double>()[0]));
        } else {
          CHECK(hi.as<double>()[0] == ref_hi);
          CHECK(lo.as<double>()[0] == ref_lo);
        }
      }
    }

  HostTensor all_nan = make(DType::kFloat32, {3}, {kNaN, kNaN, kNaN});
  HostTensor state = float64_state({4.0});
  max_value(state.view(), all_nan.view());
  CHECK(state.as<double>()[0] == 4.0);

  HostTensor values = make(DType::kFloat32, {1}, {1});
  HostTensor two = float64_state({0, 0});
  require_invalid_untouched(
      two, [&] { max_value(two.view(), values.view()); },
      "max: state has shape (2,), expected (1,)");
  HostTensor ints = zeros_int64({1});
  require_invalid_untouched(
      ints, [&] { min_value(ints.view(), values.view()); },
      "min: state has dtype int64, expected float64");
}

// ---- the generic front ----------------------------------------------------------------

TEST_CASE("metric kernels are found by name and take their inputs in signature order",
          "[metrics]") {
  std::vector<std::string> names;
  for (int k = 0; k < concord::plugin::kNumMetricKernels; ++k) {
    const auto kernel = static_cast<MetricKernel>(k);
    const std::string name = concord::plugin::metric_kernel_name(kernel);
    CAPTURE(name);
    CHECK(metrics::kernel_from_name(name) == kernel);
    const metrics::KernelSignature s = metrics::signature(kernel);
    CHECK(s.required_inputs >= 1);
    CHECK(s.required_inputs <= s.max_inputs);
    CHECK(s.max_inputs <= concord::plugin::kMaxMetricInputs);
    names.push_back(name);
  }
  CHECK(names == std::vector<std::string>{"weighted_sum", "max", "min", "confusion_matrix",
                                          "binary_confusion", "multilabel_counts",
                                          "topk_correct", "binary_histogram"});
  require_error([] { metrics::kernel_from_name("histogram"); }, StatusCode::kInvalidArgument,
                "unknown metric kernel 'histogram'; valid: weighted_sum, max, min, "
                "confusion_matrix, binary_confusion, multilabel_counts, topk_correct, "
                "binary_histogram");
  const metrics::KernelSignature h = metrics::signature(MetricKernel::kBinaryHistogram);
  CHECK(std::string(h.state) == "histogram");
  CHECK(std::string(h.inputs[0]) == "scores");
  CHECK(std::string(h.inputs[1]) == "target");

  HostTensor cm = zeros_int64({2, 2});
  HostTensor preds = make(DType::kInt64, {2}, {0, 1}), target = make(DType::kInt64, {2}, {1, 1});
  require_invalid_untouched(
      cm, [&] { update(MetricKernel::kConfusionMatrix, cm.view(), {preds.view()}); },
      "confusion_matrix: got 1 input; it takes preds, target");
  HostTensor state = float64_state({0, 0});
  HostTensor values = make(DType::kFloat32, {2}, {1, 2});
  require_invalid_untouched(
      state,
      [&] {
        update(MetricKernel::kWeightedSum, state.view(),
               {values.view(), values.view(), values.view()});
      },
      "weighted_sum: got 3 inputs; it takes values, weights (optional)");
  require_invalid_untouched(
      state, [&] { update(static_cast<MetricKernel>(42), state.view(), {values.view()}); },
      "unknown metric kernel 42");
}

// ---- the C ABI ------------------------------------------------------------------------

TEST_CASE("metric updates through the C ABI", "[metrics]") {
  std::mt19937_64 rng(801);
  const std::int64_t n = 1000, C = 3;

  SECTION("confusion_matrix") {
    const auto s = random_scores(rng, n * C);
    const auto t = random_ints(rng, n, 0, C - 1);
    HostTensor scores = make(DType::kFloat32, {n, C}, s), target = make(DType::kInt64, {n}, t);
    HostTensor cm = zeros_int64({C, C});
    DLTensor dcm = cm.dl(), ds = scores.dl(), dt = target.dl();
    REQUIRE(update_metric("confusion_matrix", &dcm, {&ds, &dt}) == CONCORD_OK);
    CHECK(cm.as<std::int64_t>() == ref_confusion(C, s, true, t));

    CHECK(update_metric("confusion_matrix", &dcm, {nullptr, &dt}) == CONCORD_ERR_INVALID_ARGUMENT);
    CHECK(std::string(concord_last_error()) == "confusion_matrix: preds tensor is NULL");
    std::int64_t strides[2] = {1, n};
    ds.strides = strides;
    CHECK(update_metric("confusion_matrix", &dcm, {&ds, &dt}) == CONCORD_ERR_INVALID_ARGUMENT);
    CHECK(std::string(concord_last_error()) ==
          "confusion_matrix: preds tensor is not contiguous (dim 1 has stride 1000, expected 1); "
          "pass a C-contiguous array");
    ds.strides = nullptr;
    dcm.device = {kDLCUDA, 0};
    ds.device = dt.device = dcm.device;
    if (!concord::testing::cuda_kernels_run_here()) {
      CHECK(update_metric("confusion_matrix", &dcm, {&ds, &dt}) == CONCORD_ERR_UNAVAILABLE);
      CHECK(std::string(concord_last_error()).rfind("confusion_matrix: ", 0) == 0);
    }
    dt.device = {kDLCPU, 0};
    CHECK(update_metric("confusion_matrix", &dcm, {&ds, &dt}) == CONCORD_ERR_INVALID_ARGUMENT);
    CHECK(std::string(concord_last_error()) ==
          "confusion_matrix: target is on cpu but confusion is on cuda:0; pass tensors on one "
          "device");
    CHECK(cm.as<std::int64_t>() == ref_confusion(C, s, true, t));
  }

  SECTION("binary_confusion") {
    const auto p = random_probs(rng, n);
    const auto t = random_ints(rng, n, 0, 1);
    HostTensor preds = make(DType::kFloat16, {n}, p), target = make(DType::kUInt8, {n}, t);
    HostTensor cm = zeros_int64({2, 2});
    DLTensor dcm = cm.dl(), dp = preds.dl(), dt = target.dl();
    REQUIRE(update_metric("binary_confusion", &dcm, {&dp, &dt}, 0.75) == CONCORD_OK);
    CHECK(cm.as<std::int64_t>() == ref_binary(p, true, t, 0.75));
    CHECK(update_metric("binary_confusion", nullptr, {&dp, &dt}, 0.5) == CONCORD_ERR_INVALID_ARGUMENT);
    CHECK(std::string(concord_last_error()) == "binary_confusion: confusion tensor is NULL");
  }

  SECTION("multilabel_counts") {
    const auto p = random_probs(rng, n * C);
    const auto t = random_ints(rng, n * C, 0, 1);
    HostTensor preds = make(DType::kBFloat16, {n, C}, p), target = make(DType::kInt8, {n, C}, t);
    HostTensor counts = zeros_int64({C, 4});
    DLTensor dc = counts.dl(), dp = preds.dl(), dt = target.dl();
    REQUIRE(update_metric("multilabel_counts", &dc, {&dp, &dt}, 0.5) == CONCORD_OK);
    CHECK(counts.as<std::int64_t>() == ref_multilabel(C, p, true, t, 0.5));
    DLTensor short_target = dt;
    std::int64_t shape[2] = {n - 1, C};
    short_target.shape = shape;
    CHECK(update_metric("multilabel_counts", &dc, {&dp, &short_target}, 0.5) ==
          CONCORD_ERR_INVALID_ARGUMENT);
    CHECK(std::string(concord_last_error()) ==
          "multilabel_counts: target has shape (999, 3), expected (1000, 3) to match preds");
  }

  SECTION("topk_correct") {
    const auto s = random_scores(rng, n * C);
    const auto t = random_ints(rng, n, 0, C - 1);
    HostTensor scores = make(DType::kFloat64, {n, C}, s), target = make(DType::kInt32, {n}, t);
    HostTensor counts = zeros_int64({2});
    DLTensor dc = counts.dl(), ds = scores.dl(), dt = target.dl();
    REQUIRE(update_metric("topk_correct", &dc, {&ds, &dt}, 0.5, 2) == CONCORD_OK);
    CHECK(counts.as<std::int64_t>() == ref_topk(C, s, t, 2));
    CHECK(update_metric("topk_correct", &dc, {&ds, &dt}, 0.5, 5) == CONCORD_ERR_INVALID_ARGUMENT);
    CHECK(std::string(concord_last_error()) ==
          "topk_correct: k is 5, expected 1 <= k <= 3 (the number of classes)");
  }

  SECTION("binary_histogram") {
    const auto s = random_probs(rng, n);
    const auto t = random_ints(rng, n, 0, 1);
    HostTensor scores = make(DType::kFloat32, {n}, s), target = make(DType::kInt64, {n}, t);
    HostTensor h = zeros_int64({2, 16});
    DLTensor dh = h.dl(), ds = scores.dl(), dt = target.dl();
    REQUIRE(update_metric("binary_histogram", &dh, {&ds, &dt}) == CONCORD_OK);
    CHECK(h.as<std::int64_t>() == ref_histogram(16, s, t));
    DLTensor wrong = dh;
    wrong.dtype = {kDLFloat, 64, 1};
    CHECK(update_metric("binary_histogram", &wrong, {&ds, &dt}) == CONCORD_ERR_INVALID_ARGUMENT);
    CHECK(std::string(concord_last_error()) ==
          "binary_histogram: histogram has dtype float64, expected int64");
  }

  SECTION("weighted_sum, max and min") {
    HostTensor values = make(DType::kFloat32, {4}, {1, kNaN, -2, 5});
    HostTensor clean = make(DType::kInt8, {3}, {1, -2, 5});
    HostTensor weights = make(DType::kUInt8, {3}, {2, 1, 0});
    HostTensor state = float64_state({0, 0});
    DLTensor ds = state.dl(), dc = clean.dl(), dw = weights.dl();
    REQUIRE(update_metric("weighted_sum", &ds, {&dc, &dw}) == CONCORD_OK);
    CHECK(state.as<double>() == std::vector<double>{0, 3});
    REQUIRE(update_metric("weighted_sum", &ds, {&dc, nullptr}) == CONCORD_OK);
    CHECK(state.as<double>() == std::vector<double>{4, 6});

    HostTensor hi = float64_state({-kNaN}), lo = float64_state({-kNaN});
    DLTensor dhi = hi.dl(), dlo = lo.dl(), dv = values.dl();
    REQUIRE(update_metric("max", &dhi, {&dv}) == CONCORD_OK);
    REQUIRE(update_metric("min", &dlo, {&dv}) == CONCORD_OK);
    CHECK(hi.as<double>()[0] == 5);
    CHECK(lo.as<double>()[0] == -2);
    CHECK(update_metric("max", &dhi, {nullptr}) == CONCORD_ERR_INVALID_ARGUMENT);
    CHECK(std::string(concord_last_error()) == "max: values tensor is NULL");
    CHECK(update_metric("min", &dv, {&dv}) == CONCORD_ERR_INVALID_ARGUMENT);
    CHECK(std::string(concord_last_error()) == "min: state has dtype float32, expected float64");
  }
}
