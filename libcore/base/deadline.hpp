// Deadlines from timeouts in seconds, as every bounded wait computes them.
// An infinite (or huge) timeout means no limit: the deadline saturates about
// 30 years away instead of overflowing the clock, which would put it in the
// past and fail the wait at once.
#pragma once

#include <algorithm>
#include <chrono>

namespace concord {

using SteadyClock = std::chrono::steady_clock;

// Now plus `seconds`; now for NaN or seconds <= 0.
inline SteadyClock::time_point deadline_after(double seconds) {
  constexpr double kLongest = 1e9;  // seconds: no practical limit, far from overflow
  if (!(seconds > 0)) return SteadyClock::now();
  return SteadyClock::now() + std::chrono::duration_cast<SteadyClock::duration>(
                                  std::chrono::duration<double>(std::min(seconds, kLongest)));
}

}  // namespace concord
