#include "base/interrupt.hpp"

#include <atomic>
#include <mutex>
#include <thread>

#include "base/format.hpp"

namespace concord {
namespace {

struct Installed {
  InterruptCheck check = nullptr;
  void* user = nullptr;
  std::thread::id thread;
};

std::mutex installed_mutex;
Installed installed;
std::atomic<bool> any_installed{false};

}  // namespace

void set_interrupt_check(InterruptCheck check, void* user) noexcept {
  std::lock_guard lock(installed_mutex);
  installed = {check, user, std::this_thread::get_id()};
  any_installed.store(check != nullptr, std::memory_order_release);
}

bool interrupt_requested() noexcept {
  if (!any_installed.load(std::memory_order_acquire)) return false;
  Installed current;
  {
    std::lock_guard lock(installed_mutex);
    current = installed;
  }
  if (current.check == nullptr || current.thread != std::this_thread::get_id()) return false;
  return current.check(current.user) != 0;
}

void throw_if_interrupted(const char* what) {
  if (interrupt_requested()) fail(StatusCode::kInterrupted, what, ": interrupted");
}

}  // namespace concord
