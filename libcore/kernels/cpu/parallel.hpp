// Splitting elementwise multi-tensor work across threads.
#pragma once

#include <cstddef>
#include <functional>
#include <span>

namespace concord::cpu {

// Threads a large kernel may use: CONCORD_NUM_THREADS if set, else the
// cores divided by the ranks on this host (LOCAL_WORLD_SIZE, as the
// launchers set it), so ranks sharing a host do not oversubscribe it.
int kernel_threads();

// Calls piece(tensor, begin, end) for element ranges that together cover
// every tensor of `sizes` once, spread over up to kernel_threads() threads
// when there is enough work to pay for them; returns once all finished and
// rethrows the first exception of any thread.
void for_each_range(std::span<const std::size_t> sizes,
                    const std::function<void(std::size_t tensor, std::size_t begin,
                                             std::size_t end)>& piece);

}  // namespace concord::cpu
