// Which ranks share a host.
//
// A host is a set of ranks that can share memory: the shm backend maps one
// POSIX shared-memory segment (in /dev/shm) into every rank of a host and
// tells a dead peer by its process id. So a host identity is
//
//   <host name>/<digest of the boot id, the /dev/shm file system and the
//                PID namespace>
//
// Two processes are on one host when all of these match: the same kernel
// (boot id), the same /dev/shm (not merely the same path: a container or a
// mount namespace with its own tmpfs there cannot see the segments of the
// others), process ids that mean the same thing (PID namespace) and the same
// host name (a UTS namespace with a name of its own is a host of its own,
// as the launcher sees it). Ranks on one host use shared memory among
// themselves; ranks on different hosts meet over TCP (gloo).
//
// CONCORD_HOST_ID, when set, is the host identity instead: ranks that set
// the same value are one host, and must then be able to share memory.
#pragma once

#include <string>
#include <vector>

namespace concord {

class StoreClient;

// This process's host identity (see above).
std::string host_identity();

// Every rank's host identity, in rank order: each rank publishes `mine`
// under `name`, rank 0 gathers them and publishes the list every rank reads
// (collective; each wait is at most timeout_s).
std::vector<std::string> exchange_hosts(StoreClient& store, const std::string& name, int rank,
                                        int size, double timeout_s, const std::string& mine);

// The rank's index among the ranks on its own host.
int local_rank_of(const std::vector<std::string>& hosts, int rank);

}  // namespace concord
