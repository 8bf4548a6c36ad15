// Status codes and the exception type used inside libcore.
// The numeric values are pinned: the C ABI exposes them unchanged.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace concord {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,
  kUnavailable = 2,
  kTimeout = 3,
  kRemote = 4,    // a peer failed, died or aborted
  kMismatch = 5,  // ranks disagree on a collective
  kAborted = 6,   // this communicator was aborted locally
  kOutOfMemory = 7,
  kInternal = 8,
  kInterrupted = 9,  // a blocking call was interrupted (Ctrl-C)
};

// A status as a value: what a finished Work carries.
struct Status {
  StatusCode code = StatusCode::kOk;
  std::string message;

  bool ok() const noexcept { return code == StatusCode::kOk; }
  static Status Ok() { return {}; }
};

// libcore reports failures by throwing Error; the C ABI turns it into a
// status and a thread-local message.
class Error : public std::runtime_error {
 public:
  Error(StatusCode code, std::string message)
      : std::runtime_error(std::move(message)), code_(code) {}
  StatusCode code() const noexcept { return code_; }
  Status status() const { return {code_, what()}; }

 private:
  StatusCode code_;
};

[[noreturn]] void throw_status(const Status& status);

}  // namespace concord
