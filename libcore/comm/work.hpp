// Handle of an asynchronous collective.
#pragma once

#include <chrono>
#include <condition_variable>
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
  bool done() const;
  Status status() const;  // meaningful once done()

  void complete(Status status);

 private:
  mutable std::mutex mutex_;
  std::condition_variable finished_;
  bool done_ = false;
  Status status_;
};

}  // namespace concord
