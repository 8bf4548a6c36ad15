// What a transport implements. The Communicator validates arguments, numbers
// the operations and orders them; a Backend only moves and reduces bytes of
// already-validated buffers. Gloo's split of algorithms from transports.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/dtype.hpp"
#include "base/reduce_op.hpp"

namespace concord {

// Identifies one collective in error messages: "all_reduce #12".
struct OpLabel {
  const char* name;
  std::uint64_t seq;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const noexcept = 0;

  // recv[i] = op over ranks of send[i], count elements.
  virtual void all_reduce(OpLabel label, const void* send, void* recv, std::size_t count,
                          DType dtype, ReduceOp op) = 0;
  // recv = every rank's `bytes` bytes of send, in rank order.
  virtual void all_gather(OpLabel label, const void* send, void* recv, std::size_t bytes) = 0;
  // send holds size() blocks of `count` elements; recv = op over ranks of block rank().
  virtual void reduce_scatter(OpLabel label, const void* send, void* recv, std::size_t count,
                              DType dtype, ReduceOp op) = 0;
  // recv = root's send (`bytes` bytes); send is read on root only.
  virtual void broadcast(OpLabel label, const void* send, void* recv, std::size_t bytes,
                         int root) = 0;
  virtual void barrier(OpLabel label) = 0;

  // Makes pending and future operations here and on the peers fail.
  virtual void abort(const char* reason) noexcept = 0;
};

}  // namespace concord
