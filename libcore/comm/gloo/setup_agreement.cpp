#include "comm/gloo/setup_agreement.hpp"

#include <sstream>

#include "base/format.hpp"
#include "base/interrupt.hpp"
#include "rendezvous/store.hpp"

namespace concord::gloo {
namespace {

// A failed rank counts 2^32 (plus one) towards the count of ranks in.
constexpr std::int64_t kFailed = std::int64_t{1} << 32;

}  // namespace

SetupAgreement::SetupAgreement(SharedStore& store, std::string scope, int rank,
                               std::vector<int> names, double timeout_s)
    : store_(store), scope_(std::move(scope)), rank_(rank), names_(std::move(names)),
      timeout_s_(timeout_s) {}

std::optional<Status> SetupAgreement::failure_of_peers() const {
  std::lock_guard lock(store_.mutex);
  if (store_.client->add(scope_ + "/counted", 0) < kFailed) return std::nullopt;
  std::istringstream reason(
      store_.client->get(scope_ + "/failure", std::chrono::duration<double>(timeout_s_)));
  int code = static_cast<int>(StatusCode::kRemote);
  reason >> code;
  std::string text;
  std::getline(reason >> std::ws, text);
  return Status{static_cast<StatusCode>(code), text};
}

void SetupAgreement::check_peers() const {
  if (auto failure = failure_of_peers()) throw_status(*failure);
}

void SetupAgreement::conclude(const std::optional<Status>& failure) const {
  const std::string done_key = scope_ + "/all_counted";
  {
    std::lock_guard lock(store_.mutex);
    StoreClient& store = *store_.client;
    // The reason first: whoever sees the failure bit can read it.
    if (failure)
      store.set(scope_ + "/failure", concat(static_cast<int>(failure->code), " set-up failed on rank ",
                                            names_[rank_], ": ", failure->message));
    const std::int64_t counted = store.add(scope_ + "/counted", failure ? kFailed + 1 : 1);
    if ((counted & (kFailed - 1)) == static_cast<std::int64_t>(names_.size()))
      store.set(done_key, "1");
  }
  if (failure) throw_status(*failure);
  const bool all_counted = wait_for_keys(store_, {done_key}, deadline_after(timeout_s_), [] {});
  if (auto peers = failure_of_peers()) throw_status(*peers);
  if (!all_counted)
    fail(StatusCode::kTimeout, "set-up timed out after ", timeout_s_,
         " s waiting for the other ranks to finish theirs");
}

bool wait_for_keys(SharedStore& store, const std::vector<std::string>& keys,
                   SteadyClock::time_point deadline, const std::function<void()>& between) {
  for (;;) {
    const auto slice = std::min<SteadyClock::duration>(kInterruptPeriod, deadline - SteadyClock::now());
    try {
      std::lock_guard lock(store.mutex);
      store.client->wait(keys, std::chrono::duration<double>(std::max(slice, SteadyClock::duration{})));
      return true;
    } catch (const Error& e) {
      if (e.code() != StatusCode::kTimeout) throw;
    }
    if (SteadyClock::now() >= deadline) return false;
    between();
  }
}

std::string rank_list(std::span<const int> ranks) {
  std::string text;
  for (int r : ranks) text += concat(text.empty() ? "" : ", ", r);
  return text;
}

}  // namespace concord::gloo
