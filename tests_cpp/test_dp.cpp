// Gradient buckets: the pack/unpack executors against scalar references,
// the bucket plan against an independent greedy planner, and
// GradientSynchronizer with ranks as threads against means and sums
// computed here in float64 from every rank's gradients; then the C ABI, and
// the checks on CUDA gradients that run without a GPU.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/format.hpp"
#include "base/status.hpp"
#include "comm/communicator.hpp"
#include "concord/concord.h"
#include "dp/grad_sync.hpp"
#include "kernels/multi_tensor.hpp"

#include "cabi_ranks.hpp"
#include "host_tensor.hpp"
#include "plugin_helpers.hpp"
#include "spawn_ranks.hpp"
#include "status_helpers.hpp"

using namespace concord;
using concord::testing::contains;
using concord::testing::status_of;
using concord::dp::Compression;
using concord::dp::GradientSynchronizer;
using concord::dp::GradSyncOptions;
using concord::testing::spawn_ranks;
using concord::testing::with_cabi_ranks;

namespace {

using testing::HostTensor;
using testing::make_list;
using testing::views_of;

constexpr DType kFloatTypes[] = {DType::kFloat16, DType::kBFloat16, DType::kFloat32,
                                 DType::kFloat64};

// Half the spacing of `dtype` relative to a value: the error of one rounding.
double unit(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return 0x1p-11;
    case DType::kBFloat16: return 0x1p-8;
    case DType::kFloat32: return 0x1p-24;
    default: return 0x1p-53;
  }
}

std::string first_failure(const std::vector<std::string>& failures) {
  for (const auto& f : failures)
    if (!f.empty()) return f;
  return "";
}

// ---- deterministic gradients: every rank can compute every rank's values ----

double grad_value(int rank, int step, std::size_t grad, std::size_t i) {
  std::uint64_t z = (std::uint64_t(rank) << 48) ^ (std::uint64_t(step) << 40) ^
                    (std::uint64_t(grad) << 28) ^ i;
  z += 0x9E3779B97F4A7C15ull;  // splitmix64
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return double(z >> 11) * 0x1p-52 - 1.0;  // [-1, 1)
}

void fill_grad(HostTensor& t, int rank, int step, std::size_t grad, double amplitude) {
  for (std::size_t i = 0; i < t.size(); ++i)
    t.set(i, amplitude * grad_value(rank, step, grad, i));
}

// Checks `got` (this rank's gradient after wait) against the reduction of
// every rank's gradient, with the error bound documented in concord.h.
std::string check_reduced(const HostTensor& got, int world, int step, std::size_t grad,
                          double amplitude, ReduceOp op, Compression compress) {
  const DType wire = compress == Compression::kBFloat16 ? DType::kBFloat16
                     : compress == Compression::kFloat16 ? DType::kFloat16
                                                         : got.dtype;
  const double divisor = op == ReduceOp::kMean ? world : 1;
  std::vector<double> sum(got.size(), 0.0), magnitude(got.size(), 0.0);
  for (int q = 0; q < world; ++q) {
    HostTensor theirs(got.dtype, got.shape);
    fill_grad(theirs, q, step, grad, amplitude);
    for (std::size_t i = 0; i < got.size(); ++i) {
      sum[i] += theirs.get(i);
      magnitude[i] += std::fabs(theirs.get(i));
    }
  }
  for (std::size_t i = 0; i < got.size(); ++i) {
    double want = sum[i] / divisor, slack = 0;
    if (got.dtype == DType::kInt32) {
      want = std::trunc(want);  // integer means truncate, as NCCL's avg
    } else {
      // Two roundings into the wire type, float32 accumulation over the
      // ranks, and float16's subnormal grid.
      const double accumulation = 4.0 * world * (wire == DType::kFloat64 ? 0x1p-53 : 0x1p-24);
      slack = (2 * unit(wire) + accumulation) * magnitude[i] / divisor +
              (wire == DType::kFloat16 ? 0x1p-24 : 0.0);
    }
    if (!(std::fabs(got.get(i) - want) <= slack)) {
      std::ostringstream why;
      why.precision(10);
      why << dtype_name(got.dtype) << " grad " << grad << "[" << i << "] step " << step << " ("
          << world << " ranks, " << reduce_op_name(op) << "): got " << got.get(i) << ", want "
          << want << " +- " << slack;
      return why.str();
    }
  }
  return "";
}

// A model's gradient sizes: tiny, empty, odd and one larger than the shm
// chunk (1 MiB), so buckets take both the one-shot and the pipelined path.
const std::vector<std::int64_t> kModel = {1000, 200, 5000, 300, 7, 0, 300000, 100, 2500, 800, 1};

constexpr double kTinyMb = 1e-9;  // every gradient gets a bucket of its own
constexpr double kHugeMb = 1e6;   // one bucket for all

GradSyncOptions caps(double first_mb, double cap_mb, ReduceOp op = ReduceOp::kMean,
                     Compression compress = Compression::kNone) {
  return {cap_mb, first_mb, op, compress};
}

// ---- an independent planner for one dtype: greedy, in ready order ----

