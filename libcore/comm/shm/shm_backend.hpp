// The shared-memory backend: ranks of one host exchange data through one
// segment. Large messages move in pipelined chunks of at most
// slot_bytes per rank, so the segment stays bounded for any message size.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.hpp"
#include "comm/backend.hpp"
#include "comm/shm/layout.hpp"
#include "comm/shm/segment.hpp"

namespace concord {
class StoreClient;
}

namespace concord::shm {

struct ShmConfig {
  std::size_t slot_bytes = 1u << 20;     // per rank and buffer; CONCORD_SHM_CHUNK_BYTES
  std::size_t one_shot_bytes = 32u << 10;  // all_reduce below this: one step; CONCORD_SHM_ONESHOT_BYTES
  // all_gather and broadcast of at least this many bytes per rank, and
  // reduce_scatter and all_reduce whose part per rank has at least this
  // many, read the peers' buffers directly (cma.hpp) when the kernel allows
  // it; CONCORD_SHM_CMA_BYTES, 0 to never. Below 16 MiB the copies through
  // the segment, which stay in cache, were measured faster than the kernel's
  // page pinning of a direct read.
  std::size_t single_copy_bytes = 16u << 20;
  double timeout_s = 600.0;

  // Defaults adjusted by the environment; throws InvalidArgument on bad values.
  static ShmConfig from_env(int nranks, double timeout_s);
};

class ShmBackend final : public Backend {
 public:
  // Collective over the ranks of `name`: rank 0 creates the segment and
  // publishes its name through the store; the others attach.
  ShmBackend(StoreClient& store, const std::string& name, int rank, int nranks, ShmConfig config);

  const char* name() const noexcept override { return "shm"; }
  DeviceKind device_kind() const noexcept override { return DeviceKind::kCPU; }
  Completion completion() const noexcept override { return Completion::kOnReturn; }
  void all_reduce(const OpContext& ctx, const void* send, void* recv, std::size_t count,
                  DType dtype, ReduceOp op) override;
  void all_gather(const OpContext& ctx, const void* send, void* recv, std::size_t bytes) override;
  void reduce_scatter(const OpContext& ctx, const void* send, void* recv, std::size_t count,
                      DType dtype, ReduceOp op) override;
  void broadcast(const OpContext& ctx, const void* send, void* recv, std::size_t bytes,
                 int root) override;
  void barrier(const OpContext& ctx) override;
  void abort(const Status& cause) noexcept override;
  // Whether large collectives read the peers' buffers directly (agreed at
  // set-up).
  bool single_copy() const noexcept { return single_copy_; }

 private:
  struct Step {  // one pipeline step: which buffer it uses
    int buffer;
  };

  // Rank 0 creates the segment and publishes its name; the others attach.
  void attach(StoreClient& store, const std::string& name);
  // Makes every rank fail when one could not attach (see the .cpp).
  void agree_on_attaching(StoreClient& store, const std::string& name,
                          const std::optional<Status>& failure);
  // Whether every rank can read every peer's memory (cma.hpp): asked once,
  // at set-up, so that all ranks pick the same algorithms.
  void agree_on_single_copy();
  void all_gather_single_copy(const OpContext& ctx, const void* send, void* recv,
                              std::size_t bytes);
  void reduce_scatter_single_copy(const OpContext& ctx, const void* send, void* recv,
                                  std::size_t count, DType dtype, ReduceOp op);
  void all_reduce_single_copy(const OpContext& ctx, const void* send, void* recv,
                              std::size_t count, DType dtype, ReduceOp op);
  void reduce_from_peers(OpLabel label, const Step& step, const char* mine, std::uint64_t offset,
                         void* out, std::size_t count, DType dtype, ReduceOp op);
  void broadcast_single_copy(const OpContext& ctx, const void* send, void* recv,
                             std::size_t bytes, int root);
  // Reads `bytes` at `address` in rank `peer`'s memory into `local`.
  void read_peer(OpLabel label, int peer, void* local, std::uint64_t address, std::size_t bytes);
  void all_reduce_one_shot(const OpContext& ctx, const void* send, void* recv,
                           std::size_t count, DType dtype, ReduceOp op);
  void all_reduce_pipelined(const OpContext& ctx, const void* send, void* recv, std::size_t count,
                            DType dtype, ReduceOp op);

  // Starts an operation: sets its deadline, fails fast if aborted.
  void begin(OpLabel label);
  Step next_step() noexcept;
  void publish_descriptor(const Step& step, const OpContext& ctx, CallKind kind,
                          std::uint64_t count, const void* address = nullptr) noexcept;
  void check_descriptors(const Step& step, OpLabel label);
  // Publishes this rank's step and waits until every rank published it.
  void sync(OpLabel label);
  // `cpu`: the one this rank runs on (sched_getcpu), -1 if unknown.
  void wait_for_rank(int peer, std::uint32_t target, int cpu, OpLabel label);
  [[noreturn]] void fail_waiting(OpLabel label, std::uint32_t target, StatusCode code,
                                 const std::string& why);
  // Aborts the communicator (so the peers fail too) and throws.
  [[noreturn]] void fail_and_abort(OpLabel label, StatusCode code, const std::string& why);
  void check_aborted(OpLabel label);
  bool peer_alive(int peer) const noexcept;

  char* slot(int buffer, int rank) const noexcept;
  Descriptor& descriptor(int buffer, int rank) const noexcept;

  ShmConfig config_;
  int rank_;
  int nranks_;
  int spin_iterations_;  // before yielding: none when ranks outnumber cores
  Segment segment_;
  Header* header_ = nullptr;
  RankControl* controls_ = nullptr;
  Descriptor* descriptors_ = nullptr;
  char* data_ = nullptr;
  std::uint32_t step_ = 0;        // steps published by this rank
  std::uint64_t buffer_turn_ = 0;  // alternates the data buffers across steps
  std::chrono::steady_clock::time_point deadline_;
  // One source pointer per rank for the reductions, allocated once rather
  // than on every collective (the backend runs one collective at a time).
  std::vector<const void*> sources_;
  bool single_copy_ = false;  // agreed by every rank at set-up
  const std::uint64_t probe_value_ = kMagic;  // what peers read to test single-copy reads
};

}  // namespace concord::shm
