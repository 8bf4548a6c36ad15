// The extents of a tensor, kept by value: most tensors have a few
// dimensions, held inline; more (NumPy allows 64) go to the heap.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

namespace concord {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<std::int64_t> extents) : Shape(extents.begin(), extents.size()) {}
  Shape(const std::int64_t* extents, std::size_t ndim) { assign(extents, ndim); }
  Shape(const Shape& other) { assign(other.data(), other.ndim_); }
  Shape& operator=(const Shape& other) {
    if (this != &other) assign(other.data(), other.ndim_);
    return *this;
  }

  int ndim() const noexcept { return static_cast<int>(ndim_); }
  const std::int64_t* data() const noexcept { return heap_ ? heap_.get() : inline_; }
  const std::int64_t* begin() const noexcept { return data(); }
  const std::int64_t* end() const noexcept { return data() + ndim_; }
  std::int64_t operator[](std::size_t d) const noexcept { return data()[d]; }

  bool operator==(const Shape& other) const noexcept {
    return ndim_ == other.ndim_ && std::equal(begin(), end(), other.begin());
  }

  // Python tuple notation, as users see shapes in NumPy and torch: "(2, 3)",
  // "(4,)", "()".
  std::string str() const;

 private:
  static constexpr std::size_t kInline = 6;

  void assign(const std::int64_t* extents, std::size_t ndim) {
    ndim_ = ndim;
    heap_.reset(ndim > kInline ? new std::int64_t[ndim] : nullptr);
    std::copy_n(extents, ndim, heap_ ? heap_.get() : inline_);
  }

  std::size_t ndim_ = 0;
  std::int64_t inline_[kInline] = {};
  std::unique_ptr<std::int64_t[]> heap_;
};

}  // namespace concord
