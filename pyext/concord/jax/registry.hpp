// The communicators concord.jax's XLA handlers run on, by id.
//
// A traced computation names its communicator by an integer attribute fixed
// when it was traced, and may run long after, on XLA's threads. So a handler
// holds no communicator of its own: each call leases the communicator of its
// id for the time it runs, and one closed since is a clear error instead of
// a dangling pointer. Ids are never reused.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "concord/concord.h"

namespace concord_jax {

class Registry {
  struct Entry {
    explicit Entry(concord_comm_t c) : comm(c) {}
    concord_comm_t comm;
    std::shared_mutex in_use;  // shared by each call running on it, exclusive once it closes
  };

 public:
  // A communicator lent to one call; comm() is nullptr when its id is closed
  // or was never given out.
  class Lease {
   public:
    concord_comm_t comm() const noexcept { return entry_ ? entry_->comm : nullptr; }

   private:
    friend class Registry;
    std::shared_ptr<Entry> entry_;
    std::shared_lock<std::shared_mutex> lock_;  // released before entry_ (declared after it)
  };

  static Registry& instance();

  // Takes ownership of `comm` and returns its new id.
  std::int64_t add(concord_comm_t comm);
  Lease lease(std::int64_t id);
  // Forgets `id`, waits until no call runs on its communicator and hands it
  // back for the caller to destroy (nullptr for an unknown id).
  concord_comm_t remove(std::int64_t id);

 private:
  std::mutex mutex_;
  std::unordered_map<std::int64_t, std::shared_ptr<Entry>> entries_;
  std::int64_t next_id_ = 1;
};

}  // namespace concord_jax
