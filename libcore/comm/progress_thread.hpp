// Runs a communicator's asynchronous collectives one after another, in the
// order they were issued, on a thread of its own.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace concord {

class ProgressThread {
 public:
  ProgressThread();
  // Runs what is already queued, then stops.
  ~ProgressThread();
  ProgressThread(const ProgressThread&) = delete;
  ProgressThread& operator=(const ProgressThread&) = delete;

  void submit(std::function<void()> task);
  // Tasks submitted and not yet finished (queued or running).
  int outstanding() const noexcept { return outstanding_.load(std::memory_order_acquire); }

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;
  std::atomic<int> outstanding_{0};
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace concord
