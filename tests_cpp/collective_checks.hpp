// What the collective tests share: typed buffers filled with random
// values, references computed in double precision from every rank's
// inputs, the status each rank ends with, and an interrupt flag.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "base/format.hpp"
#include "base/interrupt.hpp"
#include "base/tensor_view.hpp"
#include "comm/communicator.hpp"
#include "host_tensor.hpp"
#include "spawn_ranks.hpp"

namespace concord::testing {

inline constexpr DType kAllDTypes[] = {DType::kFloat16, DType::kBFloat16, DType::kFloat32,
                                DType::kFloat64, DType::kInt8,     DType::kInt32,
                                DType::kInt64,   DType::kUInt8,    DType::kBool};
inline constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMax, ReduceOp::kMin,
                                ReduceOp::kMean};

// Small values so integer sums and products of four ranks never overflow.
inline HostTensor random_buffer(DType dtype, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  HostTensor b = HostTensor::flat(dtype, n);
  std::uniform_real_distribution<double> real(-1.0, 1.0);
  std::uniform_int_distribution<int> small(-3, 3), unsigned_small(0, 3), bit(0, 1);
  for (std::size_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::kBool: b.set(i, bit(rng)); break;
      case DType::kUInt8: b.set(i, unsigned_small(rng)); break;
      case DType::kInt8: case DType::kInt32: case DType::kInt64: b.set(i, small(rng)); break;
      default: b.set(i, real(rng)); break;
    }
  }
  return b;
}

inline double combine(ReduceOp op, double a, double b) {
  switch (op) {
    case ReduceOp::kSum: case ReduceOp::kMean: return a + b;
    case ReduceOp::kProd: return a * b;
    case ReduceOp::kMax: return std::max(a, b);
    case ReduceOp::kMin: return std::min(a, b);
  }
  return 0;
}

// Integer sums and products wrap around in their dtype (two's complement);
// integer means are exact and truncate toward zero.
inline double finish(ReduceOp op, DType dtype, double acc, int nranks) {
  if (dtype_is_floating(dtype) || dtype == DType::kBool) return op == ReduceOp::kMean ? acc / nranks : acc;
  if (op == ReduceOp::kMean) return std::trunc(acc / nranks);
  const int bits = int(dtype_size(dtype)) * 8;
  if (bits == 64) return acc;  // the tests' values never reach 2^63
  const double range = std::ldexp(1.0, bits);
  double wrapped = std::fmod(acc, range);
  if (wrapped < 0) wrapped += range;
  const bool is_signed = dtype != DType::kUInt8;
  return is_signed && wrapped >= range / 2 ? wrapped - range : wrapped;
}

inline double tolerance(DType dtype, double expected) {
  const double scale = std::max(1.0, std::abs(expected));
  switch (dtype) {
    case DType::kFloat16: return 1e-3 * scale;
    case DType::kBFloat16: return 8e-3 * scale;
    case DType::kFloat32: return 1e-5 * scale;
    case DType::kFloat64: return 1e-12 * scale;
    default: return 0;
  }
}

inline std::uint64_t seed_of(int rank, int case_id) { return 1000003ull * case_id + 7919ull * rank + 17; }

// Checks out[i] against the reduction of the inputs of all ranks.
inline std::string compare_reduced(const HostTensor& out, std::size_t offset, ReduceOp op,
                            const std::vector<HostTensor>& inputs, std::size_t input_offset) {
  const int nranks = int(inputs.size());
  for (std::size_t i = 0; i < out.size() - offset && i < inputs[0].size() - input_offset; ++i) {
    double acc = inputs[0].get(input_offset + i);
    for (int q = 1; q < nranks; ++q) acc = combine(op, acc, inputs[q].get(input_offset + i));
    const double expected = finish(op, out.dtype, acc, nranks);
    const double got = out.get(offset + i);
    if (!(std::abs(got - expected) <= tolerance(out.dtype, expected)))
      return concat(dtype_name(out.dtype), " ", reduce_op_name(op), " element ", i, ": got ", got,
                    ", expected ", expected);
  }
  return "";
}

// Runs `body` on each rank and returns the status each rank ended with.
inline std::vector<Status> statuses_of(int nranks, double timeout_s,
                                       const std::function<void(Communicator&)>& body,
                                       BackendChoice choice = BackendChoice::kAuto,
                                       const std::vector<std::string>& hosts = {}) {
  std::vector<Status> statuses(nranks);
  spawn_ranks(nranks, [&](Communicator& comm) {
    try {
      body(comm);
    } catch (const Error& e) {
      statuses[comm.rank()] = e.status();
    }
  }, timeout_s, choice, hosts);
  return statuses;
}

// A view of `data` with `shape` (as the C ABI would give it) and `dtype`.
inline TensorView shaped(void* data, DType dtype, const Shape& shape) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.shape = shape;
  v.numel = 1;
  for (std::int64_t extent : shape) v.numel *= extent;
  return v;
}

// An interrupt check that answers what `flag` says (a Ctrl-C seen by the
// front end), installed for the calling thread for the scope of a test.
struct InterruptFlag {
  std::atomic<bool> raised{false};
  InterruptFlag() {
    set_interrupt_check([](void* self) { return int(static_cast<InterruptFlag*>(self)->raised.load()); },
                        this);
  }
  ~InterruptFlag() { set_interrupt_check(nullptr, nullptr); }
};

}  // namespace concord::testing
