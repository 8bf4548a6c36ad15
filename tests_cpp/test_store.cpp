#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/status.hpp"
#include "rendezvous/store.hpp"
#include "rendezvous/store_wire.hpp"

using concord::Error;
using concord::StatusCode;
using concord::StoreClient;
using concord::StoreLimits;
using concord::StoreServer;
using Seconds = std::chrono::duration<double>;

namespace {

constexpr const char* kToken = "job-token-1234";
constexpr Seconds kConnect{5.0};

template <typename F>
Error error_from(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  throw std::runtime_error("expected a concord::Error, none was thrown");
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return Seconds(std::chrono::steady_clock::now() - start).count();
}

std::string random_bytes(std::mt19937& rng, std::size_t size) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::string out(size, '\0');
  for (auto& c : out) c = static_cast<char>(byte(rng));
  return out;
}

// A port nothing listens on (the kernel just handed it out and it was released).
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// A socket speaking the wire protocol by hand, to send what StoreClient never would.
struct RawConnection {
  explicit RawConnection(int port) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  }
  ~RawConnection() { ::close(fd); }

  void send(const std::string& bytes) {
    REQUIRE(concord::wire::send_all(fd, bytes, concord::wire::deadline_after(Seconds(5))) ==
            concord::wire::IoResult::kOk);
  }
  concord::wire::IoResult read(concord::wire::Frame& frame) {
    std::string error;
    return concord::wire::read_frame(fd, decoder, concord::wire::deadline_after(Seconds(5)), frame,
                                     error);
  }

  int fd;
  concord::wire::FrameDecoder decoder{{}};
};

// Accepts one connection, answers its HELLO only if told to, then never
// answers anything: a hung store.
class SilentServer {
 public:
  explicit SilentServer(bool answer_hello) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(listen_fd_, 4) == 0);
    socklen_t len = sizeof addr;
    REQUIRE(::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this, answer_hello] { serve(answer_hello); });
  }
  ~SilentServer() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    stopped_.notify_all();
    ::shutdown(listen_fd_, SHUT_RDWR);  // wakes a pending accept()
    thread_.join();
    ::close(listen_fd_);
  }
  int port() const { return port_; }

 private:
  void serve(bool answer_hello) {
    using namespace concord::wire;
    int fd = ::accept(listen_fd_, nullptr, nullptr);
    if (fd < 0) return;
    if (answer_hello) {
      FrameDecoder decoder{{}};
      Frame hello;
      std::string error;
      if (read_frame(fd, decoder, deadline_after(Seconds(5)), hello, error) == IoResult::kOk)
        send_all(fd, encode(Frame{Op::kOk, 0, {}}), deadline_after(Seconds(5)));
    }
    std::unique_lock<std::mutex> lock(mutex_);
    stopped_.wait(lock, [this] { return stop_; });
    ::close(fd);
  }

  int listen_fd_ = -1;
  int port_ = 0;
  std::mutex mutex_;
  std::condition_variable stopped_;
  bool stop_ = false;
  std::thread thread_;
};

std::string be64(std::uint64_t v) {
  std::string out;
  for (int shift = 56; shift >= 0; shift -= 8)
    out.push_back(static_cast<char>((v >> shift) & 0xff));
  return out;
}

}  // namespace

TEST_CASE("store: set/get round-trips binary values", "[store]") {
  StoreServer server("127.0.0.1", 0, kToken);
  REQUIRE(server.port() > 0);
  StoreClient client("127.0.0.1", server.port(), kToken, kConnect);
  CHECK(client.host() == "127.0.0.1");
  CHECK(client.port() == server.port());

  std::mt19937 rng(1234);
  const std::vector<std::size_t> sizes{0, 1, 2, 7, 4096, 65537, 1u << 20};
  for (std::size_t size : sizes) {
    std::string key = "key/" + std::to_string(size);
    std::string value = random_bytes(rng, size);
    client.set(key, value);
    CHECK(client.get(key, Seconds(1)) == value);
  }
  std::string with_nuls("a\0b\0\0c", 6);
  client.set(std::string("k\0ey", 4), with_nuls);
  CHECK(client.get(std::string("k\0ey", 4), Seconds(1)) == with_nuls);

  client.set("key/0", "overwritten");
  CHECK(client.get("key/0", Seconds(1)) == "overwritten");
}

