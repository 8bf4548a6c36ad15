#include "base/status.hpp"

namespace concord {

void throw_status(const Status& status) { throw Error(status.code, status.message); }

}  // namespace concord
