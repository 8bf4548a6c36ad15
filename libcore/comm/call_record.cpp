#include "comm/call_record.hpp"

#include <algorithm>

#include "base/digest.hpp"

namespace concord {
namespace {

const char* kind_name(std::uint32_t kind) {
  switch (static_cast<CallKind>(kind)) {
    case CallKind::kAllReduce: return "all_reduce";
    case CallKind::kAllGather: return "all_gather";
    case CallKind::kReduceScatter: return "reduce_scatter";
    case CallKind::kBroadcast: return "broadcast";
    case CallKind::kBarrier: return "barrier";
  }
  return "unknown";
}

// "shape (2, 3)", from the extents a record keeps.
std::string shape_text(const CallRecord& r) {
  if (r.ndim > kRecordedDims) return concat("a ", r.ndim, "-d shape");
  return concat("shape ", Shape(r.extents, static_cast<std::size_t>(r.ndim)).str());
}

}  // namespace

CallRecord record_of(CallKind kind, const OpContext& ctx, std::uint64_t count) {
  const Signature& sig = ctx.signature;
  CallRecord r{};
  r.seq = ctx.label.seq;
  r.count = count;
  if (sig.dtype >= 0) {
    Digest digest;
    digest.mix(static_cast<std::uint64_t>(sig.shape.ndim()));
    for (std::int64_t extent : sig.shape) digest.mix(static_cast<std::uint64_t>(extent));
    r.digest = digest.value();
  } else {
    r.digest = sig.layout;
  }
  r.kind = static_cast<std::uint32_t>(kind);
  r.dtype = sig.dtype;
  r.op = sig.op;
  r.root = sig.root;
  r.ndim = sig.shape.ndim();
  std::copy_n(sig.shape.begin(), std::min(r.ndim, kRecordedDims), r.extents);
  return r;
}

bool same_call(const CallRecord& a, const CallRecord& b) noexcept {
  return a.seq == b.seq && a.count == b.count && a.digest == b.digest && a.kind == b.kind &&
         a.dtype == b.dtype && a.op == b.op && a.root == b.root && a.ndim == b.ndim;
}

std::string describe(const CallRecord& r) {
  std::string text = concat(kind_name(r.kind), " #", r.seq);
  if (static_cast<CallKind>(r.kind) == CallKind::kBarrier) return text;
  std::string details;
  auto add = [&details](const std::string& part) {
    details += (details.empty() ? "" : ", ") + part;
  };
  if (r.dtype >= 0) add(concat(dtype_name(static_cast<DType>(r.dtype)), " ", shape_text(r)));
  else add(concat("tensor list ", std::hex, r.digest));
  if (r.op >= 0) add(reduce_op_name(static_cast<ReduceOp>(r.op)));
  if (r.root >= 0) add(concat("root ", r.root));
  return text + " (" + details + ")";
}

}  // namespace concord
