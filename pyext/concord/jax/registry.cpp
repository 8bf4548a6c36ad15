#include "registry.hpp"

#include <new>

namespace concord_jax {

Registry& Registry::instance() {
  static Registry registry;
  return registry;
}

std::int64_t Registry::add(concord_comm_t comm) {
  auto entry = std::make_shared<Entry>(comm);
  std::lock_guard lock(mutex_);
  const std::int64_t id = next_id_++;
  entries_.emplace(id, std::move(entry));
  return id;
}

Registry::Lease Registry::lease(std::int64_t id) {
  Lease lease;
  std::lock_guard lock(mutex_);
  const auto found = entries_.find(id);
  if (found == entries_.end()) return lease;
  // Taken under mutex_: remove() erases the entry under it before it takes
  // in_use exclusively, so an entry still found here is never closing and
  // this never blocks.
  lease.entry_ = found->second;
  lease.lock_ = std::shared_lock(lease.entry_->in_use);
  return lease;
}

concord_comm_t Registry::remove(std::int64_t id) {
  std::shared_ptr<Entry> entry;
  {
    std::lock_guard lock(mutex_);
    const auto found = entries_.find(id);
    if (found == entries_.end()) return nullptr;
    entry = std::move(found->second);
    entries_.erase(found);
  }
  std::unique_lock drained(entry->in_use);  // every call on it has returned
  return entry->comm;
}

}  // namespace concord_jax

// ---- what Python calls (through ctypes) ------------------------------------------

extern "C" {

// concord.jax's own communicator over the ranks of `parent` (a split of it,
// collective over it): XLA runs the handlers on its own threads, so their
// collectives must not share an issue order with the caller's eager ones.
__attribute__((visibility("default"))) concord_status concord_jax_attach(concord_comm_t parent,
                                                                         std::int64_t* id) {
  int rank = 0;
  concord_status status = concord_comm_rank(parent, &rank);
  if (status != CONCORD_OK) return status;
  concord_comm_t comm = nullptr;
  status = concord_comm_split(parent, 0, rank, &comm);
  if (status != CONCORD_OK) return status;
  try {
    *id = concord_jax::Registry::instance().add(comm);
  } catch (const std::bad_alloc&) {
    concord_comm_destroy(comm);
    return CONCORD_ERR_OUT_OF_MEMORY;
  }
  return CONCORD_OK;
}

// Closes the communicator of `id` once the calls running on it returned;
// later calls naming `id` fail.
__attribute__((visibility("default"))) void concord_jax_detach(std::int64_t id) {
  concord_comm_destroy(concord_jax::Registry::instance().remove(id));
}

}  // extern "C"
