// All-or-nothing set-up of a group of ranks: every rank counts itself in,
// whether its set-up succeeded or not; one that succeeded waits until all
// have, then fails if one did, with that rank's reason: no rank returns
// successfully while a peer failed. While a rank is still setting up, its waits ask
// check_peers(), so a failure elsewhere ends them at once rather than at
// the timeout.
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/deadline.hpp"
#include "base/status.hpp"

namespace concord {
struct SharedStore;
}

namespace concord::gloo {

class SetupAgreement {
 public:
  // Ranks [0, size) meeting under key prefix `scope`; `names[q]` is how
  // messages call rank q.
  SetupAgreement(SharedStore& store, std::string scope, int rank, std::vector<int> names,
                 double timeout_s);

  // Throws the failure a peer counted in with, if one did.
  void check_peers() const;
  // Counts this rank in (`failure`: why its set-up failed) and throws that
  // failure; else waits until every rank has counted in and throws a peer's.
  void conclude(const std::optional<Status>& failure) const;

 private:
  std::optional<Status> failure_of_peers() const;

  SharedStore& store_;
  std::string scope_;
  int rank_;
  std::vector<int> names_;
  double timeout_s_;
};

// Waits until every key exists in `store`, in slices of kInterruptPeriod
// that hold the store's mutex only while they last, and calls `between()`
// after each slice (it throws to give up). Returns false at `deadline`.
bool wait_for_keys(SharedStore& store, const std::vector<std::string>& keys,
                   SteadyClock::time_point deadline, const std::function<void()>& between);

// "0, 2, 5": ranks listed in messages.
std::string rank_list(std::span<const int> ranks);

}  // namespace concord::gloo
