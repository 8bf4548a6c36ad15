#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <thread>

#include "base/format.hpp"
#include "base/interrupt.hpp"
#include "rendezvous/store.hpp"
#include "rendezvous/store_wire.hpp"

namespace concord {
namespace {

using wire::Clock;
using wire::close_fd;
using wire::Deadline;
using wire::endpoint;
using wire::Frame;
using wire::IoResult;
using wire::Op;

// How long past its own deadline a call (GET, WAIT, the handshake) waits
// for the server's answer before giving up on the connection.
constexpr std::chrono::seconds kReplyMargin{2};
// SET, ADD and DELETE have no timeout of their own: they wait this long for
// a reply, or the connect timeout if that is longer.
constexpr std::chrono::seconds kMinCallTimeout{60};
constexpr auto kFirstBackoff = std::chrono::milliseconds(10);
constexpr auto kMaxBackoff = std::chrono::milliseconds(500);
// The client checks sizes against the default caps before sending.
const StoreLimits kLimits{};

// Replies are bounded by the largest value plus a short list of keys.
wire::FrameChecks reply_checks() {
  wire::FrameChecks checks;
  checks.header = [](Op op, std::uint32_t count, std::uint64_t) -> std::optional<std::string> {
    if (wire::is_request(op)) return concat("the store sent a request (", wire::op_name(op), ")");
    if (count > wire::kMaxReportedKeys)
      return concat("the store sent a reply with ", count, " fields");
    return std::nullopt;
  };
  checks.field = [](const Frame&, std::uint64_t length) -> std::optional<std::string> {
    std::uint64_t cap = std::max(kLimits.max_value_bytes, kLimits.max_key_bytes);
    if (length <= cap) return std::nullopt;
    return concat("the store sent a field of ", length, " bytes");
  };
  return checks;
}

std::string seconds_text(std::chrono::duration<double> d) { return concat(d.count(), 's'); }

// Milliseconds for the wire, rounded up so a short timeout never becomes 0.
std::int64_t timeout_ms(std::chrono::duration<double> timeout) {
  constexpr double kMaxMs = 1e12;
  double ms = std::ceil(timeout.count() * 1000.0);
  return static_cast<std::int64_t>(std::clamp(ms, 0.0, kMaxMs));
}

void check_timeout(const char* call, std::chrono::duration<double> timeout) {
  if (!(timeout.count() >= 0))
    invalid_argument("store ", call, " timeout must be >= 0 seconds, got ", timeout.count());
}

void check_key_size(const std::string& key) {
  if (auto why = wire::check_key(key.size(), kLimits)) invalid_argument(*why);
}

// "key 'a'" or "keys 'a', 'b' and 3 more", for `total` keys of which `shown` are listed.
std::string keys_text(const std::vector<std::string>& shown, std::int64_t total) {
  std::string out = total == 1 ? "key " : "keys ";
  for (std::size_t i = 0; i < shown.size(); ++i)
    out += (i == 0 ? "" : ", ") + wire::quote_key(shown[i]);
  auto listed = static_cast<std::int64_t>(shown.size());
  if (total > listed) out += concat(" and ", total - listed, " more");
  return out;
}

// Starts a non-blocking connect to one address and waits for it; returns the
// socket or -1 with `error` set.
int connect_one(const addrinfo& ai, Deadline deadline, std::string& error) {
  int fd = ::socket(ai.ai_family, ai.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai.ai_protocol);
  if (fd < 0) {
    error = std::strerror(errno);
    return -1;
  }
  int rc = ::connect(fd, ai.ai_addr, ai.ai_addrlen);
  if (rc != 0 && errno != EINPROGRESS && errno != EINTR) {
    error = std::strerror(errno);
    ::close(fd);
    return -1;
  }
  if (rc != 0) {
    pollfd pfd{fd, POLLOUT, 0};
    int ready = 0;
    do {
      ready = ::poll(&pfd, 1, wire::poll_timeout_ms(deadline));
    } while (ready < 0 && errno == EINTR);
    int so_error = 0;
    socklen_t len = sizeof so_error;
    if (ready <= 0) {
      so_error = ETIMEDOUT;
    } else if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len) != 0) {
      so_error = errno;
    }
    if (so_error != 0) {
      error = std::strerror(so_error);
      ::close(fd);
      return -1;
    }
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

}  // namespace

struct StoreClient::Impl {
  Impl(std::string server_host, int server_port, std::string job_token,
       std::chrono::duration<double> timeout)
      : host(std::move(server_host)),
        port(server_port),
        token(std::move(job_token)),
        connect_timeout(timeout),
        call_timeout(std::max<std::chrono::duration<double>>(timeout, kMinCallTimeout)),
        decoder(reply_checks()) {}
  ~Impl() { close_fd(fd); }

