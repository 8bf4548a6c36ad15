// Where a communicator's ranks are, host by host, and the groups the
// shm+gloo backend forms from that: the ranks of each host (shared memory)
// and, across hosts, shard groups.
//
// Hosts may hold different numbers of ranks. With S the fewest ranks any
// host has, local rank s < S of every host belongs to shard group s, which
// has one rank on every host: large messages are cut into S shards and
// shard s crosses the network only within group s, so every host's share
// of the traffic is spread over S ranks (and connections) and each byte
// crosses the network once. Local ranks from S up, on the larger hosts,
// have no group: their host's data goes through the other local ranks.
// Shard group 0 (the local leaders) carries what is not sharded.
#pragma once

#include <string>
#include <vector>

namespace concord::hierarchical {

struct HostLayout {
  std::vector<std::string> host_ids;          // hosts, in order of their first rank
  std::vector<std::vector<int>> host_ranks;   // each host's ranks, ascending
  std::vector<int> host_of;                   // each rank's host
  std::vector<int> local_of;                  // each rank's index among its host's ranks
  int shards = 0;  // S: the fewest ranks on a host
  int widest = 0;  // the most ranks on a host
  int rank = 0;
  int host = 0;   // this rank's host
  int local = 0;  // this rank's index among its host's ranks

  // `hosts[q]`: rank q's host identity (comm/hosts.hpp).
  static HostLayout of(const std::vector<std::string>& hosts, int rank);

  int nranks() const { return static_cast<int>(host_of.size()); }
  int nhosts() const { return static_cast<int>(host_ranks.size()); }
  const std::vector<int>& local_ranks() const { return host_ranks[host]; }
  // Local rank s of every host, in host order (s < shards).
  std::vector<int> shard_group(int s) const;
};

}  // namespace concord::hierarchical
