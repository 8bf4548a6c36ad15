// Checks every backend of CPU tensors must pass, run on a communicator of
// ranks as threads with a given backend choice and host identities (so one
// process stands for ranks on several hosts): results against references
// computed in double precision from every rank's inputs, and agreement,
// timeout and abort behaviour. Each check reports through Catch.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "base/dtype.hpp"
#include "base/reduce_op.hpp"
#include "comm/backend_choice.hpp"

namespace concord::testing {

struct RankLayout {
  BackendChoice choice;
  std::vector<std::string> hosts;  // one a rank
  const char* backend;             // what backend_name() must say

  int nranks() const { return static_cast<int>(hosts.size()); }
  std::string str() const;
};

struct Reduction {
  DType dtype;
  ReduceOp op;
};

// all_reduce of each reduction (none given: every dtype with every op it
// supports) over each of `sizes`, out of place, in place (bitwise the same)
// and, for the last size, asynchronously; every rank gets the same bytes.
void check_all_reduce(const RankLayout& layout, const std::vector<std::size_t>& sizes,
                      std::vector<Reduction> reductions = {});

// all_gather, broadcast from every root and reduce_scatter with every op,
// over every dtype and each of `sizes`.
void check_gather_broadcast_scatter(const RankLayout& layout,
                                    const std::vector<std::size_t>& sizes);

// Asynchronous collectives complete in issue order, a blocking one behind
// them; all_reduce_multi reduces tensors of mixed dtypes and sizes.
void check_async_and_multi(const RankLayout& layout);

// Ranks that disagree (dtype, shape, op, root, kind, sequence number,
// tensor list) all get Mismatch naming what rank 1 called, and the
// communicator stays usable.
void check_mismatches(const RankLayout& layout);

// A rank that never calls leaves every other rank with Timeout naming it:
// those that time out, and one that calls later, from them.
void check_silent_rank(const RankLayout& layout, int silent);

// abort() on rank `aborting` makes the others fail fast with Remote, and
// its own next collective with Aborted.
void check_abort(const RankLayout& layout, int aborting);

// Rank `leaving` leaves (its communicator is destroyed) while the others
// wait for it: they fail fast with Remote naming it.
void check_leaving_rank(const RankLayout& layout, int leaving);

// An interrupt (base/interrupt.hpp) ends rank 0's blocked collective, or
// its wait on the Work of one, at once; the others fail fast with Remote.
void check_interrupt(const RankLayout& layout);

}  // namespace concord::testing