  void connect();
  bool try_address_list(Deadline deadline, std::string& error);
  bool handshake(Deadline connect_deadline, std::string& error);
  // timeout_message() builds the Timeout text, only when it is needed.
  template <typename Message>
  Frame call(const Frame& request, Deadline deadline, Message&& timeout_message);
  Frame call_bounded(const Frame& request, const char* what, const std::string& key);
  [[noreturn]] void lost();

  const std::string host;
  const int port;
  const std::string token;
  const std::chrono::duration<double> connect_timeout;
  const std::chrono::duration<double> call_timeout;
  int fd = -1;
  wire::FrameDecoder decoder;
};

void StoreClient::Impl::connect() {
  if (port < 1 || port > 65535) invalid_argument("store port ", port, " outside 1..65535");
  check_timeout("connect", connect_timeout);
  Deadline deadline = wire::deadline_after(connect_timeout);
  auto backoff = std::chrono::duration_cast<Clock::duration>(kFirstBackoff);
  std::string error = "no attempt finished in time";
  for (;;) {
    if (try_address_list(deadline, error) && handshake(deadline, error)) return;
    close_fd(fd);
    Deadline now = Clock::now();
    if (now >= deadline) break;
    throw_if_interrupted("connecting to the store");
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min<Clock::duration>(backoff * 2, kMaxBackoff);
  }
  fail(StatusCode::kTimeout, "could not reach the store at ", endpoint(host, port), " within ",
       seconds_text(connect_timeout), " (", error, ")");
}

// Resolves on every attempt: the server's name may appear in DNS late.
bool StoreClient::Impl::try_address_list(Deadline deadline, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  std::string service = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    error = gai_strerror(rc);
    return false;
  }
  for (addrinfo* ai = found; ai != nullptr && fd < 0; ai = ai->ai_next)
    fd = connect_one(*ai, deadline, error);
  ::freeaddrinfo(found);
  return fd >= 0;
}

// Presents the token. A refused token is final; a server that closed the
// connection or stayed silent is retried like a refused connection.
bool StoreClient::Impl::handshake(Deadline connect_deadline, std::string& error) {
  Deadline deadline = connect_deadline + kReplyMargin;
  Frame reply;
  IoResult result = wire::send_all(fd, wire::encode(Frame{Op::kHello, 0, {token}}), deadline);
  if (result == IoResult::kOk) result = wire::read_frame(fd, decoder, deadline, reply, error);
  if (result == IoResult::kOk && reply.op == Op::kError) {
    close_fd(fd);
    invalid_argument(reply.fields.empty() ? "store refused the connection" : reply.fields[0]);
  }
  if (result == IoResult::kOk && reply.op == Op::kOk) return true;
  if (result == IoResult::kInterrupted) {
    close_fd(fd);
    fail(StatusCode::kInterrupted, "connecting to the store: interrupted");
  }
  if (result == IoResult::kTimeout) error = "the store accepted but did not answer the handshake";
  if (result == IoResult::kClosed) error = "the store closed the connection during the handshake";
  if (result == IoResult::kOk)
    error = concat("the store answered the handshake with ", wire::op_name(reply.op));
  decoder = wire::FrameDecoder(reply_checks());
  return false;
}

void StoreClient::Impl::lost() {
  close_fd(fd);
  fail(StatusCode::kRemote, "lost the connection to the store at ", endpoint(host, port));
}

