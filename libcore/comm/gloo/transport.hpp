// Gloo's TCP transport with waits that concord owns.
//
// Gloo's own waits give up after a fixed timeout by closing every
// connection of the context, which the peers cannot tell from a death, and
// nothing can interrupt them. Here every buffer of a backend's mesh (the
// agreement exchange's, the reduce-scatter ring's and those gloo's
// collectives make through the context) waits in slices and asks its Watch
// between them: the backend's deadline, interrupt check and abort decide
// when a wait ends, and a broken connection is reported with the rank it
// leads to.
#pragma once

#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/tcp/unbound_buffer.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

namespace concord::gloo {

// What a wait answers to.
class Watch {
 public:
  virtual ~Watch() = default;
  // When a wait that is still pending calls check() next.
  virtual std::chrono::steady_clock::time_point next_check() const = 0;
  // Throws when the operation must end: its deadline passed, an interrupt,
  // an abort. `peer`: the rank the wait is for.
  virtual void check(int peer) = 0;
  // The connection to `peer` broke (`what`: gloo's reason); throws.
  [[noreturn]] virtual void lost(int peer, const std::string& what) = 0;
};

// An unbound buffer whose waits ask a Watch instead of timing out
// themselves, and whose send and recv name their peer when its connection
// is already broken.
class WatchedBuffer final : public ::gloo::transport::tcp::UnboundBuffer {
 public:
  WatchedBuffer(const std::shared_ptr<::gloo::transport::tcp::Context>& context, void* ptr,
                std::size_t size, Watch& watch);

  // The timeout argument is ignored: the Watch decides.
  bool waitRecv(int* rank, std::chrono::milliseconds timeout) override;
  bool waitSend(int* rank, std::chrono::milliseconds timeout) override;
  void send(int dst_rank, std::uint64_t slot, std::size_t offset, std::size_t nbytes) override;
  using ::gloo::transport::tcp::UnboundBuffer::recv;
  void recv(int src_rank, std::uint64_t slot, std::size_t offset, std::size_t nbytes) override;

  // Posts a receive like recv(), but returns gloo's reason instead of
  // reporting it when the connection is already broken.
  std::optional<std::string> try_recv(int src_rank, std::uint64_t slot, std::size_t offset,
                                      std::size_t nbytes);
  // Whether a receive completed that nobody waited for yet.
  bool received();
  // Whether its connection broke under a pending operation.
  bool broken();

 private:
  bool wait(std::condition_variable& cv, int& completions, bool& aborted, const int& last_rank,
            int* rank, int peer);

  Watch& watch_;
  int recv_peer_ = -1;  // of the latest recv and send posted
  int send_peer_ = -1;
};

// A TCP context whose buffers are WatchedBuffers.
class WatchedContext final : public ::gloo::transport::tcp::Context {
 public:
  WatchedContext(std::shared_ptr<::gloo::transport::tcp::Device> device, int rank, int size,
                 Watch& watch);

  std::unique_ptr<::gloo::transport::UnboundBuffer> createUnboundBuffer(void* ptr,
                                                                        std::size_t size) override;
  // Closes every connection: pending operations here fail (their waits
  // call lost()), and so do the peers' operations with this rank.
  void close_all(const std::string& why);

 private:
  Watch& watch_;
};

// A TCP device whose contexts are WatchedContexts.
class WatchedDevice final : public ::gloo::transport::tcp::Device {
 public:
  WatchedDevice(const ::gloo::transport::tcp::attr& attr, Watch& watch);
  std::shared_ptr<::gloo::transport::Context> createContext(int rank, int size) override;

 private:
  Watch& watch_;
};

// The full mesh of a backend's ranks that gloo's collectives run on.
class Mesh final : public ::gloo::rendezvous::Context {
 public:
  using ::gloo::rendezvous::Context::Context;
  WatchedContext& transport();
};

// Where this process's gloo device listens: the interface CONCORD_GLOO_IFACE
// names, else the address this host reaches the store from (the store is
// reachable from every host, so this address usually is too; on one host,
// with a loopback store, it is the loopback address). Throws Unavailable.
::gloo::transport::tcp::attr device_attr(const std::string& store_host, int store_port);

// Gloo's reason for an error, without its "[file:line] " prefix.
std::string gloo_reason(const std::exception& e);

}  // namespace concord::gloo