TEST_CASE("store: get waits for a key set later by another client", "[store]") {
  StoreServer server("127.0.0.1", 0, kToken);
  StoreClient reader("127.0.0.1", server.port(), kToken, kConnect);
  std::thread writer([port = server.port()] {
    StoreClient client("127.0.0.1", port, kToken, kConnect);
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    client.set("late", "value");
  });
  auto start = std::chrono::steady_clock::now();
  CHECK(reader.get("late", Seconds(5)) == "value");
  CHECK(seconds_since(start) >= 0.1);
  writer.join();
}

TEST_CASE("store: get of a missing key times out with the key and the seconds", "[store]") {
  StoreServer server("127.0.0.1", 0, kToken);
  StoreClient client("127.0.0.1", server.port(), kToken, kConnect);
  auto start = std::chrono::steady_clock::now();
  Error e = error_from([&] { client.get("never", Seconds(0.3)); });
  double took = seconds_since(start);
  CHECK(e.code() == StatusCode::kTimeout);
  CHECK(std::string(e.what()) == "timed out after 0.3s waiting for store key 'never'");
  CHECK(took >= 0.29);
  CHECK(took < 1.3);
  // The connection stays usable after a timeout reported by the server.
  client.set("after", "1");
  CHECK(client.get("after", Seconds(1)) == "1");
  CHECK(client.get("after", Seconds(0)) == "1");
}

TEST_CASE("store: wait returns once every key exists and names the missing ones", "[store]") {
  StoreServer server("127.0.0.1", 0, kToken);
  StoreClient client("127.0.0.1", server.port(), kToken, kConnect);
  client.wait({}, Seconds(0));

  std::thread writer([port = server.port()] {
    StoreClient other("127.0.0.1", port, kToken, kConnect);
    for (const char* key : {"a", "b", "c"}) {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      other.set(key, key);
    }
  });
  client.wait({"a", "b", "c", "a"}, Seconds(5));
  writer.join();

  client.erase("b");
  auto start = std::chrono::steady_clock::now();
  Error e = error_from([&] { client.wait({"a", "b", "c", "d"}, Seconds(0.2)); });
  CHECK(e.code() == StatusCode::kTimeout);
  CHECK(std::string(e.what()) == "timed out after 0.2s waiting for store keys 'b', 'd'");
  CHECK(seconds_since(start) < 1.2);
}

TEST_CASE("store: a key deleted during a wait is waited for again", "[store]") {
  StoreServer server("127.0.0.1", 0, kToken);
  StoreClient client("127.0.0.1", server.port(), kToken, kConnect);
  client.set("x", "1");
  std::atomic<bool> x_is_back{false};
  std::thread other_thread([&, port = server.port()] {
    StoreClient other("127.0.0.1", port, kToken, kConnect);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    other.erase("x");
    other.set("y", "1");  // y now exists but x does not: the wait goes on
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    x_is_back = true;
    other.set("x", "2");
  });
  client.wait({"x", "y"}, Seconds(5));
  CHECK(x_is_back);
  CHECK(client.get("x", Seconds(0)) == "2");
  other_thread.join();
}