std::vector<std::vector<std::size_t>> greedy_plan(const std::vector<std::size_t>& order,
                                                  const std::vector<std::size_t>& bytes,
                                                  double first_mb, double cap_mb) {
  std::vector<std::vector<std::size_t>> buckets(1);
  std::size_t filled = 0;
  auto cap = [&] {
    return static_cast<std::size_t>((buckets.size() == 1 ? first_mb : cap_mb) * 1048576.0);
  };
  for (std::size_t index : order) {
    if (filled != 0 && filled + bytes[index] > cap()) {
      buckets.emplace_back();
      filled = 0;
    }
    buckets.back().push_back(index);
    filled += bytes[index];
    if (filled >= cap()) {
      buckets.emplace_back();
      filled = 0;
    }
  }
  if (buckets.back().empty()) buckets.pop_back();
  return buckets;
}

}  // namespace

// ---- pack / unpack executors ---------------------------------------------------

TEST_CASE("pack converts and scales many tensors into one wire buffer", "[dp]") {
  std::mt19937_64 rng(1);
  for (DType wire : kFloatTypes)
    for (double factor : {1.0, 0.25, 1.0 / 3.0}) {
      // Every source dtype, over odd sizes, in one call.
      std::vector<HostTensor> tensors;
      const std::int64_t sizes[] = {1, 33, 0, 1000, 4099, 7, 2, 513};
      for (std::size_t k = 0; k < std::size(sizes); ++k)
        tensors.emplace_back(kFloatTypes[k % 4], std::vector<std::int64_t>{sizes[k]});
      std::int64_t total = 0;
      for (auto& t : tensors) {
        t.fill(rng, -3, 3);
        total += t.numel();
      }
      HostTensor packed(wire, {total});
      kernels::pack(views_of(tensors), packed.bytes.data(), wire, factor);
      std::size_t offset = 0;
      std::string failure;
      for (auto& t : tensors) {
        const bool wide = t.dtype == DType::kFloat64 || wire == DType::kFloat64;
        const double compute = wide ? 0x1p-53 : 0x1p-24;
        for (std::size_t i = 0; i < t.size() && failure.empty(); ++i) {
          const double want = t.get(i) * factor, got = packed.get(offset + i);
          const bool exact_copy = factor == 1.0 && t.dtype == wire;
          const double slack = exact_copy ? 0.0
                                          : (unit(wire) + 2 * compute) * std::fabs(want) +
                                                (wire == DType::kFloat16 ? 0x1p-25 : 0.0);
          if (!(std::fabs(got - want) <= slack))
            failure = concat(dtype_name(t.dtype), " -> ", dtype_name(wire), " x ", factor, " [",
                             i, "]: got ", got, ", want ", want);
        }
        offset += t.size();
      }
      CHECK(failure == "");
    }
}

TEST_CASE("unpack converts and scales a wire buffer back into many tensors", "[dp]") {
  std::mt19937_64 rng(2);
  for (DType wire : kFloatTypes)
    for (double factor : {1.0, 0.5, 1.0 / 3.0}) {
      std::vector<HostTensor> tensors;
      const std::int64_t sizes[] = {4099, 0, 1, 33, 1000, 3};
      for (std::size_t k = 0; k < std::size(sizes); ++k)
        tensors.emplace_back(kFloatTypes[(k + 1) % 4], std::vector<std::int64_t>{sizes[k]});
      HostTensor packed(wire, {5136});
      packed.fill(rng, -3, 3);
      kernels::unpack(packed.bytes.data(), wire, views_of(tensors), factor);
      std::size_t offset = 0;
      std::string failure;
      for (auto& t : tensors) {
        const bool wide = t.dtype == DType::kFloat64 || wire == DType::kFloat64;
        const double compute = wide ? 0x1p-53 : 0x1p-24;
        for (std::size_t i = 0; i < t.size() && failure.empty(); ++i) {
          const double want = packed.get(offset + i) * factor, got = t.get(i);
          const double slack = (unit(t.dtype) + 2 * compute) * std::fabs(want) +
                               (t.dtype == DType::kFloat16 ? 0x1p-25 : 0.0);
          if (!(std::fabs(got - want) <= slack))
            failure = concat(dtype_name(wire), " -> ", dtype_name(t.dtype), " x ", factor, " [",
                             i, "]: got ", got, ", want ", want);
        }
        offset += t.size();
      }
      CHECK(failure == "");
    }
}

TEST_CASE("pack and unpack copy other dtypes bit for bit, and only copy them", "[dp]") {
  HostTensor a(DType::kInt32, {5}), b(DType::kInt32, {3});
  for (std::size_t i = 0; i < 5; ++i) a.set(i, -100.0 * double(i) - 7);
  for (std::size_t i = 0; i < 3; ++i) b.set(i, 1e9 + double(i));
  std::vector<HostTensor> ints;
  ints.push_back(a);
  ints.push_back(b);
  HostTensor wire(DType::kInt32, {8});
  kernels::pack(views_of(ints), wire.bytes.data(), DType::kInt32, 1.0);
  CHECK(wire.get(4) == -407.0);
  CHECK(wire.get(7) == 1e9 + 2);
  std::vector<HostTensor> back = make_list(DType::kInt32, {5, 3});
  kernels::unpack(wire.bytes.data(), DType::kInt32, views_of(back), 1.0);
  CHECK(back[0].bytes == a.bytes);
  CHECK(back[1].bytes == b.bytes);

  Status s = status_of([&] { kernels::pack(views_of(ints), wire.bytes.data(), DType::kInt32, 0.5); });
  CHECK(s.code == StatusCode::kInvalidArgument);
  CHECK(s.message == "pack: tensor 0 is int32 and the buffer is int32 with factor 0.5: only "
                     "floating dtypes convert or scale; other dtypes copy into their own dtype "
                     "with factor 1");
  HostTensor floats(DType::kFloat32, {8});
  s = status_of([&] { kernels::unpack(floats.bytes.data(), DType::kFloat32, views_of(back), 1.0); });
  CHECK(contains(s.message, "unpack: tensor 0 is int32 and the buffer is float32"));
  CHECK(back[0].bytes == a.bytes);
}

