// What a rank is about to do, as the ranks of a backend compare it before
// any data moves (comm/backend.hpp's Signature, with the collective and
// its sequence number): ranks that disagree get Mismatch naming what each
// called, never reinterpreted bytes. The shm backend keeps records in its
// segment; the gloo backends send them over the network (between ranks that
// share one byte order).
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "base/format.hpp"
#include "comm/backend.hpp"

namespace concord {

enum class CallKind : std::uint32_t {
  kAllReduce = 1,
  kAllGather,
  kReduceScatter,
  kBroadcast,
  kBarrier,
};

// Extents of a shape a record keeps for messages; its digest covers all.
inline constexpr int kRecordedDims = 4;

struct CallRecord {
  std::uint64_t seq;
  std::uint64_t count;   // elements (bytes for all_gather and broadcast)
  std::uint64_t digest;  // of the full shape, or of all_reduce_multi's tensor list
  std::uint32_t kind;
  std::int32_t dtype;    // -1: none
  std::int32_t op;       // -1: none
  std::int32_t root;     // -1: none
  std::int32_t ndim;
  std::int64_t extents[kRecordedDims];
};
static_assert(std::is_trivially_copyable_v<CallRecord>);

CallRecord record_of(CallKind kind, const OpContext& ctx, std::uint64_t count);

bool same_call(const CallRecord& a, const CallRecord& b) noexcept;

// "all_reduce #3 (float32 shape (2, 3), sum)".
std::string describe(const CallRecord& r);

// Throws Mismatch, naming what every rank whose record differs from
// this rank's called, unless all agree. record(q) is rank q's record and
// name(q) how messages call rank q, for q in [0, nranks).
template <class RecordOf, class NameOf>
void check_agreement(OpLabel label, int rank, int nranks, RecordOf&& record, NameOf&& name) {
  const CallRecord& mine = record(rank);
  std::string disagreeing;
  for (int q = 0; q < nranks; ++q)
    if (!same_call(mine, record(q)))
      disagreeing += concat("; rank ", name(q), " called ", describe(record(q)));
  if (!disagreeing.empty())
    fail(StatusCode::kMismatch, label.name, " #", label.seq,
         ": ranks disagree on the collective: rank ", name(rank), " called ", describe(mine),
         disagreeing);
}

}  // namespace concord
