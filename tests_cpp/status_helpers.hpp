// Checking errors in tests: the status a call ends with, and substrings of
// its message.
#pragma once

#include <string>

#include "base/status.hpp"

namespace concord::testing {

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The status `f()` ends with: OK, or the code and message of the Error it threw.
template <typename F>
Status status_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.status();
  }
  return Status::Ok();
}

}  // namespace concord::testing