// ---- the bucket plan ------------------------------------------------------------------

TEST_CASE("buckets follow the ready order, the caps, and one dtype each", "[dp]") {
  std::vector<std::string> failures(1);
  spawn_ranks(1, [&](Communicator& comm) {
    auto note = [&](const std::string& what) { if (failures[0].empty()) failures[0] = what; };
    auto grads = make_list(DType::kFloat32, kModel);
    std::vector<std::size_t> bytes;
    for (auto& g : grads) bytes.push_back(g.view().nbytes());
    std::vector<std::size_t> reverse(kModel.size()), forward(kModel.size());
    std::iota(reverse.rbegin(), reverse.rend(), std::size_t{0});
    std::iota(forward.begin(), forward.end(), std::size_t{0});

    struct Case { double first_mb, cap_mb; bool forward; };
    const Case cases[] = {{kTinyMb, kTinyMb, false}, {kHugeMb, kHugeMb, false},
                          {0.004, 0.01, false},    {0.01, 0.002, true},
                          {1.0, 25.0, false},      {0.5, 0.5, true}};
    for (const Case& c : cases) {
      const auto& order = c.forward ? forward : reverse;
      GradientSynchronizer sync(comm, views_of(grads),
                                c.forward ? forward : std::vector<std::size_t>{},
                                caps(c.first_mb, c.cap_mb));
      const auto want = greedy_plan(order, bytes, c.first_mb, c.cap_mb);
      const std::string label = concat("caps ", c.first_mb, "/", c.cap_mb, ": ");
      if (sync.num_buckets() != want.size())
        note(concat(label, sync.num_buckets(), " buckets, want ", want.size()));
      for (std::size_t b = 0; b < std::min(want.size(), sync.num_buckets()); ++b) {
        auto members = sync.bucket_members(b);
        if (!std::equal(members.begin(), members.end(), want[b].begin(), want[b].end()))
          note(concat(label, "bucket ", b, " differs"));
        for (std::size_t index : members)
          if (sync.bucket_of(index) != b) note(concat(label, "bucket_of(", index, ")"));
      }
    }
    GradientSynchronizer tiny(comm, views_of(grads), {}, caps(kTinyMb, kTinyMb));
    if (tiny.num_buckets() != kModel.size()) note("tiny caps: one bucket per gradient");
    GradientSynchronizer huge(comm, views_of(grads), {}, caps(kHugeMb, kHugeMb));
    if (huge.num_buckets() != 1) note("huge caps: one bucket for all");

    // Mixed dtypes: one open bucket per dtype; buckets numbered by when
    // they fill in the ready order (reverse here).
    std::vector<HostTensor> mixed;
    mixed.emplace_back(DType::kFloat64, std::vector<std::int64_t>{10});  // 0
    mixed.emplace_back(DType::kFloat32, std::vector<std::int64_t>{10});  // 1
    mixed.emplace_back(DType::kFloat64, std::vector<std::int64_t>{10});  // 2
    mixed.emplace_back(DType::kFloat32, std::vector<std::int64_t>{192});  // 3
    mixed.emplace_back(DType::kFloat32, std::vector<std::int64_t>{64});   // 4
    GradientSynchronizer m(comm, views_of(mixed), {}, caps(1.0 / 1024, 1.0 / 1024, ReduceOp::kSum));
    // Ready order 4, 3, 2, 1, 0: {4, 3} fills its 1 KiB at 3; {2, 0}
    // (float64) and {1} (float32) stay open until the end and are numbered
    // by their last member.
    if (m.num_buckets() != 3) note(concat("mixed: ", m.num_buckets(), " buckets"));
    else {
      auto span_is = [&](std::size_t b, std::vector<std::size_t> want) {
        auto got = m.bucket_members(b);
        return std::equal(got.begin(), got.end(), want.begin(), want.end());
      };
      if (!span_is(0, {4, 3}) || !span_is(1, {1}) || !span_is(2, {2, 0}))
        note("mixed dtypes: unexpected buckets");
    }
  });
  CHECK(first_failure(failures) == "");
}

// ---- synchronisation: every bucket layout, world sizes, ops, compression ----------