TEST_CASE("store: concurrent adds sum exactly", "[store]") {
  StoreServer server("127.0.0.1", 0, kToken);
  constexpr int kThreads = 4;
  constexpr int kAdds = 1000;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, port = server.port()] {
      try {
        StoreClient client("127.0.0.1", port, kToken, kConnect);
        for (int i = 0; i < kAdds; ++i) client.add("counter", 1);
      } catch (...) {
        ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(failures == 0);
  StoreClient client("127.0.0.1", server.port(), kToken, kConnect);
  CHECK(client.add("counter", 0) == kThreads * kAdds);
  CHECK(client.get("counter", Seconds(1)) == std::to_string(kThreads * kAdds));
  CHECK(client.add("counter", -4001) == -1);
  CHECK(client.add("fresh", -7) == -7);

  client.set("text", "abc");
  Error e = error_from([&] { client.add("text", 1); });
  CHECK(e.code() == StatusCode::kInvalidArgument);
  CHECK(std::string(e.what()) ==
        "store value for key 'text' is not an integer, so add cannot update it");
  client.set("big", std::to_string(INT64_MAX));
  CHECK(error_from([&] { client.add("big", 1); }).code() == StatusCode::kInvalidArgument);
  CHECK(client.get("big", Seconds(1)) == std::to_string(INT64_MAX));
}

TEST_CASE("store: many waiters on one key are all woken", "[store]") {
  StoreServer server("127.0.0.1", 0, kToken);
  constexpr int kRanks = 32;
  std::vector<std::thread> ranks;
  std::atomic<int> released{0};
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, port = server.port()] {
      try {
        StoreClient client("127.0.0.1", port, kToken, kConnect);
        // A barrier: the last to arrive opens it.
        if (client.add("arrived", 1) == kRanks) client.set("open", "1");
        client.wait({"open"}, Seconds(5));
        ++released;
      } catch (...) {
      }
    });
  }
  for (auto& t : ranks) t.join();
  CHECK(released == kRanks);
}

TEST_CASE("store: add wakes a waiter on its key", "[store]") {
  StoreServer server("127.0.0.1", 0, kToken);
  StoreClient client("127.0.0.1", server.port(), kToken, kConnect);
  std::thread adder([port = server.port()] {
    StoreClient other("127.0.0.1", port, kToken, kConnect);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    other.add("n", 3);
  });
  CHECK(client.get("n", Seconds(5)) == "3");
  adder.join();
}

TEST_CASE("store: delete reports whether the key existed", "[store]") {
  StoreServer server("127.0.0.1", 0, kToken);
  StoreClient client("127.0.0.1", server.port(), kToken, kConnect);
  client.set("k", "v");
  CHECK(client.erase("k"));
  CHECK_FALSE(client.erase("k"));
  CHECK(error_from([&] { client.get("k", Seconds(0.05)); }).code() == StatusCode::kTimeout);
}

TEST_CASE("store: a wrong token is refused with the server's message", "[store]") {
  StoreServer server("127.0.0.1", 0, kToken);
  Error e = error_from([&] { StoreClient("127.0.0.1", server.port(), "wrong", kConnect); });
  CHECK(e.code() == StatusCode::kInvalidArgument);
  CHECK(std::string(e.what()) == "store refused the connection: wrong job token");
  CHECK(error_from([&] { StoreClient("127.0.0.1", server.port(), "", kConnect); }).code() ==
        StatusCode::kInvalidArgument);
  StoreClient good("127.0.0.1", server.port(), kToken, kConnect);
  good.set("still", "serving");
}

TEST_CASE("store: a server is never started without a token", "[store]") {
  // It used to accept any client, which is what torchrun-style launches
  // without CONCORD_JOB_TOKEN got.
  Error e = error_from([] { StoreServer("127.0.0.1", 0, ""); });
  CHECK(e.code() == StatusCode::kInvalidArgument);
  CHECK(std::string(e.what()) ==
        "the store is never served without a job token: give it a secret");
}

