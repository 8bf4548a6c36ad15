// A 64-bit FNV-1a digest of a sequence of integers: how ranks compare
// things too large for a descriptor (shapes, lists of tensors) without
// exchanging them.
#pragma once

#include <cstdint>

namespace concord {

class Digest {
 public:
  Digest& mix(std::uint64_t value) noexcept {
    for (int byte = 0; byte < 8; ++byte, value >>= 8) {
      hash_ ^= value & 0xFF;
      hash_ *= 0x100000001b3ull;
    }
    return *this;
  }
  std::uint64_t value() const noexcept { return hash_; }

 private:
  std::uint64_t hash_ = 0xcbf29ce484222325ull;
};

}  // namespace concord
