#include "comm/work.hpp"

#include "base/deadline.hpp"
#include "base/format.hpp"
#include "base/interrupt.hpp"

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

bool Work::wait_interruptibly(const char* what, double seconds) {
  if (!(seconds >= 0)) invalid_argument("a wait's timeout must be >= 0 seconds, got ", seconds);
  const auto deadline = deadline_after(seconds);
  std::unique_lock lock(mutex_);
  for (;;) {
    const auto slice = std::min(deadline, SteadyClock::now() + kInterruptPeriod);
    if (finished_.wait_until(lock, slice, [this] { return done_; })) return true;
    if (SteadyClock::now() >= deadline) return false;
    lock.unlock();
    const bool interrupted = interrupt_requested();
    lock.lock();
    if (!interrupted) continue;
    if (!done_ && cancel_) std::exchange(cancel_, nullptr)();
    finished_.wait(lock, [this] { return done_; });  // the abort ends it promptly
    fail(StatusCode::kInterrupted, what, ": interrupted");
  }
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
    cancel_ = nullptr;
  }
  finished_.notify_all();
}

void Work::set_canceller(std::function<void()> cancel) {
  std::lock_guard lock(mutex_);
  if (!done_) cancel_ = std::move(cancel);
}

}  // namespace concord
