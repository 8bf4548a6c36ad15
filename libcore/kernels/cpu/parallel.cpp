#include "kernels/cpu/parallel.hpp"

#include <algorithm>
#include <exception>
#include <numeric>
#include <thread>
#include <vector>

#include "base/env.hpp"
#include "base/format.hpp"

namespace concord::cpu {
namespace {

// Below this many elements per thread, starting a thread costs more than it saves.
constexpr std::size_t kMinElementsPerThread = 1u << 20;

// The elements [first, last) of the concatenation of all tensors.
void run_span(std::span<const std::size_t> sizes, std::size_t first, std::size_t last,
              const std::function<void(std::size_t, std::size_t, std::size_t)>& piece) {
  std::size_t start = 0;  // of the current tensor in the concatenation
  for (std::size_t t = 0; t < sizes.size() && start < last; start += sizes[t], ++t) {
    const std::size_t begin = std::max(first, start), end = std::min(last, start + sizes[t]);
    if (begin < end) piece(t, begin - start, end - start);
  }
}

}  // namespace

int kernel_threads() {
  static const int threads = [] {
    if (auto n = env::get_int("CONCORD_NUM_THREADS")) {
      if (*n < 1) invalid_argument("CONCORD_NUM_THREADS must be >= 1, got ", *n);
      return static_cast<int>(*n);
    }
    const long long cores = std::max(1u, std::thread::hardware_concurrency());
    const long long local_ranks = std::max(1LL, env::get_int("LOCAL_WORLD_SIZE").value_or(1));
    return static_cast<int>(std::max(1LL, cores / local_ranks));
  }();
  return threads;
}

void for_each_range(std::span<const std::size_t> sizes,
                    const std::function<void(std::size_t, std::size_t, std::size_t)>& piece) {
  const std::size_t total = std::accumulate(sizes.begin(), sizes.end(), std::size_t{0});
  const std::size_t threads = std::min<std::size_t>(
      static_cast<std::size_t>(kernel_threads()), std::max<std::size_t>(1, total / kMinElementsPerThread));
  if (threads <= 1) return run_span(sizes, 0, total, piece);

  // Spans are multiples of 64 elements so threads never share a cache line.
  const std::size_t span = (total / threads + 63) / 64 * 64;
  std::vector<std::exception_ptr> errors(threads);
  std::vector<std::thread> helpers;
  for (std::size_t k = 1; k < threads; ++k)
    helpers.emplace_back([&, k] {
      try {
        run_span(sizes, std::min(total, k * span), std::min(total, (k + 1) * span), piece);
      } catch (...) {
        errors[k] = std::current_exception();
      }
    });
  try {
    run_span(sizes, 0, std::min(total, span), piece);
  } catch (...) {
    errors[0] = std::current_exception();
  }
  for (auto& h : helpers) h.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace concord::cpu
