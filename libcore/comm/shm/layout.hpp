// Layout of the shared segment of the shm backend:
//
//   Header | RankControl[P] | Descriptor[2][P] | data[2][P][slot_bytes]
//
// Two data buffers alternate between pipeline steps, so a rank may fill the
// next step's slot while peers still read the previous one.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "comm/call_record.hpp"

namespace concord::shm {

inline constexpr std::uint32_t kMagic = 0x434F4E44;  // "COND"
inline constexpr std::size_t kCacheLine = 64;
inline constexpr std::size_t kReasonBytes = 512;

static_assert(std::atomic<std::uint32_t>::is_always_lock_free,
              "cross-process atomics must be lock-free");

// One per rank, each on its own cache line: `step` counts the pipeline
// steps the rank has published; peers wait on it (and sleep on it as a futex).
struct alignas(kCacheLine) RankControl {
  std::atomic<std::uint32_t> step;
  // The CPU the rank ran on when it last published a step: a peer waiting
  // on the same CPU does not spin, as the rank cannot run until it yields.
  std::atomic<std::int32_t> cpu;
  std::int32_t pid;
  // Single-copy transfers (cma.hpp): where this rank's probe value lives in
  // its own memory, and whether it could read every peer's.
  std::uint64_t probe_address;
  std::uint32_t reads_peers;
};

// What a rank is about to do (comm/call_record.hpp); compared across ranks
// at an operation's first step so that disagreeing ranks fail with
// Mismatch instead of hanging or reading each other's bytes as something
// else.
struct alignas(kCacheLine) Descriptor : CallRecord {
  // Single-copy transfers: the buffer peers read (not compared), and for
  // all_reduce the result they read once it is reduced.
  std::uint64_t address;
  std::uint64_t result;
};

struct alignas(kCacheLine) Header {
  std::uint32_t magic;
  std::uint32_t nranks;
  std::uint64_t slot_bytes;
  alignas(kCacheLine) std::atomic<std::uint32_t> aborted;  // 0, or aborting rank + 1
  // The StatusCode peers report for the abort: set before `aborted`.
  std::int32_t abort_cause;
  alignas(kCacheLine) std::atomic<std::uint32_t> sleepers;  // ranks parked on a futex
  char reason[kReasonBytes];
};

struct Layout {
  std::size_t controls;
  std::size_t descriptors;
  std::size_t data;
  std::size_t total;

  static constexpr std::size_t align(std::size_t n, std::size_t to) {
    return (n + to - 1) / to * to;
  }
  static Layout of(int nranks, std::size_t slot_bytes) {
    Layout l{};
    l.controls = align(sizeof(Header), kCacheLine);
    l.descriptors = l.controls + align(sizeof(RankControl) * nranks, kCacheLine);
    l.data = align(l.descriptors + sizeof(Descriptor) * 2 * nranks, 4096);
    l.total = l.data + 2 * static_cast<std::size_t>(nranks) * slot_bytes;
    return l;
  }
};

}  // namespace concord::shm
