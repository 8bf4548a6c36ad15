#include "spawn_ranks.hpp"

#include <atomic>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include "base/format.hpp"
#include "rendezvous/store.hpp"

namespace concord::testing {

void spawn_ranks(int nranks, const std::function<void(Communicator&)>& body, double timeout_s,
                 BackendChoice choice, const std::vector<std::string>& hosts) {
  static std::atomic<int> job{0};
  const std::string name = concat("threads", job++);
  StoreServer server("127.0.0.1", 0, "test-token");
  std::mutex error_mutex;
  std::exception_ptr first_error;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < nranks; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        auto store = std::make_shared<SharedStore>();
        store->client = std::make_unique<StoreClient>("127.0.0.1", server.port(), "test-token",
                                                      std::chrono::duration<double>(timeout_s));
        const std::optional<std::string> host =
            hosts.empty() ? std::nullopt : std::optional<std::string>(hosts.at(rank));
        Communicator comm(store, name, rank, nranks, timeout_s, choice, host);
        body(comm);
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first_error) std::rethrow_exception(first_error);
}

std::vector<std::string> hosts_of_sizes(const std::vector<int>& ranks_per_host) {
  std::vector<std::string> hosts;
  for (std::size_t h = 0; h < ranks_per_host.size(); ++h)
    hosts.insert(hosts.end(), static_cast<std::size_t>(ranks_per_host[h]), concat("host", h));
  return hosts;
}

}  // namespace concord::testing
