// The element types concord reduces and moves.
#pragma once

#include <cstddef>
#include <string>

#include "base/dlpack.h"

namespace concord {

enum class DType : int {
  kFloat16 = 0,
  kBFloat16 = 1,
  kFloat32 = 2,
  kFloat64 = 3,
  kInt8 = 4,
  kInt32 = 5,
  kInt64 = 6,
  kUInt8 = 7,
  kBool = 8,
};

inline constexpr int kNumDTypes = 9;

std::size_t dtype_size(DType dtype) noexcept;
const char* dtype_name(DType dtype) noexcept;
bool dtype_is_floating(DType dtype) noexcept;

// Throws InvalidArgument naming the DLPack code/bits/lanes when unsupported.
DType dtype_from_dlpack(DLDataType dl);
DLDataType dtype_to_dlpack(DType dtype) noexcept;

}  // namespace concord
