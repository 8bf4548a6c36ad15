// Gloo's rendezvous store (gloo/rendezvous/store.h) over concord's own:
// gloo's keys live under a communicator's key prefix in the job's store, so
// connecting a mesh needs no other service, and the store's job token
// guards it as it guards every other key. Waits are bounded by the
// communicator's timeout, end at once when a peer's set-up failed, and can
// be interrupted.
#pragma once

#include <gloo/rendezvous/store.h>

#include <string>
#include <vector>

#include "comm/gloo/setup_agreement.hpp"

namespace concord::gloo {

class StoreAdapter final : public ::gloo::rendezvous::Store {
 public:
  // `names[q]` is how messages call rank q.
  StoreAdapter(SharedStore& store, std::string prefix, double timeout_s,
               const SetupAgreement& setup, std::vector<int> names);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::string full(const std::string& key) const { return prefix_ + "/" + key; }

  SharedStore& store_;
  std::string prefix_;
  double timeout_s_;
  const SetupAgreement& setup_;
  std::vector<int> names_;
};

}  // namespace concord::gloo
