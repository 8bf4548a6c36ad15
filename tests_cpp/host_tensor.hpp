// A contiguous host tensor for the kernel, optimizer and gradient-bucket
// tests: any floating dtype or int32, values read and written as doubles,
// viewed as a TensorView or a DLTensor.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "base/dtype.hpp"
#include "base/tensor_view.hpp"
#include "base/dlpack.h"
#include "kernels/half.hpp"

namespace concord::testing {

struct HostTensor {
  DType dtype;
  std::vector<std::int64_t> shape;
  std::vector<unsigned char> bytes;

  HostTensor(DType t, std::vector<std::int64_t> s) : dtype(t), shape(std::move(s)) {
    bytes.resize(size() * dtype_size(dtype));
  }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  std::size_t size() const { return static_cast<std::size_t>(numel()); }
  unsigned char* at(std::size_t i) { return bytes.data() + i * dtype_size(dtype); }
  const unsigned char* at(std::size_t i) const { return bytes.data() + i * dtype_size(dtype); }

  double get(std::size_t i) const {
    switch (dtype) {
      case DType::kFloat16: { std::uint16_t h; std::memcpy(&h, at(i), 2); return fp16_to_float(h); }
      case DType::kBFloat16: { std::uint16_t h; std::memcpy(&h, at(i), 2); return bf16_to_float(h); }
      case DType::kFloat32: { float v; std::memcpy(&v, at(i), 4); return v; }
      case DType::kFloat64: { double v; std::memcpy(&v, at(i), 8); return v; }
      case DType::kInt32: { std::int32_t v; std::memcpy(&v, at(i), 4); return v; }
      default: return 0;
    }
  }
  // Rounds to nearest (even) into the 16-bit types.
  void set(std::size_t i, double v) {
    switch (dtype) {
      case DType::kFloat16: { auto h = float_to_fp16(float(v)); std::memcpy(at(i), &h, 2); break; }
      case DType::kBFloat16: { auto h = float_to_bf16(float(v)); std::memcpy(at(i), &h, 2); break; }
      case DType::kFloat32: { float f = float(v); std::memcpy(at(i), &f, 4); break; }
      case DType::kFloat64: std::memcpy(at(i), &v, 8); break;
      case DType::kInt32: { auto x = std::int32_t(v); std::memcpy(at(i), &x, 4); break; }
      default: break;
    }
  }
  std::vector<double> values() const {
    std::vector<double> out(size());
    for (std::size_t i = 0; i < size(); ++i) out[i] = get(i);
    return out;
  }
  void fill(std::mt19937_64& rng, double lo, double hi) {
    std::uniform_real_distribution<double> dist(lo, hi);
    for (std::size_t i = 0; i < size(); ++i) set(i, dist(rng));
  }
  TensorView view() { return TensorView::flat(bytes.data(), numel(), dtype, Device{}); }
  DLTensor dl() {
    DLTensor t{};
    t.data = bytes.data();
    t.device = {kDLCPU, 0};
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
