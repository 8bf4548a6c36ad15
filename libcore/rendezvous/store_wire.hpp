// Wire protocol of the rendezvous store: length-prefixed binary frames over TCP.
//
// A frame is a fixed header followed by `field_count` fields. All integers are
// big-endian.
//
//   offset  size  meaning
//   0       4     magic "CCS1" (the last byte is the protocol version)
//   4       1     op (Op below)
//   5       3     reserved, zero
//   8       4     field count
//   12      8     payload bytes: everything after the header
//   20      8     arg: timeout in ms (GET, WAIT), delta (ADD), result (ADD
//                 reply), existed (DELETE reply), status code (ERROR reply),
//                 missing key count (TIMED_OUT reply)
//   28      ...   fields, each an 8-byte length then that many bytes
//
// Requests and their fields: HELLO [token], SET [key, value], GET [key],
// WAIT [key...], ADD [key], DELETE [key]. Replies: OK (GET: [value]),
// ERROR [message], TIMED_OUT [first missing keys]. Every request gets exactly
// one reply, so a client never has more than one request in flight.
//
// The payload length lets a reader skip a refused frame without buffering it,
// so an oversized value is answered with an error and the stream stays usable.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rendezvous/store.hpp"

namespace concord::wire {

inline constexpr std::uint32_t kMagic = 0x43435331;  // "CCS1"
inline constexpr std::size_t kHeaderBytes = 28;
inline constexpr std::size_t kLengthBytes = 8;
inline constexpr std::uint32_t kMaxWaitKeys = 1u << 16;
// A TIMED_OUT reply lists at most this many of the missing keys.
inline constexpr std::size_t kMaxReportedKeys = 16;

enum class Op : std::uint8_t {
  kHello = 1,
  kSet = 2,
  kGet = 3,
  kWait = 4,
  kAdd = 5,
  kDelete = 6,
  kOk = 64,
  kError = 65,
  kTimedOut = 66,
};

bool is_request(Op op) noexcept;
const char* op_name(Op op) noexcept;

struct Frame {
  Op op = Op::kOk;
  std::int64_t arg = 0;
  std::vector<std::string> fields;
};

std::string encode(const Frame& frame);

// What a reader accepts. Each check returns why the frame is refused, or
// nothing; the reader then reports the refusal and skips the frame's rest.
struct FrameChecks {
  std::function<std::optional<std::string>(Op op, std::uint32_t field_count,
                                           std::uint64_t payload_bytes)>
      header;
  // `partial` holds the fields read so far; `length` is the next field's size,
  // checked before any of its bytes are buffered.
  std::function<std::optional<std::string>(const Frame& partial, std::uint64_t length)> field;
};

// Turns bytes that arrive in arbitrary pieces into frames.
class FrameDecoder {
 public:
  enum class Event {
    kNeedMore,   // no complete frame yet
    kFrame,      // `frame` holds the next frame
    kRefused,    // `error` says why; the frame's remaining bytes are skipped
    kMalformed,  // `error` says why; the stream cannot be trusted any more
  };

  explicit FrameDecoder(FrameChecks checks);

  void append(const char* data, std::size_t size);
  Event next(Frame& frame, std::string& error);

 private:
  enum class Stage { kHeader, kFieldLength, kFieldBody };

  std::size_t available() const noexcept { return buffer_.size() - pos_; }
  void consume(std::size_t bytes) noexcept;
  void start_skip(std::uint64_t frame_bytes_left);
  void compact();

  FrameChecks checks_;
  std::string buffer_;
  std::size_t pos_ = 0;
  std::uint64_t skip_ = 0;  // bytes of a refused frame still to discard
  Stage stage_ = Stage::kHeader;
  Frame partial_;
  std::uint32_t fields_expected_ = 0;
  std::uint64_t payload_left_ = 0;
  std::uint64_t field_bytes_ = 0;
};

// Size checks shared by client and server, so both refuse with the same text.
std::optional<std::string> check_key(std::uint64_t key_bytes, const StoreLimits& limits);
std::optional<std::string> check_value(std::string_view key, std::uint64_t value_bytes,
                                       const StoreLimits& limits);
std::optional<std::string> check_wait(std::uint64_t key_count, std::uint64_t payload_bytes,
                                      const StoreLimits& limits);
std::uint64_t wait_payload_bytes(const std::vector<std::string>& keys);

// 'key' for messages: non-printable bytes escaped, long keys shortened.
std::string quote_key(std::string_view key);

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// Clock::now() + seconds, saturating instead of overflowing.
Deadline deadline_after(std::chrono::duration<double> seconds);

// kClosed covers EOF and socket errors; kBadFrame is a frame the decoder
// refused or could not parse (read_frame only); kInterrupted: the caller
// asked to stop (base/interrupt.hpp).
enum class IoResult { kOk, kTimeout, kClosed, kBadFrame, kInterrupted };

// Blocking I/O on a non-blocking socket: poll() until the deadline, retry on
// EINTR and partial transfers; every kInterruptPeriod it asks whether the
// caller wants to stop.
IoResult send_all(int fd, std::string_view data, Deadline deadline);
// Reads what is available (at least one byte) into buffer[0, capacity).
IoResult recv_some(int fd, char* buffer, std::size_t capacity, std::size_t& received,
                   Deadline deadline);
// Reads until `decoder` yields a frame; `error` explains kBadFrame.
IoResult read_frame(int fd, FrameDecoder& decoder, Deadline deadline, Frame& frame,
                    std::string& error);

// Milliseconds until `deadline` for poll(): 0 when past, rounded up otherwise.
int poll_timeout_ms(Deadline deadline);

// "host:port", with brackets around an IPv6 host.
std::string endpoint(const std::string& host, int port);

// Closes fd if open and marks it closed.
void close_fd(int& fd) noexcept;

}  // namespace concord::wire
