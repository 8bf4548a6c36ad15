// StoreServer: one thread, one poll() loop, non-blocking sockets.
//
// GET and WAIT never block the loop: a request whose keys are missing becomes
// a waiter, answered when a SET/ADD creates the last missing key or when its
// deadline passes.
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <map>
#include <set>
#include <thread>
#include <unordered_map>

#include "base/format.hpp"
#include "rendezvous/store.hpp"
#include "rendezvous/store_wire.hpp"

namespace concord {
namespace {

using wire::Clock;
using wire::close_fd;
using wire::Deadline;
using wire::endpoint;
using wire::Frame;
using wire::Op;

constexpr const char* kWrongToken = "store refused the connection: wrong job token";
// When accept() runs out of descriptors, retry later instead of spinning.
constexpr auto kAcceptBackoff = std::chrono::milliseconds(100);
constexpr std::size_t kReadChunk = std::size_t{64} * 1024;

// Runs in time that depends on the length of `given` only, so a client cannot
// learn the token byte by byte from response times.
bool tokens_equal(std::string_view expected, std::string_view given) {
  unsigned diff = expected.size() != given.size() ? 1u : 0u;
  for (std::size_t i = 0; i < given.size(); ++i) {
    unsigned char e =
        expected.empty() ? 0 : static_cast<unsigned char>(expected[i % expected.size()]);
    diff |= e ^ static_cast<unsigned char>(given[i]);
  }
  return diff == 0;
}

Frame error_frame(StatusCode code, std::string message) {
  return Frame{Op::kError, static_cast<std::int64_t>(code), {std::move(message)}};
}

std::optional<std::int64_t> parse_int64(const std::string& text) {
  std::int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

}  // namespace

struct StoreServer::Impl {
  enum class State {
    kHello,    // token not presented yet
    kReady,    // serving requests
    kWaiting,  // a GET/WAIT waits for keys
    kClosing,  // flushing a last reply, then closed
  };

  struct Conn {
    Conn(int socket, const StoreLimits& limits)
        : fd(socket), decoder(request_checks(limits, &state)),
          deadline(wire::deadline_after(limits.handshake_timeout)) {}
    // The decoder's checks point at `state`.
    Conn(const Conn&) = delete;
    Conn& operator=(const Conn&) = delete;

    int fd;
    State state = State::kHello;
    wire::FrameDecoder decoder;
    std::string out;
    std::size_t out_pos = 0;
    bool dead = false;
    // The waiter, while state == kWaiting.
    Op wait_op = Op::kGet;
    std::vector<std::string> wait_keys;
    std::size_t missing = 0;
    // kHello: when the handshake must be done; kWaiting: when the wait ends.
    Deadline deadline{};
  };

  static wire::FrameChecks request_checks(StoreLimits limits, const State* state);

  Impl(std::string job_token, StoreLimits caps) : token(std::move(job_token)), limits(caps) {}
  ~Impl() {
    for (auto& [id, conn] : conns) close_fd(conn.fd);
    close_fd(listen_fd);
    close_fd(wake_fd);
  }

  void bind(const std::string& host, int requested_port);
  void run() noexcept;
  bool loop_once();
  void serve(std::uint64_t id, short revents);
  int next_timeout_ms() const;
  void accept_all();
  void read_from(std::uint64_t id, Conn& conn);
  void pump(std::uint64_t id, Conn& conn);
  static bool wants_input(const Conn& conn);
  void handle(std::uint64_t id, Conn& conn, Frame& frame);
  void handle_hello(Conn& conn, const Frame& frame);
  void handle_set(Conn& conn, Frame& frame);
  void handle_add(Conn& conn, const Frame& frame);
  void handle_delete(Conn& conn, const Frame& frame);
  void start_wait(std::uint64_t id, Conn& conn, Frame& frame);
  void finish_wait(std::uint64_t id, Conn& conn, Frame reply);
  void unregister_waiter(std::uint64_t id, const Conn& conn);
  void key_created(const std::string& key);
  void key_removed(const std::string& key);
  void expire_waiters();
  void expire_handshakes();
  // Makes room for one more connection that has not shown the token.
  void limit_unauthenticated();
  void reply(Conn& conn, const Frame& frame);
  void flush(Conn& conn);
  void drop(std::uint64_t id, Conn& conn);

