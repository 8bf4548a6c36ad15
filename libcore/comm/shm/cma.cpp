#include "comm/shm/cma.hpp"

#include <sys/uio.h>

#include <cerrno>

namespace concord::shm {

int cma_read(pid_t pid, void* local, std::uint64_t remote, std::size_t bytes) noexcept {
  auto* to = static_cast<char*>(local);
  while (bytes != 0) {
    iovec mine{to, bytes};
    iovec theirs{reinterpret_cast<void*>(remote), bytes};
    const ssize_t got = ::process_vm_readv(pid, &mine, 1, &theirs, 1, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (got == 0) return EFAULT;
    to += got;
    remote += static_cast<std::uint64_t>(got);
    bytes -= static_cast<std::size_t>(got);
  }
  return 0;
}

}  // namespace concord::shm
