#include "rendezvous/store_wire.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>

#include "base/deadline.hpp"
#include "base/format.hpp"
#include "base/interrupt.hpp"

namespace concord::wire {
namespace {

void put_u32(std::string& out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8)
    out.push_back(static_cast<char>((v >> shift) & 0xff));
}

void put_u64(std::string& out, std::uint64_t v) {
  for (int shift = 56; shift >= 0; shift -= 8)
    out.push_back(static_cast<char>((v >> shift) & 0xff));
}

std::uint64_t get_be(const char* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

bool is_known_op(std::uint8_t op) {
  return (op >= static_cast<std::uint8_t>(Op::kHello) &&
          op <= static_cast<std::uint8_t>(Op::kDelete)) ||
         (op >= static_cast<std::uint8_t>(Op::kOk) &&
          op <= static_cast<std::uint8_t>(Op::kTimedOut));
}

// A decoder's buffer may have held a large value; do not keep that much
// memory per idle connection.
constexpr std::size_t kKeptBufferCapacity = 1u << 20;

// Blocks until fd is ready for `events` or the deadline passes.
IoResult wait_ready(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd pfd{fd, events, 0};
    const Deadline slice = std::min(deadline, Clock::now() + kInterruptPeriod);
    int rc = ::poll(&pfd, 1, poll_timeout_ms(slice));
    if (rc < 0) {
      if (errno == EINTR) continue;
      return IoResult::kClosed;
    }
    if (rc == 0) {
      if (Clock::now() >= deadline) return IoResult::kTimeout;
      if (interrupt_requested()) return IoResult::kInterrupted;
      continue;
    }
    if (pfd.revents & POLLNVAL) return IoResult::kClosed;
    // POLLERR / POLLHUP: the next send/recv reports what happened.
    return IoResult::kOk;
  }
}

}  // namespace

bool is_request(Op op) noexcept { return op >= Op::kHello && op <= Op::kDelete; }

const char* op_name(Op op) noexcept {
  switch (op) {
    case Op::kHello: return "HELLO";
    case Op::kSet: return "SET";
    case Op::kGet: return "GET";
    case Op::kWait: return "WAIT";
    case Op::kAdd: return "ADD";
    case Op::kDelete: return "DELETE";
    case Op::kOk: return "OK";
    case Op::kError: return "ERROR";
    case Op::kTimedOut: return "TIMED_OUT";
  }
  return "UNKNOWN";
}

std::string encode(const Frame& frame) {
  std::uint64_t payload = 0;
  for (const auto& field : frame.fields) payload += kLengthBytes + field.size();
  std::string out;
  out.reserve(kHeaderBytes + payload);
  put_u32(out, kMagic);
  out.push_back(static_cast<char>(frame.op));
  out.append(3, '\0');
  put_u32(out, static_cast<std::uint32_t>(frame.fields.size()));
  put_u64(out, payload);
  put_u64(out, static_cast<std::uint64_t>(frame.arg));
  for (const auto& field : frame.fields) {
    put_u64(out, field.size());
    out.append(field);
  }
  return out;
}

FrameDecoder::FrameDecoder(FrameChecks checks) : checks_(std::move(checks)) {}

void FrameDecoder::append(const char* data, std::size_t size) {
  std::size_t skipped = static_cast<std::size_t>(std::min<std::uint64_t>(skip_, size));
  skip_ -= skipped;
  buffer_.append(data + skipped, size - skipped);
}

void FrameDecoder::consume(std::size_t bytes) noexcept { pos_ += bytes; }

void FrameDecoder::start_skip(std::uint64_t frame_bytes_left) {
  std::size_t now =
      static_cast<std::size_t>(std::min<std::uint64_t>(frame_bytes_left, available()));
  consume(now);
  skip_ = frame_bytes_left - now;
  stage_ = Stage::kHeader;
  partial_ = Frame{};
  compact();
}

void FrameDecoder::compact() {
  if (pos_ == buffer_.size()) {
    if (buffer_.capacity() > kKeptBufferCapacity) {
      std::string().swap(buffer_);
    } else {
      buffer_.clear();
    }
    pos_ = 0;
  } else if (pos_ > buffer_.size() / 2) {
    buffer_.erase(0, pos_);
    pos_ = 0;
  }
}

