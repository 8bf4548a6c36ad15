// Handle of an asynchronous collective.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <limits>
#include <mutex>

#include "base/status.hpp"

namespace concord {

class Work {
 public:
  // Returns false if `seconds` passed before the collective finished; an
  // infinite timeout waits until it finished. NaN or negative: InvalidArgument.
  bool wait_for(double seconds);
  // Waits until the collective finished. It ends by itself: every
  // collective is bounded by its communicator's timeout, and a dead peer is
  // detected.
  void wait();
  // wait_for(seconds) that can be interrupted (base/interrupt.hpp): on an
  // interrupt it cancels the collective, waits for it to end and throws
  // Error(kInterrupted) naming `what`.
  bool wait_interruptibly(const char* what,
                          double seconds = std::numeric_limits<double>::infinity());
  bool done() const;
  Status status() const;  // meaningful once done()

  void complete(Status status);
  // What cancels the collective (its communicator's abort); called at most
  // once, and only while the collective has not finished.
  void set_canceller(std::function<void()> cancel);

 private:
  mutable std::mutex mutex_;
  std::condition_variable finished_;
  bool done_ = false;
  Status status_;
  std::function<void()> cancel_;
};

}  // namespace concord
