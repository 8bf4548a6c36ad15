#include "comm/shm/futex.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>

namespace concord::shm {

void futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t expected, long timeout_us) noexcept {
  timespec ts{timeout_us / 1000000, (timeout_us % 1000000) * 1000};
  // Not FUTEX_PRIVATE: ranks in other processes wake us.
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr,
          0);
}

void futex_wake_all(std::atomic<std::uint32_t>* word) noexcept {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
          0);
}

}  // namespace concord::shm