  const std::string token;
  const StoreLimits limits;
  int listen_fd = -1;
  int wake_fd = -1;
  int port = 0;
  std::thread thread;
  Deadline accept_paused_until{};

  std::unordered_map<std::string, std::string> data;
  std::map<std::uint64_t, Conn> conns;
  std::uint64_t next_id = 1;
  // key -> connections waiting on it (all of their keys, present or not).
  std::unordered_map<std::string, std::set<std::uint64_t>> waiting_on;
};

// Refuses frames before their bodies are buffered: anything but HELLO from a
// client that has not shown the token, wrong field counts, oversized fields.
wire::FrameChecks StoreServer::Impl::request_checks(StoreLimits limits, const State* state) {
  wire::FrameChecks checks;
  checks.header = [limits, state](Op op, std::uint32_t count,
                                  std::uint64_t payload) -> std::optional<std::string> {
    if (*state == State::kHello && op != Op::kHello)
      return "store refused the connection: it did not start with HELLO";
    if (!wire::is_request(op)) return concat("store expected a request, got ", wire::op_name(op));
    if (op == Op::kWait) return wire::check_wait(count, payload, limits);
    std::uint32_t expected = op == Op::kSet ? 2 : 1;
    if (count != expected)
      return concat("store ", wire::op_name(op), " request has ", count, " fields; expected ",
                    expected);
    return std::nullopt;
  };
  checks.field = [limits](const Frame& partial,
                          std::uint64_t length) -> std::optional<std::string> {
    if (partial.op == Op::kHello) {
      if (length <= limits.max_key_bytes) return std::nullopt;
      return concat("store job token is ", length, " bytes; the cap is ", limits.max_key_bytes);
    }
    if (partial.op == Op::kSet && partial.fields.size() == 1)
      return wire::check_value(partial.fields[0], length, limits);
    return wire::check_key(length, limits);
  };
  return checks;
}

void StoreServer::Impl::bind(const std::string& host, int requested_port) {
  if (host.empty()) invalid_argument("store host must not be empty");
  if (requested_port < 0 || requested_port > 65535)
    invalid_argument("store port ", requested_port, " outside 0..65535");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  std::string service = std::to_string(requested_port);
  if (int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0)
    fail(StatusCode::kUnavailable, "could not resolve the store host '", host,
         "': ", gai_strerror(rc));
  std::string last_error = "no usable address";
  for (addrinfo* ai = found; ai != nullptr && listen_fd < 0; ai = ai->ai_next) {
    int fd =
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
      last_error = std::strerror(errno);
      ::close(fd);
      continue;
    }
    listen_fd = fd;
  }
  ::freeaddrinfo(found);
  if (listen_fd < 0)
    fail(StatusCode::kUnavailable, "could not bind the store to ", endpoint(host, requested_port),
         ": ", last_error);

  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    fail(StatusCode::kUnavailable, "could not read the store's port: ", std::strerror(errno));
  port = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);

  wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd < 0)
    fail(StatusCode::kUnavailable, "could not create an eventfd: ", std::strerror(errno));
}

void StoreServer::Impl::run() noexcept {
  for (;;) {
    try {
      if (!loop_once()) return;
    } catch (...) {
      // Nothing may escape the thread; the next iteration starts afresh.
    }
  }
}