FrameDecoder::Event FrameDecoder::next(Frame& frame, std::string& error) {
  for (;;) {
    switch (stage_) {
      case Stage::kHeader: {
        if (available() < kHeaderBytes) {
          compact();
          return Event::kNeedMore;
        }
        const char* h = buffer_.data() + pos_;
        auto magic = static_cast<std::uint32_t>(get_be(h, 4));
        auto op = static_cast<std::uint8_t>(h[4]);
        auto reserved = get_be(h + 5, 3);
        auto count = static_cast<std::uint32_t>(get_be(h + 8, 4));
        std::uint64_t payload = get_be(h + 12, 8);
        auto arg = static_cast<std::int64_t>(get_be(h + 20, 8));
        consume(kHeaderBytes);
        if (magic != kMagic || reserved != 0) {
          error = "not a store frame (bad magic or reserved bytes)";
          return Event::kMalformed;
        }
        if (!is_known_op(op)) {
          error = concat("unknown frame type ", int{op});
          return Event::kMalformed;
        }
        if (std::uint64_t{count} * kLengthBytes > payload) {
          error = concat("frame declares ", count, " fields in ", payload, " payload bytes");
          return Event::kMalformed;
        }
        partial_ = Frame{static_cast<Op>(op), arg, {}};
        fields_expected_ = count;
        payload_left_ = payload;
        if (checks_.header) {
          if (auto why = checks_.header(partial_.op, count, payload)) {
            error = std::move(*why);
            start_skip(payload);
            return Event::kRefused;
          }
        }
        partial_.fields.reserve(std::min<std::uint32_t>(count, 1024));
        stage_ = Stage::kFieldLength;
        break;
      }
      case Stage::kFieldLength: {
        if (partial_.fields.size() == fields_expected_) {
          if (payload_left_ != 0) {
            error = concat("frame has ", payload_left_, " payload bytes beyond its fields");
            return Event::kMalformed;
          }
          frame = std::move(partial_);
          partial_ = Frame{};
          stage_ = Stage::kHeader;
          return Event::kFrame;
        }
        if (available() < kLengthBytes) {
          compact();
          return Event::kNeedMore;
        }
        std::uint64_t length = get_be(buffer_.data() + pos_, kLengthBytes);
        consume(kLengthBytes);
        payload_left_ -= kLengthBytes;  // count * 8 <= payload was checked
        if (length > payload_left_) {
          error = concat("frame field of ", length, " bytes overruns its payload");
          return Event::kMalformed;
        }
        if (checks_.field) {
          if (auto why = checks_.field(partial_, length)) {
            error = std::move(*why);
            start_skip(payload_left_);
            return Event::kRefused;
          }
        }
        field_bytes_ = length;
        stage_ = Stage::kFieldBody;
        break;
      }
      case Stage::kFieldBody: {
        if (available() < field_bytes_) {
          compact();
          return Event::kNeedMore;
        }
        partial_.fields.emplace_back(buffer_.data() + pos_, static_cast<std::size_t>(field_bytes_));
        consume(static_cast<std::size_t>(field_bytes_));
        payload_left_ -= field_bytes_;
        stage_ = Stage::kFieldLength;
        break;
      }
    }
  }
}

std::optional<std::string> check_key(std::uint64_t key_bytes, const StoreLimits& limits) {
  if (key_bytes <= limits.max_key_bytes) return std::nullopt;
  return concat("store key is ", key_bytes, " bytes; the cap is ", limits.max_key_bytes);
}

std::optional<std::string> check_value(std::string_view key, std::uint64_t value_bytes,
                                       const StoreLimits& limits) {
  if (value_bytes <= limits.max_value_bytes) return std::nullopt;
  return concat("store value for key ", quote_key(key), " is ", value_bytes, " bytes; the cap is ",
                limits.max_value_bytes);
}

std::optional<std::string> check_wait(std::uint64_t key_count, std::uint64_t payload_bytes,
                                      const StoreLimits& limits) {
  if (key_count > kMaxWaitKeys)
    return concat("store wait lists ", key_count, " keys; the cap is ", kMaxWaitKeys);
  if (payload_bytes > limits.max_value_bytes)
    return concat("store wait request is ", payload_bytes, " bytes; the cap is ",
                  limits.max_value_bytes);
  return std::nullopt;
}

std::uint64_t wait_payload_bytes(const std::vector<std::string>& keys) {
  std::uint64_t total = 0;
  for (const auto& key : keys) total += kLengthBytes + key.size();
  return total;
}

std::string quote_key(std::string_view key) {
  constexpr std::size_t kShown = 64;
  static const char kHex[] = "0123456789abcdef";
  std::string out = "'";
  for (std::size_t i = 0; i < key.size() && i < kShown; ++i) {
    auto c = static_cast<unsigned char>(key[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out.push_back(static_cast<char>(c));
    } else {
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xf]);
    }
  }
  if (key.size() > kShown) out += "...";
  out.push_back('\'');
  return out;
}

Deadline deadline_after(std::chrono::duration<double> seconds) {
  return concord::deadline_after(seconds.count());
}

int poll_timeout_ms(Deadline deadline) {
  auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<long long>(ms, INT_MAX));
}

std::string endpoint(const std::string& host, int port) {
  bool ipv6 = host.find(':') != std::string::npos;
  return ipv6 ? concat('[', host, "]:", port) : concat(host, ':', port);
}

void close_fd(int& fd) noexcept {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

IoResult send_all(int fd, std::string_view data, Deadline deadline) {
  while (!data.empty()) {
    ssize_t sent = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (sent > 0) {
      data.remove_prefix(static_cast<std::size_t>(sent));
      continue;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      IoResult ready = wait_ready(fd, POLLOUT, deadline);
      if (ready != IoResult::kOk) return ready;
      continue;
    }
    return IoResult::kClosed;
  }
  return IoResult::kOk;
}

IoResult recv_some(int fd, char* buffer, std::size_t capacity, std::size_t& received,
                   Deadline deadline) {
  for (;;) {
    ssize_t got = ::recv(fd, buffer, capacity, 0);
    if (got > 0) {
      received = static_cast<std::size_t>(got);
      return IoResult::kOk;
    }
    if (got == 0) return IoResult::kClosed;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return IoResult::kClosed;
    IoResult ready = wait_ready(fd, POLLIN, deadline);
    if (ready != IoResult::kOk) return ready;
  }
}

IoResult read_frame(int fd, FrameDecoder& decoder, Deadline deadline, Frame& frame,
                    std::string& error) {
  char chunk[64 * 1024];
  for (;;) {
    switch (decoder.next(frame, error)) {
      case FrameDecoder::Event::kFrame: return IoResult::kOk;
      case FrameDecoder::Event::kRefused:
      case FrameDecoder::Event::kMalformed: return IoResult::kBadFrame;
      case FrameDecoder::Event::kNeedMore: break;
    }
    std::size_t received = 0;
    IoResult result = recv_some(fd, chunk, sizeof chunk, received, deadline);
    if (result != IoResult::kOk) return result;
    decoder.append(chunk, received);
  }
}

}  // namespace concord::wire
