#include "base/shape.hpp"

namespace concord {

std::string Shape::str() const {
  std::string out = "(";
  for (std::size_t d = 0; d < ndim_; ++d) {
    if (d > 0) out += ", ";
    out += std::to_string((*this)[d]);
  }
  return out + (ndim_ == 1 ? ",)" : ")");
}

}  // namespace concord