TEST_CASE("GradientSynchronizer matches the mean and sum of every rank's gradients", "[dp]") {
  struct Case { double first_mb, cap_mb; ReduceOp op; Compression compress; };
  std::vector<Case> cases;
  for (double cap : {kTinyMb, 0.01, 25.0, kHugeMb})
    for (ReduceOp op : {ReduceOp::kMean, ReduceOp::kSum})
      cases.push_back({cap == 25.0 ? 1.0 : cap, cap, op, Compression::kNone});
  for (Compression c : {Compression::kBFloat16, Compression::kFloat16}) {
    cases.push_back({0.01, 0.05, ReduceOp::kMean, c});
    cases.push_back({kHugeMb, kHugeMb, ReduceOp::kSum, c});
  }
  for (int world = 1; world <= 4; ++world)
    for (const Case& c : cases) {
      INFO(world << " ranks, caps " << c.first_mb << "/" << c.cap_mb << ", "
                 << reduce_op_name(c.op) << ", compress " << int(c.compress));
      std::vector<std::string> failures(world);
      spawn_ranks(world, [&](Communicator& comm) {
        const int rank = comm.rank();
        auto note = [&](const std::string& what) {
          if (failures[rank].empty()) failures[rank] = what;
        };
        auto grads = make_list(DType::kFloat32, kModel);
        GradientSynchronizer sync(comm, views_of(grads), {},
                                  caps(c.first_mb, c.cap_mb, c.op, c.compress));
        std::mt19937_64 rng(100 + rank);
        std::vector<std::size_t> order(kModel.size());
        std::iota(order.begin(), order.end(), std::size_t{0});
        for (int step = 0; step < 3; ++step) {
          for (std::size_t k = 0; k < grads.size(); ++k) fill_grad(grads[k], rank, step, k, 1.0);
          // Each rank marks in its own order: buckets still start in order.
          std::shuffle(order.begin(), order.end(), rng);
          for (std::size_t k : order) sync.mark_ready(k, grads[k].view());
          sync.wait();
          for (std::size_t k = 0; k < grads.size(); ++k)
            if (auto why = check_reduced(grads[k], world, step, k, 1.0, c.op, c.compress);
                !why.empty())
              note(why);
        }
      });
      CHECK(first_failure(failures) == "");
    }
}

TEST_CASE("GradientSynchronizer handles float64, bfloat16 and int32 gradients", "[dp]") {
  for (ReduceOp op : {ReduceOp::kMean, ReduceOp::kSum}) {
    const int world = 3;
    std::vector<std::string> failures(world);
    spawn_ranks(world, [&](Communicator& comm) {
      const int rank = comm.rank();
      auto note = [&](const std::string& what) {
        if (failures[rank].empty()) failures[rank] = what;
      };
      const DType dtypes[] = {DType::kFloat64, DType::kBFloat16, DType::kInt32, DType::kFloat32,
                              DType::kFloat16};
      std::vector<HostTensor> grads;
      for (std::size_t k = 0; k < 10; ++k)
        grads.emplace_back(dtypes[k % 5], std::vector<std::int64_t>{std::int64_t(37 * k + 1)});
      GradientSynchronizer sync(comm, views_of(grads), {}, caps(0.001, 0.001, op));
      for (int step = 0; step < 2; ++step) {
        for (std::size_t k = 0; k < grads.size(); ++k) {
          fill_grad(grads[k], rank, step, k, grads[k].dtype == DType::kInt32 ? 1000.0 : 1.0);
          sync.mark_ready(k, grads[k].view());
        }
        sync.wait();
        for (std::size_t k = 0; k < grads.size(); ++k) {
          const double amplitude = grads[k].dtype == DType::kInt32 ? 1000.0 : 1.0;
          if (auto why = check_reduced(grads[k], world, step, k, amplitude, op, Compression::kNone);
              !why.empty())
            note(why);
        }
      }
    });
    CHECK(first_failure(failures) == "");
  }
}

TEST_CASE("a bucket starts as soon as it and the ones before it are full", "[dp]") {
  const int world = 2;
  struct Seen {
    std::size_t buckets = 0, launched_after_first = 0, launched_after_third = 0,
                launched_after_second = 0;
    bool first_done_early = false;
    std::string failure;
  };
  std::vector<Seen> seen(world);
  spawn_ranks(world, [&](Communicator& comm) {
    Seen& me = seen[comm.rank()];
    // Four equal gradients, one per bucket; ready order 3, 2, 1, 0.
    auto grads = make_list(DType::kFloat32, {256, 256, 256, 256});
    GradientSynchronizer sync(comm, views_of(grads), {}, caps(0.001, 0.001));
    me.buckets = sync.num_buckets();
    for (std::size_t k = 0; k < 4; ++k) fill_grad(grads[k], comm.rank(), 0, k, 1.0);

    sync.mark_ready(3, grads[3].view());  // fills bucket 0
    me.launched_after_first = sync.launched_buckets();
    // The all-reduce of bucket 0 finishes while the rest is still unmarked.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!sync.bucket_done(0) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    me.first_done_early = sync.bucket_done(0);

    sync.mark_ready(1, grads[1].view());  // fills bucket 2, which must wait for bucket 1
    me.launched_after_third = sync.launched_buckets();
    sync.mark_ready(2, grads[2].view());  // fills bucket 1: 1 and 2 start
    me.launched_after_second = sync.launched_buckets();
    sync.mark_ready(0, grads[0].view());
    sync.wait();
    for (std::size_t k = 0; k < 4; ++k)
      if (auto why = check_reduced(grads[k], world, 0, k, 1.0, ReduceOp::kMean, Compression::kNone);
          !why.empty())
        me.failure = why;
  });
  for (const Seen& me : seen) {
    CHECK(me.buckets == 4);
    CHECK(me.launched_after_first == 1);
    CHECK(me.first_done_early);
    CHECK(me.launched_after_third == 1);
    CHECK(me.launched_after_second == 3);
    CHECK(me.failure == "");
  }
}

// ---- errors ---------------------------------------------------------------------------

