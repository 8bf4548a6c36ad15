// Sleeping on a 32-bit word in shared memory (process-shared futex).
#pragma once

#include <atomic>
#include <cstdint>

namespace concord::shm {

// Sleeps while *word == expected, at most timeout_us microseconds.
void futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t expected, long timeout_us) noexcept;
void futex_wake_all(std::atomic<std::uint32_t>* word) noexcept;

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace concord::shm
