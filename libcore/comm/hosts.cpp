#include "comm/hosts.hpp"

#include <unistd.h>

#include <chrono>

#include "base/format.hpp"
#include "rendezvous/store.hpp"

namespace concord {

std::string host_identity() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

std::vector<std::string> exchange_hosts(StoreClient& store, const std::string& name, int rank,
                                        int size, double timeout_s) {
  const auto timeout = std::chrono::duration<double>(timeout_s);
  std::vector<std::string> hosts(static_cast<std::size_t>(size));
  hosts[rank] = host_identity();
  store.set(concat(name, "/host/", rank), hosts[rank]);
  for (int q = 0; q < size; ++q)
    if (q != rank) hosts[q] = store.get(concat(name, "/host/", q), timeout);
  return hosts;
}

int local_rank_of(const std::vector<std::string>& hosts, int rank) {
  int local = 0;
  for (int q = 0; q < rank; ++q) local += hosts[q] == hosts[rank];
  return local;
}

}  // namespace concord
