// Internal to the C ABI: handle structs and the exception-to-status
// guard every exported function wraps its body in.
#pragma once

#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "base/format.hpp"
#include "base/tensor_view.hpp"
#include "comm/communicator.hpp"
#include "comm/world.hpp"
#include "concord/concord.h"
#include "rendezvous/store.hpp"

struct concord_store_server {
  std::unique_ptr<concord::StoreServer> server;
};

struct concord_store {
  std::shared_ptr<concord::SharedStore> store;
};

struct concord_comm {
  concord::World world;  // world.server is set when this rank serves the store
  concord::Communicator& comm() const { return *world.comm; }
};

struct concord_work {
  std::shared_ptr<concord::Work> work;
};

namespace concord::cabi {

// The C enums are libcore's, value for value: a status or an op crosses
// the ABI as its number.
#define CONCORD_SAME_CODE(c, cpp) static_assert(static_cast<int>(c) == static_cast<int>(cpp), #c)
CONCORD_SAME_CODE(CONCORD_OK, StatusCode::kOk);
CONCORD_SAME_CODE(CONCORD_ERR_INVALID_ARGUMENT, StatusCode::kInvalidArgument);
CONCORD_SAME_CODE(CONCORD_ERR_UNAVAILABLE, StatusCode::kUnavailable);
CONCORD_SAME_CODE(CONCORD_ERR_TIMEOUT, StatusCode::kTimeout);
CONCORD_SAME_CODE(CONCORD_ERR_REMOTE, StatusCode::kRemote);
CONCORD_SAME_CODE(CONCORD_ERR_MISMATCH, StatusCode::kMismatch);
CONCORD_SAME_CODE(CONCORD_ERR_ABORTED, StatusCode::kAborted);
CONCORD_SAME_CODE(CONCORD_ERR_OUT_OF_MEMORY, StatusCode::kOutOfMemory);
CONCORD_SAME_CODE(CONCORD_ERR_INTERNAL, StatusCode::kInternal);
CONCORD_SAME_CODE(CONCORD_ERR_INTERRUPTED, StatusCode::kInterrupted);
CONCORD_SAME_CODE(CONCORD_SUM, ReduceOp::kSum);
CONCORD_SAME_CODE(CONCORD_PROD, ReduceOp::kProd);
CONCORD_SAME_CODE(CONCORD_MAX, ReduceOp::kMax);
CONCORD_SAME_CODE(CONCORD_MIN, ReduceOp::kMin);
CONCORD_SAME_CODE(CONCORD_MEAN, ReduceOp::kMean);
#undef CONCORD_SAME_CODE

// Records the calling thread's last error and returns its status.
concord_status record(StatusCode code, const char* message) noexcept;

template <typename T>
T& require(T* handle, const char* what) {
  if (handle == nullptr) invalid_argument(what, " is NULL");
  return *handle;
}

template <typename T>
void require_out(T* out, const char* what) {
  if (out == nullptr) invalid_argument("output pointer ", what, " is NULL");
}

inline TensorView view(const DLTensor* tensor, const char* role) {
  return TensorView::from_dlpack(tensor, role);
}

// A role name such as "params[3]" or "confusion_matrix: preds", built in
// place: every call names its tensors, the names are read only on failure,
// and formatting them through a stream and the heap cost more than the
// call's own work for small tensors.
class RoleName {
 public:
  RoleName(const char* name, std::size_t index) {
    std::snprintf(text_, sizeof text_, "%s[%zu]", name, index);
  }
  RoleName(const char* prefix, const char* name) {
    std::snprintf(text_, sizeof text_, "%s: %s", prefix, name);
  }
  const char* c_str() const noexcept { return text_; }

 private:
  char text_[128];
};

// Views of tensors[0..n); `name` names the array and `count` its length
// argument in messages.
inline std::vector<TensorView> views(const DLTensor* const* tensors, std::size_t n,
                                     const char* name, const char* count = "num_tensors") {
  if (tensors == nullptr && n != 0) invalid_argument(name, " is NULL but ", count, " is ", n);
  std::vector<TensorView> result;
  result.reserve(n);
  for (std::size_t i = 0; i < n; ++i) result.push_back(view(tensors[i], RoleName(name, i).c_str()));
  return result;
}

// An options struct as this library knows it: `given` (struct_size at most
// sizeof(Options): a caller built against an older header passes a smaller
// one) over `defaults` (its _INIT macro), or the defaults for NULL.
template <typename Options>
Options read_options(const Options* given, const Options& defaults, const char* type) {
  if (given == nullptr) return defaults;
  const std::size_t size = given->struct_size;
  if (size < sizeof(std::size_t) || size > sizeof(Options))
    invalid_argument("options->struct_size is ", size, "; expected sizeof(", type, ") = ",
                     sizeof(Options), ", or the smaller size of an older header's ", type);
  Options result = defaults;
  std::memcpy(&result, given, size);
  result.struct_size = sizeof(Options);
  return result;
}

// C lets any int through an enum; these take the raw value, since loading
// an out-of-range value as a C++ enum is undefined.
ReduceOp to_reduce_op(int op);

// The integer a C caller stored in an enum field of an options struct.
template <typename E>
int enum_value(const E& field) {
  static_assert(sizeof(E) == sizeof(int), "C enums are int-sized");
  int value;
  std::memcpy(&value, &field, sizeof value);
  return value;
}

}  // namespace concord::cabi

#define CONCORD_API_BEGIN try {
#define CONCORD_API_END                                                         \
  }                                                                             \
  catch (const concord::Error& e) {                                             \
    return concord::cabi::record(e.code(), e.what());                           \
  }                                                                             \
  catch (const std::bad_alloc&) {                                               \
    return concord::cabi::record(concord::StatusCode::kOutOfMemory, "out of memory"); \
  }                                                                             \
  catch (const std::exception& e) {                                             \
    return concord::cabi::record(concord::StatusCode::kInternal, e.what());     \
  }                                                                             \
  catch (...) {                                                                 \
    return concord::cabi::record(concord::StatusCode::kInternal, "unknown internal error"); \
  }                                                                             \
  return CONCORD_OK;