TEST_CASE("store: oversized keys and values are refused", "[store]") {
  StoreServer server("127.0.0.1", 0, kToken);
  StoreClient client("127.0.0.1", server.port(), kToken, kConnect);
  StoreLimits caps;

  SECTION("client side, before sending") {
    Error e = error_from([&] { client.set("big", std::string(caps.max_value_bytes + 1, 'x')); });
    CHECK(e.code() == StatusCode::kInvalidArgument);
    CHECK(std::string(e.what()) ==
          "store value for key 'big' is 67108865 bytes; the cap is 67108864");
    std::string long_key(caps.max_key_bytes + 1, 'k');
    e = error_from([&] { client.set(long_key, "v"); });
    CHECK(e.code() == StatusCode::kInvalidArgument);
    CHECK(std::string(e.what()) == "store key is 4097 bytes; the cap is 4096");
    CHECK(error_from([&] { client.get(long_key, Seconds(1)); }).code() ==
          StatusCode::kInvalidArgument);
    CHECK(error_from([&] {
            client.wait({"a", long_key}, Seconds(1));
          }).code() == StatusCode::kInvalidArgument);
    client.set("ok", "v");
    CHECK(client.get("ok", Seconds(1)) == "v");
  }

  SECTION("server side, with the stream kept in sync") {
    StoreServer small("127.0.0.1", 0, kToken, StoreLimits{16, 1024});
    StoreClient c("127.0.0.1", small.port(), kToken, kConnect);
    Error e = error_from([&] { c.set("x", std::string(2000, 'v')); });
    CHECK(e.code() == StatusCode::kInvalidArgument);
    CHECK(std::string(e.what()) == "store value for key 'x' is 2000 bytes; the cap is 1024");
    e = error_from([&] { c.set(std::string(17, 'k'), "v"); });
    CHECK(std::string(e.what()) == "store key is 17 bytes; the cap is 16");
    c.set("x", std::string(1024, 'v'));
    CHECK(c.get("x", Seconds(1)).size() == 1024);
    StoreClient other("127.0.0.1", small.port(), kToken, kConnect);
    CHECK(other.get("x", Seconds(1)).size() == 1024);
  }

  SECTION("server side, refused from the header alone") {
    using namespace concord::wire;
    RawConnection raw(server.port());
    raw.send(encode(Frame{Op::kHello, 0, {kToken}}));
    Frame reply;
    REQUIRE(raw.read(reply) == IoResult::kOk);
    REQUIRE(reply.op == Op::kOk);
    // A SET that announces a 70 MB value; the value itself is never sent, so
    // an answer proves the server did not wait to buffer it.
    constexpr std::uint64_t kValue = 70000000;
    std::string frame = encode(Frame{Op::kSet, 0, {"x", ""}});
    frame.replace(12, 8, be64(8 + 1 + 8 + kValue));
    frame.replace(frame.size() - 8, 8, be64(kValue));
    raw.send(frame);
    REQUIRE(raw.read(reply) == IoResult::kOk);
    CHECK(reply.op == Op::kError);
    CHECK(reply.arg == static_cast<std::int64_t>(StatusCode::kInvalidArgument));
    REQUIRE(reply.fields.size() == 1);
    CHECK(reply.fields[0] == "store value for key 'x' is 70000000 bytes; the cap is 67108864");
    client.set("other", "fine");
    CHECK(client.get("other", Seconds(1)) == "fine");
  }
}

TEST_CASE("store: malformed frames close only their connection", "[store]") {
  using namespace concord::wire;
  StoreServer server("127.0.0.1", 0, kToken);
  StoreClient client("127.0.0.1", server.port(), kToken, kConnect);
  {
    RawConnection raw(server.port());
    raw.send(std::string(kHeaderBytes, 'Z'));
    Frame reply;
    REQUIRE(raw.read(reply) == IoResult::kOk);
    CHECK(reply.op == Op::kError);
    CHECK(raw.read(reply) == IoResult::kClosed);
  }
  {
    RawConnection raw(server.port());
    raw.send(encode(Frame{Op::kSet, 0, {"k", "v"}}));  // no HELLO first
    Frame reply;
    REQUIRE(raw.read(reply) == IoResult::kOk);
    CHECK(reply.fields.at(0) == "store refused the connection: it did not start with HELLO");
    CHECK(raw.read(reply) == IoResult::kClosed);
  }
  {
    RawConnection raw(server.port());
    raw.send(encode(Frame{Op::kHello, 0, {kToken}}).substr(0, 10));  // then vanish mid-frame
  }
  {
    RawConnection raw(server.port());  // vanish while waiting for a key
    raw.send(encode(Frame{Op::kHello, 0, {kToken}}));
    raw.send(encode(Frame{Op::kGet, 10000, {"k"}}));
    Frame reply;
    REQUIRE(raw.read(reply) == IoResult::kOk);
  }
  client.set("k", "v");
  CHECK(client.get("k", Seconds(1)) == "v");
}

