// The shared-memory backend: ranks of one host exchange data through one
// segment (DESIGN.md §3). Large messages move in pipelined chunks of at most
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

 private:
  struct Step {  // one pipeline step: which buffer it uses
    int buffer;
  };

  // Rank 0 creates the segment and publishes its name; the others attach.
  void attach(StoreClient& store, const std::string& name);
  // Makes every rank fail when one could not attach (see the .cpp).
  void agree_on_attaching(StoreClient& store, const std::string& name,
                          const std::optional<Status>& failure);
  void all_reduce_one_shot(const OpContext& ctx, const void* send, void* recv,
                           std::size_t count, DType dtype, ReduceOp op);
  void all_reduce_pipelined(const OpContext& ctx, const void* send, void* recv, std::size_t count,
                            DType dtype, ReduceOp op);

  // Starts an operation: sets its deadline, fails fast if aborted.
  void begin(OpLabel label);
  Step next_step() noexcept;
  void publish_descriptor(const Step& step, const OpContext& ctx, CallKind kind,
                          std::uint64_t count) noexcept;
  void check_descriptors(const Step& step, OpLabel label);
  // Publishes this rank's step and waits until every rank published it.
  void sync(OpLabel label);
  void wait_for_rank(int peer, std::uint32_t target, OpLabel label);
  [[noreturn]] void fail_waiting(OpLabel label, std::uint32_t target, StatusCode code,
                                 const std::string& why);
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
};

}  // namespace concord::shm
