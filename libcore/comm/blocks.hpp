// A buffer of `count` elements cut into `blocks` contiguous blocks of at
// most ceil(count / blocks) elements each, rounded up to a multiple of
// `multiple` (the shm backend's parts are whole cache lines, so that ranks
// never write the same line), the way the collectives that give every rank
// (or every host's shard) a part of a buffer cut it. The last blocks are
// shorter, or empty.
#pragma once

#include <algorithm>
#include <cstddef>

namespace concord {

// Elements [begin, begin + size).
struct Block {
  std::size_t begin, size;
};

inline std::size_t most_per_block(std::size_t count, int blocks, std::size_t multiple = 1) {
  const std::size_t n = static_cast<std::size_t>(blocks);
  return ((count + n - 1) / n + multiple - 1) / multiple * multiple;
}

inline Block block_of(int b, std::size_t count, int blocks, std::size_t multiple = 1) {
  const std::size_t most = most_per_block(count, blocks, multiple);
  const std::size_t begin = std::min(count, most * static_cast<std::size_t>(b));
  return {begin, std::min(count, begin + most) - begin};
}

// A buffer's address as bytes, to step through it by byte offsets.
inline unsigned char* bytes_of(void* p) { return static_cast<unsigned char*>(p); }
inline const unsigned char* bytes_of(const void* p) { return static_cast<const unsigned char*>(p); }

}  // namespace concord