// One request, one reply. On a timeout or a broken stream the connection is
// closed: a late reply would otherwise be read as the answer to the next call.
template <typename Message>
Frame StoreClient::Impl::call(const Frame& request, Deadline deadline, Message&& timeout_message) {
  if (fd < 0) lost();
  Frame reply;
  std::string error;
  IoResult result = wire::send_all(fd, wire::encode(request), deadline);
  if (result == IoResult::kOk) result = wire::read_frame(fd, decoder, deadline, reply, error);
  switch (result) {
    case IoResult::kOk: break;
    case IoResult::kTimeout: close_fd(fd); fail(StatusCode::kTimeout, timeout_message());
    case IoResult::kInterrupted:
      close_fd(fd);
      fail(StatusCode::kInterrupted, "a store ", wire::op_name(request.op), ": interrupted");
    case IoResult::kClosed: lost();
    case IoResult::kBadFrame:
      close_fd(fd);
      fail(StatusCode::kRemote, "the store at ", endpoint(host, port),
           " sent a bad reply: ", error);
  }
  if (reply.op == Op::kError) {
    auto code = static_cast<StatusCode>(reply.arg);
    bool known = reply.arg > 0 && reply.arg <= static_cast<std::int64_t>(StatusCode::kInternal);
    std::string message = reply.fields.empty() ? "the store reported an error" : reply.fields[0];
    throw Error(known ? code : StatusCode::kRemote, std::move(message));
  }
  return reply;
}

// SET, ADD and DELETE: bounded by call_timeout.
Frame StoreClient::Impl::call_bounded(const Frame& request, const char* what,
                                      const std::string& key) {
  return call(request, wire::deadline_after(call_timeout), [&] {
    return concat("the store at ", endpoint(host, port), " did not answer ", what, " key ",
                  wire::quote_key(key), " within ", seconds_text(call_timeout));
  });
}

StoreClient::StoreClient(const std::string& host, int port, const std::string& token,
                         std::chrono::duration<double> connect_timeout)
    : impl_(std::make_unique<Impl>(host, port, token, connect_timeout)) {
  impl_->connect();
}

StoreClient::~StoreClient() = default;

void StoreClient::set(const std::string& key, const std::string& value) {
  check_key_size(key);
  if (auto why = wire::check_value(key, value.size(), kLimits)) invalid_argument(*why);
  impl_->call_bounded(Frame{Op::kSet, 0, {key, value}}, "a set of", key);
}

std::string StoreClient::get(const std::string& key, std::chrono::duration<double> timeout) {
  check_key_size(key);
  check_timeout("get", timeout);
  auto timed_out = [&] {
    return concat("timed out after ", seconds_text(timeout), " waiting for store key ",
                  wire::quote_key(key));
  };
  Frame reply = impl_->call(Frame{Op::kGet, timeout_ms(timeout), {key}},
                            wire::deadline_after(timeout + kReplyMargin), timed_out);
  if (reply.op == Op::kTimedOut) fail(StatusCode::kTimeout, timed_out());
  if (reply.op != Op::kOk || reply.fields.size() != 1)
    fail(StatusCode::kRemote, "the store answered a get of key ", wire::quote_key(key),
         " without a value");
  return std::move(reply.fields[0]);
}

void StoreClient::wait(const std::vector<std::string>& keys,
                       std::chrono::duration<double> timeout) {
  for (const auto& key : keys) check_key_size(key);
  check_timeout("wait", timeout);
  if (keys.empty()) return;
  if (auto why = wire::check_wait(keys.size(), wire::wait_payload_bytes(keys), kLimits))
    invalid_argument(*why);
  auto timed_out = [&](const std::vector<std::string>& shown, std::int64_t total) {
    return concat("timed out after ", seconds_text(timeout), " waiting for store ",
                  keys_text(shown, total));
  };
  auto no_answer = [&] {
    auto shown = static_cast<std::ptrdiff_t>(std::min(keys.size(), wire::kMaxReportedKeys));
    return timed_out({keys.begin(), keys.begin() + shown}, static_cast<std::int64_t>(keys.size()));
  };
  Frame reply = impl_->call(Frame{Op::kWait, timeout_ms(timeout), keys},
                            wire::deadline_after(timeout + kReplyMargin), no_answer);
  // The server lists the keys still missing.
  if (reply.op == Op::kTimedOut) fail(StatusCode::kTimeout, timed_out(reply.fields, reply.arg));
}

std::int64_t StoreClient::add(const std::string& key, std::int64_t delta) {
  check_key_size(key);
  return impl_->call_bounded(Frame{Op::kAdd, delta, {key}}, "an add to", key).arg;
}

bool StoreClient::erase(const std::string& key) {
  check_key_size(key);
  return impl_->call_bounded(Frame{Op::kDelete, 0, {key}}, "a delete of", key).arg != 0;
}

const std::string& StoreClient::host() const noexcept { return impl_->host; }

int StoreClient::port() const noexcept { return impl_->port; }

}  // namespace concord
