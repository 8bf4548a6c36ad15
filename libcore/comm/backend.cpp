#include "comm/backend.hpp"

#include <algorithm>
#include <memory>
#include <vector>

#include "base/format.hpp"
#include "kernels/cpu/multi_tensor.hpp"

namespace concord {

void Backend::check_device(const char*, const Device&) const {}

std::unique_ptr<Backend> Backend::split(int, int) { return nullptr; }

void Backend::all_reduce_multi(const OpContext& ctx, std::span<const TensorView> tensors,
                               ReduceOp op) {
  std::vector<DType> dtypes;  // in order of first appearance, the same on every rank
  for (const TensorView& t : tensors) {
    if (t.nbytes() >= kMultiPackBelowBytes)
      all_reduce(ctx, t.data, t.data, static_cast<std::size_t>(t.numel), t.dtype, op);
    if (std::find(dtypes.begin(), dtypes.end(), t.dtype) == dtypes.end())
      dtypes.push_back(t.dtype);
  }
  for (DType dtype : dtypes) {
    std::vector<TensorView> packed;
    std::size_t numel = 0;
    for (const TensorView& t : tensors)
      if (t.dtype == dtype && t.numel != 0 && t.nbytes() < kMultiPackBelowBytes) {
        packed.push_back(t);
        numel += static_cast<std::size_t>(t.numel);
      }
    if (numel == 0) continue;
    auto buffer = std::make_unique_for_overwrite<unsigned char[]>(numel * dtype_size(dtype));
    cpu::pack(packed, buffer.get(), dtype, 1.0);
    all_reduce(ctx, buffer.get(), buffer.get(), numel, dtype, op);
    cpu::unpack(buffer.get(), dtype, packed, 1.0);
  }
}

}  // namespace concord
