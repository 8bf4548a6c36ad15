#include "base/dtype.hpp"

#include "base/format.hpp"

namespace concord {

std::size_t dtype_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kFloat32:
    case DType::kInt32: return 4;
    case DType::kFloat64:
    case DType::kInt64: return 8;
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kBool: return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) noexcept {
  switch (dtype) {
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kInt8: return "int8";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kUInt8: return "uint8";
    case DType::kBool: return "bool";
  }
  return "unknown";
}

bool dtype_is_floating(DType dtype) noexcept {
  return dtype == DType::kFloat16 || dtype == DType::kBFloat16 ||
         dtype == DType::kFloat32 || dtype == DType::kFloat64;
}

namespace {

// "complex64", "float8", "int16x4": the user's name for a DLPack type.
std::string dlpack_type_name(DLDataType dl) {
  const char* kind = "type";
  switch (dl.code) {
    case kDLInt: kind = "int"; break;
    case kDLUInt: kind = "uint"; break;
    case kDLFloat: kind = "float"; break;
    case kDLBfloat: kind = "bfloat"; break;
    case kDLComplex: kind = "complex"; break;
    case kDLBool: kind = "bool"; break;
    case kDLOpaqueHandle: kind = "opaque"; break;
    default: break;
  }
  std::string name = concat(kind, int(dl.bits));
  if (dl.lanes != 1) name += concat("x", dl.lanes);
  return name;
}

}  // namespace

DType dtype_from_dlpack(DLDataType dl) {
  if (dl.lanes == 1) {
    switch (dl.code) {
      case kDLFloat:
        if (dl.bits == 16) return DType::kFloat16;
        if (dl.bits == 32) return DType::kFloat32;
        if (dl.bits == 64) return DType::kFloat64;
        break;
      case kDLBfloat:
        if (dl.bits == 16) return DType::kBFloat16;
        break;
      case kDLInt:
        if (dl.bits == 8) return DType::kInt8;
        if (dl.bits == 32) return DType::kInt32;
        if (dl.bits == 64) return DType::kInt64;
        break;
      case kDLUInt:
        if (dl.bits == 8) return DType::kUInt8;
        break;
      case kDLBool:
        if (dl.bits == 8) return DType::kBool;
        break;
      default:
        break;
    }
  }
  invalid_argument("unsupported dtype ", dlpack_type_name(dl), " (DLPack code ", int(dl.code),
                   ", bits ", int(dl.bits), ", lanes ", dl.lanes,
                   "); supported: float16, bfloat16, float32, float64, int8, int32, int64, "
                   "uint8, bool");
}

DLDataType dtype_to_dlpack(DType dtype) noexcept {
  switch (dtype) {
    case DType::kFloat16: return {kDLFloat, 16, 1};
    case DType::kBFloat16: return {kDLBfloat, 16, 1};
    case DType::kFloat32: return {kDLFloat, 32, 1};
    case DType::kFloat64: return {kDLFloat, 64, 1};
    case DType::kInt8: return {kDLInt, 8, 1};
    case DType::kInt32: return {kDLInt, 32, 1};
    case DType::kInt64: return {kDLInt, 64, 1};
    case DType::kUInt8: return {kDLUInt, 8, 1};
    case DType::kBool: return {kDLBool, 8, 1};
  }
  return {kDLFloat, 32, 1};
}

}  // namespace concord
