// Checking errors in tests: the status a call ends with, and substrings of
// its message.
#pragma once

#include <catch2/catch.hpp>

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

// The message of the InvalidArgument that `fn` throws; fails the test when
// it throws nothing or another kind of error.
template <typename Fn>
std::string invalid_argument_message(Fn&& fn) {
  const Status status = status_of(fn);
  if (status.ok()) FAIL("no concord::Error was thrown");
  CHECK(status.code == StatusCode::kInvalidArgument);
  return status.message;
}

}  // namespace concord::testing