TEST_CASE("store: binding fails with Unavailable", "[store]") {
  Error e = error_from([] { StoreServer("no-such-host.invalid", 0, kToken); });
  CHECK(e.code() == StatusCode::kUnavailable);
  CHECK_THAT(e.what(),
             Catch::StartsWith("could not resolve the store host 'no-such-host.invalid'"));
  // TEST-NET-1 (RFC 5737) is not an address of this machine.
  e = error_from([] { StoreServer("192.0.2.1", 0, kToken); });
  CHECK(e.code() == StatusCode::kUnavailable);
  CHECK_THAT(e.what(), Catch::StartsWith("could not bind the store to 192.0.2.1:0"));

  StoreServer first("127.0.0.1", 0, kToken);
  e = error_from([&] { StoreServer("127.0.0.1", first.port(), kToken); });
  CHECK(e.code() == StatusCode::kUnavailable);
}

TEST_CASE("store: serves IPv6 loopback when the host has it", "[store]") {
  std::unique_ptr<StoreServer> server;
  try {
    server = std::make_unique<StoreServer>("::1", 0, kToken);
  } catch (const Error&) {
    WARN("no IPv6 loopback here");
    return;
  }
  StoreClient client("::1", server->port(), kToken, kConnect);
  client.set("six", "6");
  CHECK(client.get("six", Seconds(1)) == "6");
}

TEST_CASE("store: connecting gives up after the connect timeout", "[store]") {
  int port = free_port();
  auto start = std::chrono::steady_clock::now();
  Error e = error_from([&] { StoreClient("127.0.0.1", port, kToken, Seconds(0.3)); });
  double took = seconds_since(start);
  CHECK(e.code() == StatusCode::kTimeout);
  CHECK_THAT(e.what(), Catch::StartsWith("could not reach the store at 127.0.0.1:" +
                                         std::to_string(port) + " within 0.3s"));
  CHECK(took >= 0.25);
  CHECK(took < 1.3);
}

TEST_CASE("store: a client may start before its server", "[store]") {
  int port = free_port();
  std::unique_ptr<StoreServer> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    server = std::make_unique<StoreServer>("127.0.0.1", port, kToken);
  });
  StoreClient client("127.0.0.1", port, kToken, kConnect);
  starter.join();
  client.set("k", "v");
  CHECK(client.get("k", Seconds(1)) == "v");
}

TEST_CASE("store: a vanished server is reported as a lost connection", "[store]") {
  auto server = std::make_unique<StoreServer>("127.0.0.1", 0, kToken);
  int port = server->port();
  StoreClient client("127.0.0.1", port, kToken, kConnect);
  std::string lost = "lost the connection to the store at 127.0.0.1:" + std::to_string(port);

  SECTION("between calls") {
    server.reset();
    Error e = error_from([&] { client.set("k", "v"); });
    CHECK(e.code() == StatusCode::kRemote);
    CHECK(std::string(e.what()) == lost);
  }
  SECTION("during a get") {
    std::thread killer([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      server.reset();
    });
    auto start = std::chrono::steady_clock::now();
    Error e = error_from([&] { client.get("never", Seconds(5)); });
    killer.join();
    CHECK(e.code() == StatusCode::kRemote);
    CHECK(std::string(e.what()) == lost);
    CHECK(seconds_since(start) < 2.0);
  }
  // Later calls keep failing the same way instead of hanging.
  CHECK(error_from([&] { client.add("k", 1); }).code() == StatusCode::kRemote);
}

TEST_CASE("store: a hung store cannot block a call past its timeout", "[store]") {
  SECTION("silent after the handshake") {
    SilentServer hung(true);
    StoreClient client("127.0.0.1", hung.port(), kToken, kConnect);
    auto start = std::chrono::steady_clock::now();
    Error e = error_from([&] { client.get("k", Seconds(0.1)); });
    CHECK(e.code() == StatusCode::kTimeout);
    CHECK(std::string(e.what()) == "timed out after 0.1s waiting for store key 'k'");
    CHECK(seconds_since(start) < 3.5);
    // The late answer could be mistaken for the next call's: the connection is dropped.
    CHECK(error_from([&] { client.set("k", "v"); }).code() == StatusCode::kRemote);
  }
  SECTION("silent during the handshake") {
    SilentServer hung(false);
    auto start = std::chrono::steady_clock::now();
    Error e = error_from([&] { StoreClient("127.0.0.1", hung.port(), kToken, Seconds(0.1)); });
    CHECK(e.code() == StatusCode::kTimeout);
    CHECK(std::string(e.what()) ==
          "could not reach the store at 127.0.0.1:" + std::to_string(hung.port()) +
              " within 0.1s (the store accepted but did not answer the handshake)");
    CHECK(seconds_since(start) < 3.5);
  }
}

