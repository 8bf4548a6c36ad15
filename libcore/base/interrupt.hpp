// Interrupting blocking calls (Ctrl-C). A front end that handles signals
// itself (Python does: its handler only sets a flag, read when the
// interpreter runs again) installs a check; every blocking wait of libcore
// asks it about every kInterruptPeriod while waiting, on the thread that
// installed it only, and gives up with Error(kInterrupted) when it answers
// yes. A collective given up that way aborts its communicator, so the peers
// learn at once.
#pragma once

#include <chrono>

#include "base/status.hpp"

namespace concord {

inline constexpr auto kInterruptPeriod = std::chrono::milliseconds(50);

// check(user) returns nonzero when the caller asks blocking calls to stop.
// nullptr removes the check. The calling thread becomes the one it applies to.
using InterruptCheck = int (*)(void* user);
void set_interrupt_check(InterruptCheck check, void* user) noexcept;

// Whether the installed check asks to stop (false on other threads, or
// with none installed).
bool interrupt_requested() noexcept;

// Throws Error(kInterrupted) naming `what` when interrupt_requested().
void throw_if_interrupted(const char* what);

}  // namespace concord
