#include "comm/work.hpp"

#include "base/deadline.hpp"
#include "base/format.hpp"

namespace concord {

bool Work::wait_for(double seconds) {
  if (!(seconds >= 0)) invalid_argument("a wait's timeout must be >= 0 seconds, got ", seconds);
  std::unique_lock lock(mutex_);
  return finished_.wait_until(lock, deadline_after(seconds), [this] { return done_; });
}

void Work::wait() {
  std::unique_lock lock(mutex_);
  finished_.wait(lock, [this] { return done_; });
}

bool Work::done() const {
  std::lock_guard lock(mutex_);
  return done_;
}

Status Work::status() const {
  std::lock_guard lock(mutex_);
  return status_;
}

void Work::complete(Status status) {
  {
    std::lock_guard lock(mutex_);
    status_ = std::move(status);
    done_ = true;
  }
  finished_.notify_all();
}

}  // namespace concord