TEST_CASE("store: invalid arguments are refused before any I/O", "[store]") {
  StoreServer server("127.0.0.1", 0, kToken);
  StoreClient client("127.0.0.1", server.port(), kToken, kConnect);
  CHECK(error_from([&] { client.get("k", Seconds(-1)); }).code() == StatusCode::kInvalidArgument);
  CHECK(error_from([] { StoreClient("127.0.0.1", 0, kToken, kConnect); }).code() ==
        StatusCode::kInvalidArgument);
  CHECK(error_from([] { StoreServer("127.0.0.1", 70000, kToken); }).code() ==
        StatusCode::kInvalidArgument);
}

TEST_CASE("store: connections that never show the token are dropped, and cannot lock the job out",
          "[store]") {
  StoreLimits limits;
  limits.handshake_timeout = Seconds(0.5);
  limits.max_unauthenticated = 8;
  StoreServer server("127.0.0.1", 0, kToken, limits);

  // Far more idle connections than the cap (the job's ranks used to be
  // locked out once the process ran out of descriptors).
  std::vector<std::unique_ptr<RawConnection>> idle;
  for (int i = 0; i < 300; ++i) idle.push_back(std::make_unique<RawConnection>(server.port()));
  const auto start = std::chrono::steady_clock::now();
  StoreClient client("127.0.0.1", server.port(), kToken, kConnect);
  client.set("k", "v");
  CHECK(client.get("k", Seconds(1)) == "v");
  CHECK(seconds_since(start) < 2.0);

  // Every idle connection is closed by now: the oldest to make room, the
  // rest when their handshake time ran out.
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  int closed = 0;
  for (auto& raw : idle) {
    char byte;
    closed += ::recv(raw->fd, &byte, 1, MSG_DONTWAIT) == 0;  // EOF, not "nothing yet"
  }
  CHECK(closed == 300);
  // The authenticated client is not subject to the handshake deadline.
  client.set("k2", "v2");
  CHECK(client.get("k2", Seconds(1)) == "v2");
}

TEST_CASE("store: 256 ranks meeting at once each read every other rank's record", "[store]") {
  // What every rank's init does: count its generation, publish a record,
  // read every other rank's, count itself in; the last one in opens a key
  // all wait for.
  StoreServer server("127.0.0.1", 0, kToken);
  constexpr int kRanks = 256;
  std::mt19937 rng(std::random_device{}());
  std::vector<std::string> records(kRanks);
  for (auto& record : records) record = random_bytes(rng, 1 + rng() % 200);
  std::vector<std::vector<std::string>> seen(kRanks);
  std::vector<std::int64_t> generation(kRanks), counted_after(kRanks);
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r, port = server.port()] {
      try {
        StoreClient client("127.0.0.1", port, kToken, Seconds(60));
        generation[r] = client.add("world/generation/" + std::to_string(r), 1);
        client.set("world#1/host/" + std::to_string(r), records[r]);
        for (int q = 0; q < kRanks; ++q)
          seen[r].push_back(q == r ? records[r]
                                   : client.get("world#1/host/" + std::to_string(q), Seconds(60)));
        if (client.add("world#1/counted", 1) == kRanks) client.set("world#1/all_counted", "1");
        client.wait({"world#1/all_counted"}, Seconds(60));
        counted_after[r] = client.add("world#1/counted", 0);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    REQUIRE(errors[r].empty());
    CHECK(generation[r] == 1);
    CHECK(seen[r] == records);
    CHECK(counted_after[r] == kRanks);
  }
}
