// Message building for errors: concat("rank ", r, " of ", n).
#pragma once

#include <sstream>
#include <string>
#include <utility>

#include "base/status.hpp"

namespace concord {

template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

template <typename... Args>
[[noreturn]] void fail(StatusCode code, Args&&... args) {
  throw Error(code, concat(std::forward<Args>(args)...));
}

template <typename... Args>
[[noreturn]] void invalid_argument(Args&&... args) {
  fail(StatusCode::kInvalidArgument, std::forward<Args>(args)...);
}

}  // namespace concord
