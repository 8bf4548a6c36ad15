#include "base/status.hpp"

namespace concord {

const char* status_code_name(StatusCode code) noexcept {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kUnavailable: return "unavailable";
    case StatusCode::kTimeout: return "timeout";
    case StatusCode::kRemote: return "remote failure";
    case StatusCode::kMismatch: return "mismatch";
    case StatusCode::kAborted: return "aborted";
    case StatusCode::kOutOfMemory: return "out of memory";
    case StatusCode::kInternal: return "internal error";
  }
  return "unknown status";
}

void throw_status(const Status& status) { throw Error(status.code, status.message); }

}  // namespace concord
