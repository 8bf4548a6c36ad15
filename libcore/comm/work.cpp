#include "comm/work.hpp"

namespace concord {

bool Work::wait_for(std::chrono::duration<double> timeout) {
  std::unique_lock lock(mutex_);
  return finished_.wait_for(lock, timeout, [this] { return done_; });
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
