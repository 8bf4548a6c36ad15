// Runs the ranks of a communicator as threads of this process, the way
// Gloo's tests spawn(2, [&](auto ctx) {...}).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.hpp"

namespace concord::testing {

// Each thread gets its own store client and Communicator of `nranks` ranks
// with the backends of `choice`; the first exception thrown by any rank is
// rethrown after all joined. `hosts`, when given, is every rank's host
// identity (comm/hosts.hpp), so threads of one process can stand for ranks
// on several hosts; otherwise every rank is on this process's host.
void spawn_ranks(int nranks, const std::function<void(Communicator&)>& body,
                 double timeout_s = 30.0, BackendChoice choice = BackendChoice::kAuto,
                 const std::vector<std::string>& hosts = {});

// Host identities for ranks laid out host after host: {2, 1} is
// {"host0", "host0", "host1"}.
std::vector<std::string> hosts_of_sizes(const std::vector<int>& ranks_per_host);

}  // namespace concord::testing
