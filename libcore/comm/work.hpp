// Handle of an asynchronous collective (DESIGN.md §2: Work).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "base/status.hpp"

namespace concord {

class Work {
 public:
  // Returns false if `timeout` passed before the collective finished.
  bool wait_for(std::chrono::duration<double> timeout);
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
