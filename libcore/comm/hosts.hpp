// Which ranks share a host: ranks that can share memory (a POSIX
// shared-memory segment) are on one host.
#pragma once

#include <string>
#include <vector>

namespace concord {

class StoreClient;

// This process's host identity: its host name.
std::string host_identity();

// Every rank's host identity, in rank order: each rank publishes its own
// under `name` and reads the others' (collective; waits at most timeout_s).
std::vector<std::string> exchange_hosts(StoreClient& store, const std::string& name, int rank,
                                        int size, double timeout_s);

// The rank's index among the ranks on its own host.
int local_rank_of(const std::vector<std::string>& hosts, int rank);

}  // namespace concord
