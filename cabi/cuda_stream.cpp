// The calling thread's CUDA stream for kernel calls on CUDA tensors
// (concord_set_stream / concord_get_stream in concord.h).
#include "abi_support.hpp"

namespace {
thread_local void* t_stream = nullptr;  // NULL: the legacy default stream
}  // namespace

namespace concord::cabi {

void* current_stream() noexcept { return t_stream; }

}  // namespace concord::cabi

extern "C" {

concord_status concord_set_stream(void* stream) {
  CONCORD_API_BEGIN
  t_stream = stream;
  CONCORD_API_END
}

concord_status concord_get_stream(void** stream) {
  CONCORD_API_BEGIN
  concord::cabi::require_out(stream, "stream");
  *stream = t_stream;
  CONCORD_API_END
}

}  // extern "C"
