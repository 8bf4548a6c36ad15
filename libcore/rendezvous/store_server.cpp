// StoreServer: one thread, one epoll loop, non-blocking sockets.
//
// GET and WAIT never block the loop: a request whose keys are missing becomes
// a waiter, answered when a SET/ADD creates the last missing key or when its
// deadline passes.
//
// A job's ranks all connect at once and each makes O(ranks) requests at
// rendezvous, so nothing in the loop may cost O(connections) per request:
// the kernel reports only the sockets that are ready (epoll), deadlines sit
// in ordered sets, and only connections an iteration touched are revisited.
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
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
constexpr int kEventsPerWait = 256;
// epoll tags; connection ids start at 1.
constexpr std::uint64_t kWakeTag = 0;
constexpr std::uint64_t kListenTag = ~std::uint64_t{0};

// The store holds a descriptor for every rank of the job, and the soft
// limit (often 1024) is far below the hard one: a rank left in the accept
// queue would never be served and the whole job would wait for it. Raises
// the soft limit towards the hard one; false when it is there already.
bool raise_descriptor_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return false;
  limit.rlim_cur = limit.rlim_max == RLIM_INFINITY
                       ? limit.rlim_cur * 2
                       : std::min(limit.rlim_max, std::max<rlim_t>(limit.rlim_cur * 2, 64));
  return ::setrlimit(RLIMIT_NOFILE, &limit) == 0;
}

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
    Conn(std::uint64_t conn_id, int socket, const StoreLimits& limits)
        : id(conn_id), fd(socket), decoder(request_checks(limits, &state)),
          deadline(wire::deadline_after(limits.handshake_timeout)) {}
    // The decoder's checks point at `state`.
    Conn(const Conn&) = delete;
    Conn& operator=(const Conn&) = delete;

    std::uint64_t id;
    int fd;
    State state = State::kHello;
    wire::FrameDecoder decoder;
    std::string out;
    std::size_t out_pos = 0;
    bool dead = false;     // dropped at the end of the loop's iteration
    bool touched = false;  // its epoll interest is brought up to date then
    std::uint32_t interest = EPOLLIN;
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
    close_fd(epoll_fd);
  }

  void bind(const std::string& host, int requested_port);
  void run() noexcept;
  bool loop_once();
  void serve(std::uint64_t id, std::uint32_t events);
  int next_timeout_ms() const;
  void accept_all();
  void pause_accepting();
  void resume_accepting();
  void watch(int fd, std::uint32_t events, std::uint64_t tag, int op);
  void mark_dead(Conn& conn);
  void touch(Conn& conn);
  // Every change of state goes here: it keeps `handshakes` and `waits`,
  // which hold the connections in kHello and kWaiting, up to date.
  void set_state(Conn& conn, State next);
  // Reads and writes a connection asks for in its state.
  static std::uint32_t interest_of(const Conn& conn);
  // Drops the dead connections and updates the touched ones' interest.
  void settle();
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
  int epoll_fd = -1;
  int port = 0;
  std::thread thread;
  bool accept_paused = false;
  Deadline accept_paused_until{};
  // (deadline, id) of the connections in kHello (oldest first: their
  // deadlines grow with their ids) and of those in kWaiting.
  std::set<std::pair<Deadline, std::uint64_t>> handshakes;
  std::set<std::pair<Deadline, std::uint64_t>> waits;
  std::vector<std::uint64_t> dying;
  std::vector<std::uint64_t> touched;

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
  epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd < 0)
    fail(StatusCode::kUnavailable, "could not create an epoll instance: ", std::strerror(errno));
  watch(wake_fd, EPOLLIN, kWakeTag, EPOLL_CTL_ADD);
  watch(listen_fd, EPOLLIN, kListenTag, EPOLL_CTL_ADD);
}

