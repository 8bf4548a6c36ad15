// TCP key-value store used for rendezvous only.
//
// The server binds only to the address it is given, requires the job token
// on every connection, caps key and value sizes and stores bytes, never code.
// A client is used by one thread at a time (each rank owns its own client).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace concord {

struct StoreLimits {
  std::size_t max_key_bytes = 4096;
  std::size_t max_value_bytes = 64u << 20;
  // A connection must show the job token this soon after it was accepted,
  // and at most max_unauthenticated may be waiting to (the oldest is dropped
  // for a new one): idle or hostile connections can neither pile up nor lock
  // the job's ranks out.
  std::chrono::duration<double> handshake_timeout = std::chrono::seconds(10);
  std::size_t max_unauthenticated = 64;
};

class StoreServer {
 public:
  // Binds host:port (port 0 picks a free port) and serves on a background
  // thread until destroyed, to clients that present `token`. Throws
  // InvalidArgument for an empty token (a store never serves without a
  // secret), Unavailable when the address cannot be bound.
  StoreServer(const std::string& host, int port, std::string token, StoreLimits limits = {});
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class StoreClient {
 public:
  // Connects, retrying until `connect_timeout` (the server may start later),
  // then presents the token. Throws Timeout if no server answered in time,
  // InvalidArgument if the server refused the token.
  StoreClient(const std::string& host, int port, const std::string& token,
              std::chrono::duration<double> connect_timeout);
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  void set(const std::string& key, const std::string& value);
  // Waits until the key exists; Timeout names the key when it never appears.
  std::string get(const std::string& key, std::chrono::duration<double> timeout);
  // Waits until every key exists.
  void wait(const std::vector<std::string>& keys, std::chrono::duration<double> timeout);
  // Atomically adds delta to the integer stored at key (missing = 0); returns the new value.
  std::int64_t add(const std::string& key, std::int64_t delta);
  // Returns whether the key existed.
  bool erase(const std::string& key);

  const std::string& host() const noexcept;
  int port() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A store client shared by a communicator and the ones split from it; the
// client serves one call at a time, so users hold `mutex` around their calls.
struct SharedStore {
  std::mutex mutex;
  std::unique_ptr<StoreClient> client;
};

}  // namespace concord
