#include "comm/gloo/transport.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gloo/common/error.h>

#include <cstring>
#include <exception>

#include "base/env.hpp"
#include "base/format.hpp"

namespace concord::gloo {

namespace tcp = ::gloo::transport::tcp;

namespace {

std::string reason_of(const std::exception_ptr& ex) {
  try {
    std::rethrow_exception(ex);
  } catch (const std::exception& e) {
    return gloo_reason(e);
  } catch (...) {
    return "unknown error";
  }
}

// The local address of a UDP socket connected to host:port: the interface
// the routing table picks for that destination (connecting a UDP socket
// sends nothing).
std::string local_address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rv = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rv != 0)
    fail(StatusCode::kUnavailable, "gloo: cannot resolve the store's host '", host,
         "' to find this host's address: ", gai_strerror(rv));
  std::string error = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t length = sizeof local;
    char text[INET6_ADDRSTRLEN] = {};
    const bool ok = connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
                    getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0;
    if (!ok) error = std::strerror(errno);
    close(fd);
    if (!ok) continue;
    const void* address = local.ss_family == AF_INET6
                              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6&>(local).sin6_addr)
                              : static_cast<const void*>(&reinterpret_cast<sockaddr_in&>(local).sin_addr);
    if (inet_ntop(local.ss_family, address, text, sizeof text) == nullptr) continue;
    freeaddrinfo(found);
    return text;
  }
  freeaddrinfo(found);
  fail(StatusCode::kUnavailable, "gloo: no route from this host to the store at ", host, ":", port,
       " (", error, "); set CONCORD_GLOO_IFACE to the network interface the ranks reach each other on");
}

}  // namespace

std::string gloo_reason(const std::exception& e) {
  std::string what = e.what();
  if (!what.empty() && what.front() == '[') {
    const auto end = what.find("] ");
    if (end != std::string::npos) what.erase(0, end + 2);
  }
  return what;
}

// ---- WatchedBuffer ---------------------------------------------------------

WatchedBuffer::WatchedBuffer(const std::shared_ptr<tcp::Context>& context, void* ptr,
                             std::size_t size, Watch& watch)
    : tcp::UnboundBuffer(context, ptr, size), watch_(watch) {}

bool WatchedBuffer::wait(std::condition_variable& cv, int& completions, bool& aborted,
                         const int& last_rank, int* rank, int peer) {
  std::unique_lock lock(m_);
  for (;;) {
    // A completion first: data that arrived before the connection broke
    // is good data.
    if (completions > 0) {
      --completions;
      if (rank != nullptr) *rank = last_rank;
      return true;
    }
    if (aborted) {
      aborted = false;
      return false;
    }
    if (ex_) {
      const std::string what = reason_of(ex_);
      lock.unlock();
      watch_.lost(peer, what);
    }
    if (cv.wait_until(lock, watch_.next_check()) == std::cv_status::timeout) {
      lock.unlock();
      watch_.check(peer);
      lock.lock();
    }
  }
}

bool WatchedBuffer::waitRecv(int* rank, std::chrono::milliseconds) {
  return wait(recvCv_, recvCompletions_, abortWaitRecv_, recvRank_, rank, recv_peer_);
}

bool WatchedBuffer::waitSend(int* rank, std::chrono::milliseconds) {
  return wait(sendCv_, sendCompletions_, abortWaitSend_, sendRank_, rank, send_peer_);
}

void WatchedBuffer::send(int dst_rank, std::uint64_t slot, std::size_t offset,
                         std::size_t nbytes) {
  send_peer_ = dst_rank;
  try {
    tcp::UnboundBuffer::send(dst_rank, slot, offset, nbytes);
  } catch (const ::gloo::IoException& e) {
    watch_.lost(dst_rank, gloo_reason(e));
  }
}

void WatchedBuffer::recv(int src_rank, std::uint64_t slot, std::size_t offset,
                         std::size_t nbytes) {
  if (auto broken = try_recv(src_rank, slot, offset, nbytes)) watch_.lost(src_rank, *broken);
}

std::optional<std::string> WatchedBuffer::try_recv(int src_rank, std::uint64_t slot,
                                                   std::size_t offset, std::size_t nbytes) {
  recv_peer_ = src_rank;
  try {
    tcp::UnboundBuffer::recv(src_rank, slot, offset, nbytes);
  } catch (const ::gloo::IoException& e) {
    return gloo_reason(e);
  }
  return std::nullopt;
}

bool WatchedBuffer::received() {
  std::lock_guard lock(m_);
  return recvCompletions_ > 0;
}

bool WatchedBuffer::broken() {
  std::lock_guard lock(m_);
  return ex_ != nullptr;
}

// ---- context, device, mesh -------------------------------------------------

WatchedContext::WatchedContext(std::shared_ptr<tcp::Device> device, int rank, int size,
                               Watch& watch)
    : tcp::Context(std::move(device), rank, size), watch_(watch) {}

std::unique_ptr<::gloo::transport::UnboundBuffer> WatchedContext::createUnboundBuffer(
    void* ptr, std::size_t size) {
  return std::make_unique<WatchedBuffer>(shared_from_this(), ptr, size, watch_);
}

void WatchedContext::close_all(const std::string& why) { signalException(why); }

WatchedDevice::WatchedDevice(const tcp::attr& attr, Watch& watch)
    : tcp::Device(attr), watch_(watch) {}

std::shared_ptr<::gloo::transport::Context> WatchedDevice::createContext(int rank, int size) {
  return std::make_shared<WatchedContext>(shared_from_this(), rank, size, watch_);
}

WatchedContext& Mesh::transport() { return static_cast<WatchedContext&>(*transportContext_); }

tcp::attr device_attr(const std::string& store_host, int store_port) {
  tcp::attr attr;
  if (auto iface = env::get("CONCORD_GLOO_IFACE"))
    attr.iface = *iface;
  else
    attr.hostname = local_address_towards(store_host, store_port);
  try {
    return tcp::CreateDeviceAttr(attr);
  } catch (const std::exception& e) {
    fail(StatusCode::kUnavailable, "gloo: cannot listen on ",
         attr.iface.empty() ? attr.hostname : "interface " + attr.iface, ": ", gloo_reason(e));
  }
}

}  // namespace concord::gloo