void StoreServer::Impl::watch(int fd, std::uint32_t events, std::uint64_t tag, int op) {
  epoll_event event{};
  event.events = events;
  event.data.u64 = tag;
  if (::epoll_ctl(epoll_fd, op, fd, &event) != 0)
    fail(StatusCode::kUnavailable, "store: epoll_ctl failed: ", std::strerror(errno));
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

// One epoll_wait() and the work it reports; false once the destructor asks to stop.
bool StoreServer::Impl::loop_once() {
  if (accept_paused && Clock::now() >= accept_paused_until) resume_accepting();
  epoll_event events[kEventsPerWait];
  const int ready = ::epoll_wait(epoll_fd, events, kEventsPerWait, next_timeout_ms());
  if (ready < 0) return true;  // EINTR: wait again

  expire_waiters();
  expire_handshakes();
  for (int i = 0; i < ready; ++i) {
    const std::uint64_t tag = events[i].data.u64;
    if (tag == kWakeTag) return false;
    if (tag == kListenTag) {
      accept_all();
    } else {
      serve(tag, events[i].events);
    }
  }
  settle();
  return true;
}

void StoreServer::Impl::settle() {
  for (std::uint64_t id : dying)
    if (auto it = conns.find(id); it != conns.end()) drop(id, it->second);
  dying.clear();
  for (std::uint64_t id : touched) {
    auto it = conns.find(id);
    if (it == conns.end()) continue;
    Conn& conn = it->second;
    conn.touched = false;
    const std::uint32_t wanted = interest_of(conn);
    if (wanted == conn.interest) continue;
    epoll_event event{};
    event.events = wanted;
    event.data.u64 = id;
    if (::epoll_ctl(epoll_fd, EPOLL_CTL_MOD, conn.fd, &event) == 0) {
      conn.interest = wanted;
    } else {
      drop(id, conn);
    }
  }
  touched.clear();
}

std::uint32_t StoreServer::Impl::interest_of(const Conn& conn) {
  std::uint32_t events = 0;
  // A connection is read only when its last reply has gone out, so a
  // client that does not read cannot make the server buffer without end.
  // A waiting one is read to notice that its client went away.
  if (wants_input(conn) || conn.state == State::kWaiting) events |= EPOLLIN;
  if (conn.out_pos < conn.out.size()) events |= EPOLLOUT;
  return events;
}

void StoreServer::Impl::set_state(Conn& conn, State next) {
  if (conn.state == State::kHello) handshakes.erase({conn.deadline, conn.id});
  if (conn.state == State::kWaiting) waits.erase({conn.deadline, conn.id});
  conn.state = next;
  if (next == State::kWaiting) waits.emplace(conn.deadline, conn.id);
}

void StoreServer::Impl::mark_dead(Conn& conn) {
  if (conn.dead) return;
  conn.dead = true;
  dying.push_back(conn.id);
}

void StoreServer::Impl::touch(Conn& conn) {
  if (conn.touched) return;
  conn.touched = true;
  touched.push_back(conn.id);
}

void StoreServer::Impl::serve(std::uint64_t id, std::uint32_t events) {
  auto it = conns.find(id);
  // Dropped or condemned earlier in this iteration.
  if (it == conns.end() || it->second.dead) return;
  Conn& conn = it->second;
  touch(conn);
  try {
    if (events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) flush(conn);
    // Frames already buffered (a reply just went out, or a wait ended) are
    // served before reading more.
    if (!conn.dead) pump(id, conn);
    if (!conn.dead && (events & (EPOLLIN | EPOLLERR | EPOLLHUP))) read_from(id, conn);
  } catch (...) {
    mark_dead(conn);  // e.g. out of memory: lose this client, keep serving
  }
}

int StoreServer::Impl::next_timeout_ms() const {
  std::optional<Deadline> nearest;
  if (accept_paused) nearest = accept_paused_until;
  for (const auto* timers : {&handshakes, &waits})
    if (!timers->empty() && (!nearest || timers->begin()->first < *nearest))
      nearest = timers->begin()->first;
  return nearest ? wire::poll_timeout_ms(*nearest) : -1;
}

void StoreServer::Impl::pause_accepting() {
  accept_paused_until = Clock::now() + kAcceptBackoff;
  if (!accept_paused) watch(listen_fd, 0, kListenTag, EPOLL_CTL_MOD);
  accept_paused = true;
}

void StoreServer::Impl::resume_accepting() {
  watch(listen_fd, EPOLLIN, kListenTag, EPOLL_CTL_MOD);
  accept_paused = false;
}

void StoreServer::Impl::accept_all() {
  for (;;) {
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE && raise_descriptor_limit()) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
        pause_accepting();
      return;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    limit_unauthenticated();
    const std::uint64_t id = next_id++;
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = id;
    if (::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &event) != 0) {
      ::close(fd);
      continue;
    }
    Conn& conn = conns.try_emplace(id, id, fd, limits).first->second;
    handshakes.emplace(conn.deadline, id);
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
      mark_dead(conn);
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
        if (conn.state == State::kHello) set_state(conn, State::kClosing);
        reply(conn, error_frame(StatusCode::kInvalidArgument, std::move(error)));
        break;
      case wire::FrameDecoder::Event::kMalformed:
        set_state(conn, State::kClosing);
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
    set_state(conn, State::kClosing);
    reply(conn, error_frame(StatusCode::kInvalidArgument, kWrongToken));
  } else {
    set_state(conn, State::kReady);
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
  set_state(conn, State::kWaiting);
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
  set_state(conn, State::kReady);
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
  const Deadline now = Clock::now();
  while (!waits.empty() && waits.begin()->first <= now) {
    const std::uint64_t id = waits.begin()->second;
    Conn& conn = conns.at(id);
    Frame timed_out{Op::kTimedOut, static_cast<std::int64_t>(conn.missing), {}};
    for (const auto& key : conn.wait_keys) {
      if (timed_out.fields.size() == wire::kMaxReportedKeys) break;
      if (data.count(key) == 0) timed_out.fields.push_back(key);
    }
    finish_wait(id, conn, std::move(timed_out));  // takes it out of `waits`
  }
}

void StoreServer::Impl::expire_handshakes() {
  const Deadline now = Clock::now();
  while (!handshakes.empty() && handshakes.begin()->first <= now) {
    const std::uint64_t id = handshakes.begin()->second;
    drop(id, conns.at(id));  // takes it out of `handshakes`
  }
}

void StoreServer::Impl::limit_unauthenticated() {
  if (handshakes.size() < std::max<std::size_t>(limits.max_unauthenticated, 1)) return;
  const std::uint64_t oldest = handshakes.begin()->second;
  drop(oldest, conns.at(oldest));
}

// Queues the reply and sends what the socket takes now; the loop sends the rest.
void StoreServer::Impl::reply(Conn& conn, const Frame& frame) {
  touch(conn);
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
    mark_dead(conn);
    return;
  }
  // A large value has gone out: do not keep its buffer for an idle client.
  std::string().swap(conn.out);
  conn.out_pos = 0;
  if (conn.state == State::kClosing) mark_dead(conn);
}

void StoreServer::Impl::drop(std::uint64_t id, Conn& conn) {
  if (conn.state == State::kWaiting) unregister_waiter(id, conn);
  set_state(conn, State::kClosing);
  close_fd(conn.fd);  // also leaves the epoll set
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
