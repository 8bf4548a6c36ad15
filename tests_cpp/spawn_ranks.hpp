// Runs the ranks of a communicator as threads of this process, the way
// Gloo's tests spawn(2, [&](auto ctx) {...}).
#pragma once

#include <functional>

#include "comm/communicator.hpp"

namespace concord::testing {

// Each thread gets its own store client and Communicator of `nranks` ranks
// with the backends of `choice`; the first exception thrown by any rank is
// rethrown after all joined.
void spawn_ranks(int nranks, const std::function<void(Communicator&)>& body,
                 double timeout_s = 30.0, BackendChoice choice = BackendChoice::kAuto);

}  // namespace concord::testing
