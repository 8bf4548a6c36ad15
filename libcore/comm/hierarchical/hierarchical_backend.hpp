// The shm+gloo backend, for ranks on several hosts when some host has
// several: shared memory among the ranks of each host, gloo between hosts,
// each byte crossing the network once. It composes three backends made by
// the factory (comm/backends.cpp) over groups of the communicator's ranks:
//
// - world: gloo over every rank. Every collective starts with its exchange
//   of CallRecords (128 bytes to every other rank, one network step), so
//   ranks that disagree all fail with Mismatch before any data moves, a
//   rank that never calls is named by every rank that timed out waiting for
//   it, and a dead rank is seen by all. Small collectives (the world's
//   one-step size) run on the world alone, their data in that exchange:
//   one network step instead of the agreement, two shm steps and the
//   leaders' step between them, which is what their latency is made of.
// - local: shm over this host's ranks.
// - across: gloo over this rank's shard group (comm/hierarchical/host_layout.hpp),
//   for local ranks below S only.
//
// all_reduce: reduce the host's values into shards (an shm reduce-scatter
// when the host has one rank a shard and the shards are of equal size, else
// an shm all_reduce), all-reduce each shard within its shard group, share
// the shards on each host (an shm all-gather, or one broadcast per shard). Messages
// below the sharding size form one shard, carried by the local leaders. reduce_scatter runs the same steps on
// blocks laid out by their owners' hosts, all_gather gathers each host's
// blocks, exchanges them among the leaders (padded to the widest host) and
// broadcasts them on each host; broadcast goes from the root's host to the
// ranks of its shard group, then on each host. Partial results travel as
// comm/gloo/partial.hpp says, so results match the shm backend's.
//
// A failure in any step aborts all three backends with the root cause, so
// the ranks of every host fail with it.
#pragma once

#include <memory>
#include <string>

#include "comm/backend.hpp"
#include "comm/gloo/gloo_backend.hpp"
#include "comm/hierarchical/host_layout.hpp"

namespace concord::hierarchical {

class HierarchicalBackend final : public Backend {
 public:
  // `across` is nullptr for a rank outside every shard group.
  HierarchicalBackend(HostLayout layout, std::unique_ptr<gloo::GlooBackend> world,
                      std::unique_ptr<Backend> local, std::unique_ptr<Backend> across);

  const char* name() const noexcept override { return "shm+gloo"; }
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
  void all_reduce_multi(const OpContext& ctx, std::span<const TensorView> tensors,
                        ReduceOp op) override;
  void abort(const Status& cause) noexcept override;

 private:
  // The world's agreement; a failure other than Mismatch aborts all.
  void agree(const OpContext& ctx, CallKind kind, std::uint64_t count);
  // Runs a collective on the world alone, failing as agree() does.
  template <class Step>
  void on_world(Step&& step);
  // Runs a step on `local` or `across`; a failure aborts all three
  // backends and is rethrown. Messages of the shm backend number the
  // host's ranks from 0: `note` says which ranks they are.
  template <class Step>
  void run(Step&& step, const std::string& note = {});
  // Shards a message of `bytes` bytes is cut into.
  int shards_for(std::size_t bytes) const;

  HostLayout layout_;
  std::unique_ptr<gloo::GlooBackend> world_;
  std::unique_ptr<Backend> local_;
  std::unique_ptr<Backend> across_;
  std::string host_note_;
};

}  // namespace concord::hierarchical
