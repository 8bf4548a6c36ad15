#include "base/reduce_op.hpp"

#include "base/format.hpp"

namespace concord {

const char* reduce_op_name(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kProd: return "prod";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMean: return "mean";
  }
  return "unknown";
}

bool reduce_op_supported(ReduceOp op, DType dtype) noexcept {
  switch (op) {
    case ReduceOp::kMax:
    case ReduceOp::kMin: return true;
    case ReduceOp::kSum:
    case ReduceOp::kProd:
    case ReduceOp::kMean: return dtype != DType::kBool;
  }
  return false;
}

void check_reduce_op(ReduceOp op, DType dtype) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kProd:
    case ReduceOp::kMax:
    case ReduceOp::kMin:
    case ReduceOp::kMean: break;
    default: invalid_argument("unknown reduction op ", static_cast<int>(op));
  }
  if (!reduce_op_supported(op, dtype))
    invalid_argument("reduction '", reduce_op_name(op), "' is not supported for dtype ",
                     dtype_name(dtype), "; ", dtype_name(dtype), " supports max and min");
}

}  // namespace concord
