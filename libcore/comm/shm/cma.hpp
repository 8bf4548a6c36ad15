// Cross-memory attach (CMA): reading another process's memory directly with
// process_vm_readv, so a large all_gather or broadcast copies each byte once,
// from the peer's buffer into the result, instead of twice through the
// shared segment. The kernel may refuse it (ptrace policy, seccomp, an old
// kernel): callers probe it once and fall back to the segment.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

namespace concord::shm {

// Copies `bytes` from address `remote` of process `pid` into `local`.
// Returns 0, or the errno of the first failure (ESRCH: the process is gone;
// EPERM: not allowed; EFAULT: a bad address).
int cma_read(pid_t pid, void* local, std::uint64_t remote, std::size_t bytes) noexcept;

}  // namespace concord::shm
