// concord.jax's XLA FFI handlers: one per collective and platform, each
// turning XLA's buffers into DLTensors and calling the C ABI on the
// communicator its `comm` attribute names (registry.hpp).
//
// Every handler takes and returns a token besides its buffers: concord.jax
// threads one through all its calls (an ordered effect), so XLA neither
// drops, reorders nor overlaps them and every rank issues them in program
// order. Results are XLA's output buffers; an all_reduce's or broadcast's
// is its operand's when XLA can spare that (concord.jax asks for the alias),
// which the C ABI sees as an in-place call (the same data pointer).
//
// The CUDA handlers pass the stream XLA gives them to the C ABI, which
// enqueues NCCL on it and returns without waiting on the host, as XLA
// expects of a GPU custom call. They need no CUDA header: the C ABI takes
// the stream as a void*.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "concord/concord.h"
#include "registry.hpp"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// Where one call runs: the device its buffers are on and the stream to
// enqueue on (none on the CPU).
struct Place {
  DLDevice device;
  void* stream;
};

constexpr Place kHost{{kDLCPU, 0}, nullptr};

// The DLPack type of an XLA element type. Widths the C ABI does not support
// are passed on as they are and refused there, with its own message.
std::optional<DLDataType> dlpack_dtype(ffi::DataType type) {
  const auto bits = [type](std::uint8_t code) {
    return DLDataType{code, static_cast<std::uint8_t>(ffi::ByteWidth(type) * 8), 1};
  };
  switch (type) {
    case ffi::DataType::PRED: return bits(kDLBool);
    case ffi::DataType::S8:
    case ffi::DataType::S16:
    case ffi::DataType::S32:
    case ffi::DataType::S64: return bits(kDLInt);
    case ffi::DataType::U8:
    case ffi::DataType::U16:
    case ffi::DataType::U32:
    case ffi::DataType::U64: return bits(kDLUInt);
    case ffi::DataType::F16:
    case ffi::DataType::F32:
    case ffi::DataType::F64: return bits(kDLFloat);
    case ffi::DataType::BF16: return bits(kDLBfloat);
    case ffi::DataType::C64:
    case ffi::DataType::C128: return bits(kDLComplex);
    default: return std::nullopt;
  }
}

// A buffer as a DLTensor: XLA's buffers here are dense and row-major, as
// concord.jax lowers every call with the default layouts.
class View {
 public:
  View(const ffi::AnyBuffer& buffer, const Place& place) {
    const auto dims = buffer.dimensions();
    tensor_.data = buffer.untyped_data();
    tensor_.device = place.device;
    tensor_.ndim = static_cast<std::int32_t>(dims.size());
    tensor_.shape = const_cast<std::int64_t*>(dims.begin());  // the C ABI only reads it
    tensor_.strides = nullptr;
    tensor_.byte_offset = 0;
    dtype_ = dlpack_dtype(buffer.element_type());
    if (dtype_) tensor_.dtype = *dtype_;
  }

  bool supported() const noexcept { return dtype_.has_value(); }
  DLTensor* get() noexcept { return &tensor_; }

 private:
  DLTensor tensor_{};
  std::optional<DLDataType> dtype_;
};

// XLA's code for a concord status, and the name Python gives the status
// when concord raises it outside jit (errors.py).
struct Kind {
  ffi::ErrorCode code;
  const char* name;
};

Kind kind_of(concord_status status) {
  using Code = ffi::ErrorCode;
  switch (status) {
    case CONCORD_ERR_INVALID_ARGUMENT: return {Code::kInvalidArgument, "InvalidArgumentError"};
    case CONCORD_ERR_UNAVAILABLE: return {Code::kUnavailable, "UnavailableError"};
    case CONCORD_ERR_TIMEOUT: return {Code::kDeadlineExceeded, "CollectiveTimeoutError"};
    case CONCORD_ERR_REMOTE: return {Code::kAborted, "RemoteError"};
    case CONCORD_ERR_MISMATCH: return {Code::kFailedPrecondition, "MismatchError"};
    case CONCORD_ERR_ABORTED: return {Code::kAborted, "AbortedError"};
    case CONCORD_ERR_OUT_OF_MEMORY: return {Code::kResourceExhausted, "ConcordError"};
    case CONCORD_ERR_INTERRUPTED: return {Code::kCancelled, "ConcordError"};
    default: return {Code::kInternal, "ConcordError"};
  }
}

ffi::Error failure(const char* op, ffi::ErrorCode code, const char* name, const std::string& why) {
  return ffi::Error(code, std::string("concord.jax ") + op + ": " + name + ": " + why);
}

// Runs `call(comm)` (a C ABI call returning a status) on the communicator
// of `comm_id`, with the C library's message on failure. The message is
// read on this thread right after the call, where the C ABI keeps it.
template <class Call>
ffi::Error run(const char* op, std::int64_t comm_id, Call&& call) {
  const auto lease = concord_jax::Registry::instance().lease(comm_id);
  if (lease.comm() == nullptr)
    return failure(op, ffi::ErrorCode::kFailedPrecondition, "ConcordError",
                   "the communicator this computation was traced with (concord.jax #" +
                       std::to_string(comm_id) +
                       ") is closed; trace the function again with an open one");
  const concord_status status = call(lease.comm());
  if (status == CONCORD_OK) return ffi::Error::Success();
  const Kind kind = kind_of(status);
  const std::string detail = concord_last_error();
  return failure(op, kind.code, kind.name,
                 detail.empty() ? std::string(concord_status_string(status)) : detail);
}