// One poll() and the work it reports; false once the destructor asks to stop.
bool StoreServer::Impl::loop_once() {
  std::vector<pollfd> fds;
  fds.reserve(conns.size() + 2);
  fds.push_back({wake_fd, POLLIN, 0});
  bool accepting = Clock::now() >= accept_paused_until;
  fds.push_back({accepting ? listen_fd : -1, POLLIN, 0});
  std::vector<std::uint64_t> ids;
  ids.reserve(conns.size());
  for (auto& [id, conn] : conns) {
    short events = 0;
    // A connection is read only when its last reply has gone out, so a
    // client that does not read cannot make the server buffer without end.
    // A waiting one is read to notice that its client went away.
    if (wants_input(conn) || conn.state == State::kWaiting) events |= POLLIN;
    if (conn.out_pos < conn.out.size()) events |= POLLOUT;
    fds.push_back({conn.fd, events, 0});
    ids.push_back(id);
  }

  if (::poll(fds.data(), fds.size(), next_timeout_ms()) < 0) return true;  // EINTR: poll again
  if (fds[0].revents != 0) return false;

  expire_waiters();
  expire_handshakes();
  if (fds[1].revents != 0) accept_all();
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (fds[i + 2].revents != 0) serve(ids[i], fds[i + 2].revents);
  }
  for (auto it = conns.begin(); it != conns.end();) {
    auto next = std::next(it);
    if (it->second.dead) drop(it->first, it->second);
    it = next;
  }
  return true;
}

void StoreServer::Impl::serve(std::uint64_t id, short revents) {
  auto it = conns.find(id);
  if (it == conns.end()) return;
  Conn& conn = it->second;
  try {
    if (revents & (POLLOUT | POLLERR | POLLHUP)) flush(conn);
    // Frames already buffered (a reply just went out, or a wait ended) are
    // served before reading more.
    if (!conn.dead) pump(id, conn);
    if (!conn.dead && (revents & (POLLIN | POLLERR | POLLHUP))) read_from(id, conn);
  } catch (...) {
    conn.dead = true;  // e.g. out of memory: lose this client, keep serving
  }
}

int StoreServer::Impl::next_timeout_ms() const {
  std::optional<Deadline> nearest;
  if (Clock::now() < accept_paused_until) nearest = accept_paused_until;
  for (const auto& [id, conn] : conns) {
    const bool timed = conn.state == State::kWaiting || conn.state == State::kHello;
    if (timed && (!nearest || conn.deadline < *nearest)) nearest = conn.deadline;
  }
  return nearest ? wire::poll_timeout_ms(*nearest) : -1;
}

void StoreServer::Impl::accept_all() {
  for (;;) {
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
        accept_paused_until = Clock::now() + kAcceptBackoff;
      return;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    limit_unauthenticated();
    conns.try_emplace(next_id++, fd, limits);
  }
}

bool StoreServer::Impl::wants_input(const Conn& conn) {
  return (conn.state == State::kHello || conn.state == State::kReady) &&
         conn.out_pos == conn.out.size();
}

