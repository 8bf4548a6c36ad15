// A contiguous host tensor of any dtype for the tests: elements read and
// written as doubles through the library's own codec, viewed as a
// TensorView or a DLTensor (on any DLPack device, so that tests can hand
// the library CUDA tensors with host pointers to check its validation).
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "base/dlpack.h"
#include "base/dtype.hpp"
#include "base/tensor_view.hpp"
#include "kernels/codec.hpp"
#include "kernels/dispatch.hpp"

namespace concord::testing {

struct HostTensor {
  DType dtype = DType::kFloat64;
  std::vector<std::int64_t> shape;
  std::vector<unsigned char> bytes;
  DLDevice device{kDLCPU, 0};

  HostTensor() = default;
  HostTensor(DType t, std::vector<std::int64_t> s) : dtype(t), shape(std::move(s)) {
    bytes.resize(size() * dtype_size(dtype));
  }
  // A 1-D tensor of n elements.
  static HostTensor flat(DType t, std::size_t n) { return HostTensor(t, {std::int64_t(n)}); }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  std::size_t size() const { return static_cast<std::size_t>(numel()); }
  void* data() { return bytes.data(); }
  unsigned char* at(std::size_t i) { return bytes.data() + i * dtype_size(dtype); }
  const unsigned char* at(std::size_t i) const { return bytes.data() + i * dtype_size(dtype); }

  double get(std::size_t i) const {
    return visit_dtype(dtype, [&](auto tag) {
      using C = Codec<decltype(tag)::value>;
      typename C::Storage v;
      std::memcpy(&v, at(i), sizeof v);
      return static_cast<double>(C::load(v));
    });
  }
  // Rounds to nearest (even) into the 16-bit floats; bool stores 0 or 1.
  void set(std::size_t i, double value) {
    visit_dtype(dtype, [&](auto tag) {
      using C = Codec<decltype(tag)::value>;
      const typename C::Storage v = C::store(static_cast<typename C::Compute>(value));
      std::memcpy(at(i), &v, sizeof v);
    });
  }
  std::vector<double> values() const {
    std::vector<double> out(size());
    for (std::size_t i = 0; i < size(); ++i) out[i] = get(i);
    return out;
  }
  // The raw elements as T (int64 counts, float64 states).
  template <typename T>
  std::vector<T> as() const {
    std::vector<T> out(bytes.size() / sizeof(T));
    std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
    return out;
  }
  void fill(std::mt19937_64& rng, double lo, double hi) {
    std::uniform_real_distribution<double> dist(lo, hi);
    for (std::size_t i = 0; i < size(); ++i) set(i, dist(rng));
  }
  TensorView view() {
    DLTensor t = dl();
    return TensorView::from_dlpack(&t, "test");
  }
  DLTensor dl() {
    DLTensor t{};
    t.data = bytes.empty() ? nullptr : bytes.data();
    t.device = device;
    t.ndim = static_cast<std::int32_t>(shape.size());
    t.dtype = dtype_to_dlpack(dtype);
    t.shape = shape.data();
    return t;
  }
};

// One 1-D tensor of `dtype` per size.
inline std::vector<HostTensor> make_list(DType dtype, const std::vector<std::int64_t>& sizes) {
  std::vector<HostTensor> list;
  for (auto n : sizes) list.emplace_back(dtype, std::vector<std::int64_t>{n});
  return list;
}

inline std::vector<TensorView> views_of(std::vector<HostTensor>& list) {
  std::vector<TensorView> v;
  for (auto& t : list) v.push_back(t.view());
  return v;
}

}  // namespace concord::testing