TEST_CASE("GradientSynchronizer rejects bad use with specific errors", "[dp][errors]") {
  std::vector<Status> statuses;
  std::string failure;
  spawn_ranks(1, [&](Communicator& comm) {
    auto grads = make_list(DType::kFloat32, {4, 5, 6});
    auto make = [&](GradSyncOptions o, std::vector<std::size_t> order = {}) {
      return status_of([&] { GradientSynchronizer s(comm, views_of(grads), order, o); });
    };
    statuses.push_back(make(caps(1.0, 0.0)));
    statuses.push_back(make(caps(NAN, 25.0)));
    statuses.push_back(make(caps(1.0, 25.0, ReduceOp::kMax)));
    statuses.push_back(make(caps(1.0, 25.0), {0, 1}));
    statuses.push_back(make(caps(1.0, 25.0), {0, 1, 1}));
    statuses.push_back(make(caps(1.0, 25.0), {0, 1, 7}));

    std::vector<HostTensor> f64 = make_list(DType::kFloat64, {3});
    statuses.push_back(status_of([&] {
      GradientSynchronizer s(comm, views_of(f64), {},
                             caps(1.0, 25.0, ReduceOp::kMean, Compression::kBFloat16));
    }));
    std::vector<TensorView> on_gpu = views_of(grads);
    on_gpu[1].device = {DeviceKind::kCUDA, 0};
    statuses.push_back(
        status_of([&] { GradientSynchronizer s(comm, on_gpu, {}, caps(1.0, 25.0)); }));

    GradientSynchronizer sync(comm, views_of(grads), {}, caps(kTinyMb, kTinyMb));
    std::mt19937_64 rng(9);
    for (auto& g : grads) g.fill(rng, -1, 1);
    statuses.push_back(status_of([&] { sync.mark_ready(3, grads[0].view()); }));
    statuses.push_back(status_of([&] { sync.mark_ready(0, grads[1].view()); }));
    TensorView square = grads[0].view();
    square.shape = {2, 2};
    statuses.push_back(status_of([&] { sync.mark_ready(0, square); }));
    HostTensor doubles(DType::kFloat64, {4});
    statuses.push_back(status_of([&] { sync.mark_ready(0, doubles.view()); }));
    sync.mark_ready(1, grads[1].view());
    statuses.push_back(status_of([&] { sync.mark_ready(1, grads[1].view()); }));
    statuses.push_back(status_of([&] { sync.wait(); }));
    // The step stays open: mark the rest and wait again.
    const auto before = grads[0].values();
    sync.mark_ready(0, grads[0].view());
    sync.mark_ready(2, grads[2].view());
    sync.wait();
    if (grads[0].values() != before) failure = "a world of one changed gradient 0";
  });
  const std::string expected[] = {
      "GradientSynchronizer: bucket_cap_mb must be finite and > 0, got 0",
      "GradientSynchronizer: first_bucket_mb must be finite and > 0, got nan",
      "GradientSynchronizer: op must be mean or sum, got max",
      "GradientSynchronizer: ready_order has 2 entries for 3 gradients; it must be a permutation "
      "of 0..2",
      "GradientSynchronizer: ready_order holds 1 twice",
      "GradientSynchronizer: ready_order holds 7, outside [0, 3)",
      "GradientSynchronizer: compression 'bf16' applies to float32 gradients, but gradient 0 is "
      "float64; use compression 'none'",
      "GradientSynchronizer: gradient 1 is on cuda:0 but gradient 0 is on cpu; all gradients of "
      "a synchronizer must be on one device (the CPU or one CUDA device)",
      "GradientSynchronizer::mark_ready: gradient index 3 is outside [0, 3)",
      "GradientSynchronizer::mark_ready: grad has shape (5,) but gradient 0 was planned with "
      "shape (4,)",
      "GradientSynchronizer::mark_ready: grad has shape (2, 2) but gradient 0 was planned with "
      "shape (4,)",
      "GradientSynchronizer::mark_ready: gradient 0 is float64 but was planned as float32",
      "GradientSynchronizer::mark_ready: gradient 1 was already marked ready in this step; call "
      "wait() before marking it again",
      "GradientSynchronizer::wait: gradients 0, 2 were not marked ready in this step; mark every "
      "gradient before wait()",
  };
  REQUIRE(statuses.size() == std::size(expected));
  for (std::size_t i = 0; i < statuses.size(); ++i) {
    CHECK(statuses[i].message == expected[i]);
    CHECK(statuses[i].code == StatusCode::kInvalidArgument);
  }
  CHECK(failure == "");
}

TEST_CASE("ranks that plan different buckets get Mismatch, not a hang", "[dp][errors]") {
  const int world = 3;
  std::vector<Status> statuses(world);
  spawn_ranks(world, [&](Communicator& comm) {
    auto grads = make_list(DType::kFloat32, comm.rank() == 2 ? std::vector<std::int64_t>{4, 5, 6}
                                                             : std::vector<std::int64_t>{4, 5});
    statuses[comm.rank()] =
        status_of([&] { GradientSynchronizer s(comm, views_of(grads), {}, caps(1.0, 25.0)); });
  }, 10.0);
  for (const Status& s : statuses) {
    CHECK(s.code == StatusCode::kMismatch);
    CHECK(s.message == "GradientSynchronizer: ranks 2 planned different gradient buckets than "
                       "rank 0 (rank 0 has 2 gradients; rank 2 has 3); every rank must pass "
                       "gradients of the same dtypes and sizes, the same ready order and the "
                       "same options");
  }
}