ffi::Error unsupported(const char* op, const ffi::AnyBuffer& buffer) {
  return failure(op, ffi::ErrorCode::kInvalidArgument, "InvalidArgumentError",
                 "XLA element type " + std::to_string(static_cast<int>(buffer.element_type())) +
                     " has no DLPack equivalent");
}

// ---- the collectives, on any place ---------------------------------------------

ffi::Error all_reduce(const Place& place, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                      std::int64_t comm, std::int32_t op) {
  View send(x, place), recv(*y, place);
  if (!send.supported()) return unsupported("all_reduce", x);
  return run("all_reduce", comm, [&](concord_comm_t c) {
    return concord_comm_all_reduce(c, send.get(), recv.get(), static_cast<concord_reduce_op>(op),
                                   place.stream, nullptr);
  });
}

ffi::Error all_gather(const Place& place, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                      std::int64_t comm) {
  View send(x, place), recv(*y, place);
  if (!send.supported()) return unsupported("all_gather", x);
  return run("all_gather", comm, [&](concord_comm_t c) {
    return concord_comm_all_gather(c, send.get(), recv.get(), place.stream, nullptr);
  });
}

ffi::Error reduce_scatter(const Place& place, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                          std::int64_t comm, std::int32_t op) {
  View send(x, place), recv(*y, place);
  if (!send.supported()) return unsupported("reduce_scatter", x);
  return run("reduce_scatter", comm, [&](concord_comm_t c) {
    return concord_comm_reduce_scatter(c, send.get(), recv.get(),
                                       static_cast<concord_reduce_op>(op), place.stream, nullptr);
  });
}

ffi::Error broadcast(const Place& place, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                     std::int64_t comm, std::int32_t root) {
  View send(x, place), recv(*y, place);
  if (!send.supported()) return unsupported("broadcast", x);
  return run("broadcast", comm, [&](concord_comm_t c) {
    return concord_comm_broadcast(c, send.get(), recv.get(), root, place.stream, nullptr);
  });
}

// ---- bindings --------------------------------------------------------------------
// Operands (x, token), results (y, token), the communicator's id, then the
// collective's own attributes; the CUDA handlers first take the stream and
// the device from XLA's context.

template <auto collective>
struct Handlers {
  template <class... Attributes>
  static ffi::Error host(ffi::AnyBuffer x, ffi::Token, ffi::Result<ffi::AnyBuffer> y,
                         ffi::Result<ffi::Token>, std::int64_t comm, Attributes... attributes) {
    return collective(kHost, x, y, comm, attributes...);
  }

  template <class... Attributes>
  static ffi::Error cuda(void* stream, std::int32_t device, ffi::AnyBuffer x, ffi::Token,
                         ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::Token>, std::int64_t comm,
                         Attributes... attributes) {
    return collective(Place{{kDLCUDA, device}, stream}, x, y, comm, attributes...);
  }
};

template <class Binding>
auto with_buffers(Binding&& binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::Token>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::Token>()
      .template Attr<std::int64_t>("comm");
}

auto host_binding() { return with_buffers(ffi::Ffi::Bind()); }

auto cuda_binding() {
  return with_buffers(
      ffi::Ffi::Bind().Ctx<ffi::PlatformStream<void*>>().Ctx<ffi::DeviceOrdinal>());
}

}  // namespace

// The handler symbols Python registers with XLA (jax.ffi.register_ffi_target).
#pragma GCC visibility push(default)

XLA_FFI_DEFINE_HANDLER_SYMBOL(concord_jax_all_reduce_cpu,
                              Handlers<all_reduce>::host<std::int32_t>,
                              host_binding().Attr<std::int32_t>("op"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(concord_jax_all_gather_cpu, Handlers<all_gather>::host<>,
                              host_binding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(concord_jax_reduce_scatter_cpu,
                              Handlers<reduce_scatter>::host<std::int32_t>,
                              host_binding().Attr<std::int32_t>("op"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(concord_jax_broadcast_cpu,
                              Handlers<broadcast>::host<std::int32_t>,
                              host_binding().Attr<std::int32_t>("root"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(concord_jax_all_reduce_cuda,
                              Handlers<all_reduce>::cuda<std::int32_t>,
                              cuda_binding().Attr<std::int32_t>("op"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(concord_jax_all_gather_cuda, Handlers<all_gather>::cuda<>,
                              cuda_binding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(concord_jax_reduce_scatter_cuda,
                              Handlers<reduce_scatter>::cuda<std::int32_t>,
                              cuda_binding().Attr<std::int32_t>("op"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(concord_jax_broadcast_cuda,
                              Handlers<broadcast>::cuda<std::int32_t>,
                              cuda_binding().Attr<std::int32_t>("root"));

#pragma GCC visibility pop