// Decodes after every chunk, so a refused frame is skipped as it arrives and
// the buffer never holds more than one accepted frame plus one chunk.
void StoreServer::Impl::read_from(std::uint64_t id, Conn& conn) {
  char chunk[kReadChunk];
  for (;;) {
    ssize_t got = ::recv(conn.fd, chunk, sizeof chunk, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    // EOF, a socket error, or bytes during a wait: a client waits for each
    // reply before it sends more.
    if (got <= 0 || conn.state == State::kWaiting) {
      conn.dead = true;
      return;
    }
    conn.decoder.append(chunk, static_cast<std::size_t>(got));
    pump(id, conn);
    if (conn.dead || !wants_input(conn)) return;
  }
}

void StoreServer::Impl::pump(std::uint64_t id, Conn& conn) {
  while (!conn.dead && wants_input(conn)) {
    Frame frame;
    std::string error;
    switch (conn.decoder.next(frame, error)) {
      case wire::FrameDecoder::Event::kNeedMore: return;
      case wire::FrameDecoder::Event::kFrame: handle(id, conn, frame); break;
      case wire::FrameDecoder::Event::kRefused:
        // Until the token is shown, one refusal ends the connection.
        if (conn.state == State::kHello) conn.state = State::kClosing;
        reply(conn, error_frame(StatusCode::kInvalidArgument, std::move(error)));
        break;
      case wire::FrameDecoder::Event::kMalformed:
        conn.state = State::kClosing;
        reply(conn, error_frame(StatusCode::kInvalidArgument,
                                concat("store closed the connection: ", error)));
        return;
    }
  }
}

void StoreServer::Impl::handle(std::uint64_t id, Conn& conn, Frame& frame) {
  if (conn.state == State::kHello) {
    handle_hello(conn, frame);
    return;
  }
  switch (frame.op) {
    case Op::kSet: handle_set(conn, frame); break;
    case Op::kGet:
    case Op::kWait: start_wait(id, conn, frame); break;
    case Op::kAdd: handle_add(conn, frame); break;
    case Op::kDelete: handle_delete(conn, frame); break;
    default:
      reply(conn, error_frame(StatusCode::kInvalidArgument,
                              concat("store got an unexpected ", wire::op_name(frame.op))));
  }
}

void StoreServer::Impl::handle_hello(Conn& conn, const Frame& frame) {
  if (!tokens_equal(token, frame.fields[0])) {
    conn.state = State::kClosing;
    reply(conn, error_frame(StatusCode::kInvalidArgument, kWrongToken));
  } else {
    conn.state = State::kReady;
    reply(conn, Frame{Op::kOk, 0, {}});
  }
}

void StoreServer::Impl::handle_set(Conn& conn, Frame& frame) {
  auto [it, created] =
      data.insert_or_assign(std::move(frame.fields[0]), std::move(frame.fields[1]));
  reply(conn, Frame{Op::kOk, 0, {}});
  if (created) key_created(it->first);
}

void StoreServer::Impl::handle_add(Conn& conn, const Frame& frame) {
  const std::string& key = frame.fields[0];
  std::int64_t current = 0;
  auto it = data.find(key);
  if (it != data.end()) {
    auto parsed = parse_int64(it->second);
    if (!parsed) {
      reply(conn, error_frame(StatusCode::kInvalidArgument,
                              concat("store value for key ", wire::quote_key(key),
                                     " is not an integer, so add cannot update it")));
      return;
    }
    current = *parsed;
  }
  std::int64_t sum = 0;
  if (__builtin_add_overflow(current, frame.arg, &sum)) {
    reply(conn, error_frame(StatusCode::kInvalidArgument,
                            concat("store add of ", frame.arg, " to key ", wire::quote_key(key),
                                   " (", current, ") overflows int64")));
    return;
  }
  bool created = it == data.end();
  data[key] = std::to_string(sum);
  reply(conn, Frame{Op::kOk, sum, {}});
  if (created) key_created(key);
}

void StoreServer::Impl::handle_delete(Conn& conn, const Frame& frame) {
  bool existed = data.erase(frame.fields[0]) > 0;
  reply(conn, Frame{Op::kOk, existed ? 1 : 0, {}});
  if (existed) key_removed(frame.fields[0]);
}

void StoreServer::Impl::start_wait(std::uint64_t id, Conn& conn, Frame& frame) {
  std::set<std::string> unique(std::make_move_iterator(frame.fields.begin()),
                               std::make_move_iterator(frame.fields.end()));
  conn.wait_op = frame.op;
  conn.wait_keys.assign(unique.begin(), unique.end());
  conn.missing = 0;
  for (const auto& key : conn.wait_keys) conn.missing += data.count(key) == 0 ? 1 : 0;
  if (conn.missing == 0) {
    finish_wait(id, conn, Frame{Op::kOk, 0, {}});
    return;
  }
  // Clamp so a huge timeout cannot overflow the clock.
  constexpr std::int64_t kMaxMs = std::int64_t{1} << 40;
  std::int64_t ms = std::clamp<std::int64_t>(frame.arg, 0, kMaxMs);
  conn.deadline = Clock::now() + std::chrono::milliseconds(ms);
  conn.state = State::kWaiting;
  for (const auto& key : conn.wait_keys) waiting_on[key].insert(id);
}

void StoreServer::Impl::unregister_waiter(std::uint64_t id, const Conn& conn) {
  for (const auto& key : conn.wait_keys) {
    auto it = waiting_on.find(key);
    if (it == waiting_on.end()) continue;
    it->second.erase(id);
    if (it->second.empty()) waiting_on.erase(it);
  }
}

void StoreServer::Impl::finish_wait(std::uint64_t id, Conn& conn, Frame reply_frame) {
  unregister_waiter(id, conn);
  if (reply_frame.op == Op::kOk && conn.wait_op == Op::kGet)
    reply_frame.fields.push_back(data.at(conn.wait_keys[0]));
  conn.wait_keys.clear();
  conn.state = State::kReady;
  reply(conn, reply_frame);
}

void StoreServer::Impl::key_created(const std::string& key) {
  auto it = waiting_on.find(key);
  if (it == waiting_on.end()) return;
  std::vector<std::uint64_t> ready;
  for (std::uint64_t id : it->second) {
    Conn& conn = conns.at(id);
    if (--conn.missing == 0) ready.push_back(id);
  }
  for (std::uint64_t id : ready) finish_wait(id, conns.at(id), Frame{Op::kOk, 0, {}});
}

void StoreServer::Impl::key_removed(const std::string& key) {
  auto it = waiting_on.find(key);
  if (it == waiting_on.end()) return;
  for (std::uint64_t id : it->second) ++conns.at(id).missing;
}

void StoreServer::Impl::expire_waiters() {
  Deadline now = Clock::now();
  for (auto& [id, conn] : conns) {
    if (conn.state != State::kWaiting || conn.deadline > now) continue;
    Frame timed_out{Op::kTimedOut, static_cast<std::int64_t>(conn.missing), {}};
    for (const auto& key : conn.wait_keys) {
      if (timed_out.fields.size() == wire::kMaxReportedKeys) break;
      if (data.count(key) == 0) timed_out.fields.push_back(key);
    }
    finish_wait(id, conn, std::move(timed_out));
  }
}

void StoreServer::Impl::expire_handshakes() {
  const Deadline now = Clock::now();
  for (auto it = conns.begin(); it != conns.end();) {
    auto next = std::next(it);
    if (it->second.state == State::kHello && it->second.deadline <= now)
      drop(it->first, it->second);
    it = next;
  }
}

void StoreServer::Impl::limit_unauthenticated() {
  std::size_t waiting = 0;
  auto oldest = conns.end();
  for (auto it = conns.begin(); it != conns.end(); ++it) {
    if (it->second.state != State::kHello) continue;
    ++waiting;
    if (oldest == conns.end()) oldest = it;  // ids grow with time: the first is the oldest
  }
  if (waiting >= std::max<std::size_t>(limits.max_unauthenticated, 1))
    drop(oldest->first, oldest->second);
}

// Queues the reply and sends what the socket takes now; the poll loop sends the rest.
void StoreServer::Impl::reply(Conn& conn, const Frame& frame) {
  conn.out += wire::encode(frame);
  flush(conn);
}

void StoreServer::Impl::flush(Conn& conn) {
  while (conn.out_pos < conn.out.size()) {
    ssize_t sent = ::send(conn.fd, conn.out.data() + conn.out_pos, conn.out.size() - conn.out_pos,
                          MSG_NOSIGNAL);
    if (sent > 0) {
      conn.out_pos += static_cast<std::size_t>(sent);
      continue;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    conn.dead = true;
    return;
  }
  // A large value has gone out: do not keep its buffer for an idle client.
  std::string().swap(conn.out);
  conn.out_pos = 0;
  if (conn.state == State::kClosing) conn.dead = true;
}

void StoreServer::Impl::drop(std::uint64_t id, Conn& conn) {
  if (conn.state == State::kWaiting) unregister_waiter(id, conn);
  close_fd(conn.fd);
  conns.erase(id);
}

StoreServer::StoreServer(const std::string& host, int port, std::string token, StoreLimits limits)
    : impl_(std::make_unique<Impl>(std::move(token), limits)) {
  if (impl_->token.empty())
    invalid_argument("the store is never served without a job token: give it a secret");
  impl_->bind(host, port);
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
}

StoreServer::~StoreServer() {
  std::uint64_t one = 1;
  // The write can only fail if the counter would overflow, which one wake-up cannot do.
  [[maybe_unused]] ssize_t written = ::write(impl_->wake_fd, &one, sizeof one);
  impl_->thread.join();
}

int StoreServer::port() const noexcept { return impl_->port; }

}  // namespace concord