TEST_CASE("a rank that never marks makes wait time out and leaves the gradients", "[dp][errors]") {
  Status status;
  bool untouched = false;
  const auto start = std::chrono::steady_clock::now();
  spawn_ranks(2, [&](Communicator& comm) {
    auto grads = make_list(DType::kFloat32, {64, 64});
    GradientSynchronizer sync(comm, views_of(grads), {}, caps(1.0, 25.0));
    if (comm.rank() == 1) return;
    for (std::size_t k = 0; k < 2; ++k) fill_grad(grads[k], 0, 0, k, 1.0);
    const auto before = grads[0].values();
    sync.mark_ready(0, grads[0].view());
    sync.mark_ready(1, grads[1].view());
    status = status_of([&] { sync.wait(); });
    untouched = grads[0].values() == before;
  }, 1.0);
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(status.message);
  CHECK((status.code == StatusCode::kTimeout || status.code == StatusCode::kRemote));
  CHECK(contains(status.message, "GradientSynchronizer::wait"));
  CHECK(untouched);
  CHECK(elapsed < 10.0);
}

// ---- C ABI ------------------------------------------------------------------------------

TEST_CASE("C ABI: gradient buckets reduce DLTensors of any shape", "[dp][cabi]") {
  const int world = 3;
  std::vector<std::string> failures(world);
  with_cabi_ranks(world, [&](int rank, concord_comm_t comm) {
    auto note = [&](const std::string& what) { if (failures[rank].empty()) failures[rank] = what; };
    std::vector<HostTensor> grads;
    grads.emplace_back(DType::kFloat32, std::vector<std::int64_t>{16, 8});
    grads.emplace_back(DType::kFloat32, std::vector<std::int64_t>{8});
    grads.emplace_back(DType::kFloat32, std::vector<std::int64_t>{3, 5, 7});
    grads.emplace_back(DType::kFloat32, std::vector<std::int64_t>{});
    std::vector<DLTensor> dl;
    for (auto& g : grads) dl.push_back(g.dl());
    std::vector<const DLTensor*> templates;
    for (auto& t : dl) templates.push_back(&t);
    concord_grad_sync_options options = CONCORD_GRAD_SYNC_OPTIONS_INIT;
    options.first_bucket_mb = 424.0 / 1048576;  // gradients 3 and 2 (4 + 420 bytes) first
    options.bucket_cap_mb = 1.0 / 1048576;      // then one gradient per bucket
    options.compress = CONCORD_COMPRESS_BF16;
    concord_grad_sync_t sync = nullptr;
    if (concord_grad_sync_create(comm, templates.data(), templates.size(), nullptr, &options,
                                 &sync) != CONCORD_OK)
      return note(concord_last_error());
    size_t buckets = 0, first = 9, last = 9;
    concord_grad_sync_num_buckets(sync, &buckets);
    concord_grad_sync_bucket_of(sync, 3, &first);
    concord_grad_sync_bucket_of(sync, 0, &last);
    if (buckets != 3 || first != 0 || last != 2) note(concat("plan: ", buckets, " buckets"));
    for (int step = 0; step < 3; ++step) {
      for (std::size_t k = 0; k < grads.size(); ++k) fill_grad(grads[k], rank, step, k, 1.0);
      for (std::size_t k = grads.size(); k-- > 0;)
        if (concord_grad_sync_mark_ready(sync, k, &dl[k], nullptr) != CONCORD_OK) note(concord_last_error());
      if (concord_grad_sync_wait(sync, nullptr) != CONCORD_OK) note(concord_last_error());
      for (std::size_t k = 0; k < grads.size(); ++k)
        if (auto why = check_reduced(grads[k], world, step, k, 1.0, ReduceOp::kMean,
                                     Compression::kBFloat16);
            !why.empty())
          note(why);
    }
    concord_grad_sync_destroy(sync);
  });
  CHECK(first_failure(failures) == "");
}

TEST_CASE("C ABI: gradient bucket arguments are checked", "[dp][cabi][errors]") {
  std::vector<std::string> messages;
  std::vector<concord_status> codes;
  with_cabi_ranks(1, [&](int, concord_comm_t comm) {
    auto record = [&](concord_status s) {
      codes.push_back(s);
      messages.push_back(concord_last_error());
    };
    HostTensor g(DType::kFloat32, {2, 3});
    DLTensor d = g.dl();
    const DLTensor* templates[] = {&d};
    concord_grad_sync_t sync = nullptr;
    record(concord_grad_sync_create(nullptr, templates, 1, nullptr, nullptr, &sync));
    concord_grad_sync_options options = CONCORD_GRAD_SYNC_OPTIONS_INIT;
    options.struct_size = sizeof options + 8;  // from a newer header than this library's
    record(concord_grad_sync_create(comm, templates, 1, nullptr, &options, &sync));
    options = CONCORD_GRAD_SYNC_OPTIONS_INIT;
    options.compress = static_cast<concord_compress>(7);
    record(concord_grad_sync_create(comm, templates, 1, nullptr, &options, &sync));
    const std::int64_t negative[] = {-1};
    record(concord_grad_sync_create(comm, templates, 1, negative, nullptr, &sync));
    record(concord_grad_sync_create(comm, nullptr, 1, nullptr, nullptr, &sync));

    if (concord_grad_sync_create(comm, templates, 1, nullptr, nullptr, &sync) != CONCORD_OK) return;
    HostTensor transposed(DType::kFloat32, {3, 2});
    DLTensor t = transposed.dl();
    record(concord_grad_sync_mark_ready(sync, 0, &t, nullptr));
    record(concord_grad_sync_mark_ready(sync, 1, &d, nullptr));
    record(concord_grad_sync_wait(sync, nullptr));
    record(concord_grad_sync_mark_ready(sync, 0, &d, nullptr));
    record(concord_grad_sync_wait(sync, nullptr));
    record(concord_grad_sync_destroy(sync));
    record(concord_grad_sync_destroy(nullptr));
  });
  const std::vector<std::string> expected = {
      "comm is NULL",
      "options->struct_size is 40; expected sizeof(concord_grad_sync_options) = 32, or the "
      "smaller size of an older header's concord_grad_sync_options",
      "unknown compression 7; valid: CONCORD_COMPRESS_NONE, CONCORD_COMPRESS_BF16, "
      "CONCORD_COMPRESS_FP16",
      "ready_order[0] is -1, a negative index",
      "grads is NULL but num_grads is 1",
      "GradientSynchronizer::mark_ready: grad has shape (3, 2) but gradient 0 was planned with "
      "shape (2, 3)",
      "GradientSynchronizer::mark_ready: gradient index 1 is outside [0, 1)",
      "GradientSynchronizer::wait: gradient 0 was not marked ready in this step; mark every "
      "gradient before wait()",
  };
  REQUIRE(codes.size() == expected.size() + 4);
  for (std::size_t i = 0; i < expected.size(); ++i) {
    CHECK(codes[i] == CONCORD_ERR_INVALID_ARGUMENT);
    CHECK(messages[i] == expected[i]);
  }
  for (std::size_t i = expected.size(); i < codes.size(); ++i) CHECK(codes[i] == CONCORD_OK);
}

// ---- CUDA gradients: what runs without a GPU --------------------------------------------

namespace {

// CUDA gradients at made-up addresses: every call below must fail before
// anything could dereference them.
TensorView fake_cuda_view(std::int64_t numel, int device = 0) {
  return TensorView::flat(reinterpret_cast<void*>(std::uintptr_t{0x100000} * (device + 1)), numel, DType::kFloat32, Device{DeviceKind::kCUDA, device});
}

DLTensor fake_cuda_dl(HostTensor& like) {
  DLTensor t = like.dl();
  t.data = reinterpret_cast<void*>(std::uintptr_t{0x200000});
  t.device = {kDLCUDA, 0};
  return t;
}

}  // namespace

TEST_CASE("GradientSynchronizer takes gradients on one device, checked before anything happens",
          "[dp][cuda][errors]") {
  std::vector<std::string> failures(2);
  spawn_ranks(2, [&](Communicator& comm) {
    auto note = [&](const std::string& what) {
      if (failures[comm.rank()].empty()) failures[comm.rank()] = what;
    };
    auto grads = make_list(DType::kFloat32, {4, 5, 6});
    auto expect = [&](std::vector<TensorView> views, const std::string& message) {
      const Status s =
          status_of([&] { GradientSynchronizer sync(comm, views, {}, caps(1.0, 25.0)); });
      if (s.code != StatusCode::kInvalidArgument || s.message != message)
        note(concat("got ", static_cast<int>(s.code), " '", s.message, "', want '", message, "'"));
    };
    std::vector<TensorView> views = views_of(grads);
    views[2] = fake_cuda_view(6);
    expect(views, "GradientSynchronizer: gradient 2 is on cuda:0 but gradient 0 is on cpu; all "
                  "gradients of a synchronizer must be on one device (the CPU or one CUDA "
                  "device)");
    views = {fake_cuda_view(4), grads[1].view()};
    expect(views, "GradientSynchronizer: gradient 1 is on cpu but gradient 0 is on cuda:0; all "
                  "gradients of a synchronizer must be on one device (the CPU or one CUDA "
                  "device)");
    views = {fake_cuda_view(4), fake_cuda_view(5, 1)};
    expect(views, "GradientSynchronizer: gradient 1 is on cuda:1 but gradient 0 is on cuda:0; "
                  "all gradients of a synchronizer must be on one device (the CPU or one CUDA "
                  "device)");
    // Arguments are checked before whether CUDA can be used.
    const Status order = status_of([&] {
      GradientSynchronizer sync(comm, {fake_cuda_view(4), fake_cuda_view(5)}, {0, 0},
                                caps(1.0, 25.0));
    });
    if (order.code != StatusCode::kInvalidArgument ||
        order.message != "GradientSynchronizer: ready_order holds 0 twice")
      note("ready_order: " + order.message);

    // mark_ready with a CUDA gradient on a CPU synchronizer: rejected, and
    // nothing marked; the step then runs as usual, on both ranks.
    GradientSynchronizer sync(comm, views_of(grads), {}, caps(kTinyMb, kTinyMb));
    for (std::size_t k = 0; k < grads.size(); ++k) fill_grad(grads[k], comm.rank(), 0, k, 1.0);
    const Status s = status_of([&] { sync.mark_ready(0, fake_cuda_view(4)); });
    if (s.code != StatusCode::kInvalidArgument ||
        s.message != "GradientSynchronizer::mark_ready: gradient 0 is on cuda:0 but the "
                     "synchronizer's gradients are on cpu; all gradients of a synchronizer must "
                     "be on one device")
      note("mark_ready: " + s.message);
    if (sync.launched_buckets() != 0) note("a bucket started");
    for (std::size_t k = grads.size(); k-- > 0;) sync.mark_ready(k, grads[k].view());
    sync.wait();
    for (std::size_t k = 0; k < grads.size(); ++k)
      if (auto why = check_reduced(grads[k], comm.size(), 0, k, 1.0, ReduceOp::kMean,
                                   Compression::kNone);
          !why.empty())
        note(why);
  }, 10.0);
  CHECK(first_failure(failures) == "");

  // The same through the C ABI, with DLTensors.
  std::vector<concord_status> codes;
  std::vector<std::string> messages;
  with_cabi_ranks(1, [&](int, concord_comm_t comm) {
    auto record = [&](concord_status s) {
      codes.push_back(s);
      messages.push_back(concord_last_error());
    };
    HostTensor a(DType::kFloat32, {2, 3}), b(DType::kFloat32, {4});
    DLTensor ad = a.dl(), bd = b.dl(), gpu = fake_cuda_dl(b);
    const DLTensor* mixed[] = {&ad, &gpu};
    concord_grad_sync_t sync = reinterpret_cast<concord_grad_sync_t>(std::uintptr_t{1});
    record(concord_grad_sync_create(comm, mixed, 2, nullptr, nullptr, &sync));
    CHECK(sync == nullptr);
    const DLTensor* on_cpu[] = {&ad, &bd};
    REQUIRE(concord_grad_sync_create(comm, on_cpu, 2, nullptr, nullptr, &sync) == CONCORD_OK);
    record(concord_grad_sync_mark_ready(sync, 1, &gpu, nullptr));
    record(concord_grad_sync_wait(sync, nullptr));  // gradient 1 was not marked
    CHECK(concord_grad_sync_mark_ready(sync, 0, &ad, nullptr) == CONCORD_OK);
    CHECK(concord_grad_sync_mark_ready(sync, 1, &bd, nullptr) == CONCORD_OK);
    CHECK(concord_grad_sync_wait(sync, nullptr) == CONCORD_OK);
    CHECK(concord_grad_sync_destroy(sync) == CONCORD_OK);
  });
  const std::vector<std::string> expected = {
      "GradientSynchronizer: gradient 1 is on cuda:0 but gradient 0 is on cpu; all gradients of "
      "a synchronizer must be on one device (the CPU or one CUDA device)",
      "GradientSynchronizer::mark_ready: gradient 1 is on cuda:0 but the synchronizer's "
      "gradients are on cpu; all gradients of a synchronizer must be on one device",
      "GradientSynchronizer::wait: gradients 0, 1 were not marked ready in this step; mark every "
      "gradient before wait()",
  };
  REQUIRE(codes.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    CHECK(codes[i] == CONCORD_ERR_INVALID_ARGUMENT);
    CHECK(messages[i] == expected[i]);
  }
}

TEST_CASE("GradientSynchronizer on CUDA gradients without a GPU is unavailable before any "
          "communication", "[dp][cuda][errors]") {
  if (testing::cuda_kernels_run_here()) {
    SUCCEED("this machine runs CUDA kernels; the GPU tests cover the synchronizer there");
    return;
  }
  const plugin::Availability found = plugin::availability();
  // Not built or not loadable: the plugin's problem; loaded: the driver's.
  const std::string reason =
      found.plugin_loaded ? std::string(found.probe.cuda_problem) : found.plugin_problem;
  REQUIRE(!reason.empty());
  const std::string message =
      "GradientSynchronizer: the gradients are on cuda:0: CUDA is unavailable: " + reason;

  std::vector<std::string> failures(2);
  const auto start = std::chrono::steady_clock::now();
  spawn_ranks(2, [&](Communicator& comm) {
    auto note = [&](const std::string& what) {
      if (failures[comm.rank()].empty()) failures[comm.rank()] = what;
    };
    for (const auto& options : {caps(1.0, 25.0), caps(kTinyMb, kTinyMb, ReduceOp::kSum,
                                                      Compression::kBFloat16)}) {
      const Status s = status_of([&] {
        GradientSynchronizer sync(comm, {fake_cuda_view(4), fake_cuda_view(100000)}, {}, options);
      });
      if (s.code != StatusCode::kUnavailable || s.message != message)
        note(concat("got ", static_cast<int>(s.code), " '", s.message, "'"));
    }
    // No collective was issued: a CPU synchronizer on the same communicator
    // pairs up with its peer as usual.
    auto grads = make_list(DType::kFloat32, {3, 7});
    for (std::size_t k = 0; k < grads.size(); ++k) fill_grad(grads[k], comm.rank(), 1, k, 1.0);
    GradientSynchronizer sync(comm, views_of(grads), {}, caps(1.0, 25.0));
    sync.mark_ready(1, grads[1].view());
    sync.mark_ready(0, grads[0].view());
    sync.wait();
    for (std::size_t k = 0; k < grads.size(); ++k)
      if (auto why = check_reduced(grads[k], comm.size(), 1, k, 1.0, ReduceOp::kMean,
                                   Compression::kNone);
          !why.empty())
        note(why);
  }, 10.0);
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(first_failure(failures) == "");
  CHECK(elapsed < 5.0);  // nobody waited for a peer

  // The C ABI: CONCORD_ERR_UNAVAILABLE, no handle.
  concord_status code = CONCORD_OK;
  std::string last;
  bool no_handle = false;
  with_cabi_ranks(1, [&](int, concord_comm_t comm) {
    HostTensor like(DType::kFloat32, {2, 3});
    DLTensor gpu = fake_cuda_dl(like);
    const DLTensor* grads[] = {&gpu};
    concord_grad_sync_t sync = reinterpret_cast<concord_grad_sync_t>(std::uintptr_t{1});
    code = concord_grad_sync_create(comm, grads, 1, nullptr, nullptr, &sync);
    last = concord_last_error();
    no_handle = sync == nullptr;
  });
  CHECK(code == CONCORD_ERR_UNAVAILABLE);
  CHECK(last == message);
  CHECK(no_handle);
}
