// The gloo backend: CPU collectives over Gloo's TCP transport, for ranks on
// any hosts. The ranks form a full mesh of TCP connections, set up through
// concord's store (comm/gloo/store_adapter.hpp). The job token guards that
// rendezvous; the connections themselves carry no secret, so the ranks
// should reach each other over a network that only the job's hosts share.
//
// Every collective starts with one exchange in which every rank sends every
// other its CallRecord: ranks that disagree all fail with Mismatch before
// any data is reduced. Small collectives (at most one_shot_bytes a peer)
// carry their data in that same exchange and are done with it, like the shm
// backend's one-shot all_reduce: one network step, the agreement included,
// and every rank reduces every rank's values in rank order. Larger ones then
// move their data in one of two ways (their bytes a rank are the same):
// - direct, up to kMostDirectRanks ranks: every rank exchanges its parts
//   with every peer at once. reduce_scatter and all_gather take one step,
//   all_reduce two (a reduce-scatter whose blocks each rank reduces in rank
//   order, then an all-gather of them), where a ring takes p - 1 and
//   2(p - 1) steps of at least two segments each: each step costs a wake-up
//   of every rank, which dominates up to megabytes on busy hosts.
// - ring, past that: gloo's ring all-reduce and all-gather, and a ring
//   reduce-scatter of ours, whose step count grows with p while direct's
//   concurrent messages a rank do.
// Broadcast is gloo's tree. Partial results travel in the representation
// of comm/gloo/partial.hpp. CONCORD_GLOO_ALGORITHM=direct or ring forces one.
//
// Waits end at the communicator's timeout, on an interrupt, or when a
// connection breaks (comm/gloo/transport.hpp). A rank that fails first
// publishes why in the store and then closes its connections. A peer learns
// of it when a wait of its own on that rank breaks, or, waiting for another
// rank, from a receive kept pending on every connection that only a broken
// connection ends (its "sentinel"); it reads the cause and closes its own
// connections in turn, so every rank ends at once with the root cause
// (Timeout when a rank timed out, Remote when one died or aborted). A
// connection that breaks with nothing published is a rank that died, or
// one that left after its last collective: that fails only the waits for
// that rank.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/deadline.hpp"
#include "base/status.hpp"
#include "comm/backend.hpp"
#include "comm/call_record.hpp"
#include "comm/gloo/transport.hpp"

namespace concord {
struct SharedStore;
}

namespace concord::gloo {

class SetupAgreement;

// Up to how many ranks the large collectives go direct (see above).
inline constexpr int kMostDirectRanks = 8;

// How many bytes a peer the collectives of `ranks` ranks carry in the
// agreement exchange: 32 KiB, less with many ranks, so that the exchange's
// buffers (two messages a peer) stay near 2 MiB.
std::size_t default_one_shot_bytes(int ranks);

class GlooBackend final : public Backend, private Watch {
 public:
  // Collective over the `names.size()` ranks meeting under key prefix
  // `name`: connects the mesh. `names[q]` is how messages call rank q (the
  // communicator's ranks, for a backend of a sub-group). Waits during the
  // set-up end early when `setup` learns that a peer's set-up failed.
  // Collectives of at most `one_shot_bytes` a peer go in one step (0: none).
  GlooBackend(SharedStore& store, const std::string& name, int rank, std::vector<int> names,
              double timeout_s, std::size_t one_shot_bytes, const SetupAgreement& setup);

  const char* name() const noexcept override { return "gloo"; }
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

  // The agreement alone, for a backend that composes this one: every rank
  // fails with Mismatch when their calls differ. A barrier, too.
  void agree(const OpContext& ctx, CallKind kind, std::uint64_t count);
  // Whether a collective whose every peer's part is `bytes` bytes goes in
  // the agreement exchange, in one network step.
  bool one_step(std::size_t bytes) const { return size_ == 1 || bytes <= one_shot_bytes_; }

 private:
  // What a rank sends in the agreement exchange after its record: rank q
  // gets `bytes` bytes at data + q * stride (stride 0: the same for all).
  struct Payload {
    const void* data = nullptr;
    std::size_t bytes = 0;
    std::size_t stride = 0;
  };
  // Why the communicator was aborted: by which rank, with what code.
  struct Abort {
    int by;
    StatusCode code;
    std::string reason;
  };

  // Starts an operation: its deadline; fails if the backend was aborted.
  void begin(const OpContext& ctx);
  // The agreement exchange; throws Mismatch when the records differ.
  void exchange(const CallRecord& mine, Payload payload);
  // What rank q sent after its record in the last exchange.
  const unsigned char* payload_of(int q) const;
  // Posts the receives of the next exchange (once this one's payloads are
  // used). A connection found broken is remembered for that exchange:
  // the operation that just finished did finish.
  void arm();
  // Runs `body`, turning gloo's own errors into concord's.
  template <class F>
  void guarded(F&& body);

  void ring_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op);
  // The reduce-scatters take `in` in partial_dtype(dtype, op).
  void ring_reduce_scatter(const unsigned char* in, void* recv, std::size_t count, DType dtype,
                           ReduceOp op);
  void direct_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op);
  void direct_reduce_scatter(const unsigned char* in, void* recv, std::size_t count, DType dtype,
                             ReduceOp op);
  void direct_all_gather(const void* send, void* recv, std::size_t bytes);
  // A region of memory a message comes from or goes to.
  struct Part {
    const void* data;
    std::size_t bytes;
  };
  // At least `bytes` bytes of the direct collectives' scratch memory.
  unsigned char* scratch(std::size_t bytes);
  using Buffers = std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>>;
  // One step with every peer at once: sends `outgoing(q)` to each peer q
  // and receives its part into `incoming(q)` on `slot`; returns when all
  // arrived and all went out. post_receives and send_and_wait are its two
  // halves, for receives posted ahead.
  template <class Outgoing, class Incoming>
  void direct_step(std::uint64_t slot, Outgoing&& outgoing, Incoming&& incoming);
  template <class Incoming>
  Buffers post_receives(std::uint64_t slot, Incoming&& incoming);
  template <class Outgoing>
  void send_and_wait(std::uint64_t slot, Outgoing&& outgoing, Buffers& receives);

  // Watch
  std::chrono::steady_clock::time_point next_check() const override;
  void check(int peer) override;
  [[noreturn]] void lost(int peer, const std::string& what) override;

  [[noreturn]] void fail_waiting(StatusCode code, const std::string& why,
                                 const std::vector<int>& missing);
  [[noreturn]] void fail_aborted();
  // Ranks whose part of the current wait has not arrived.
  std::vector<int> missing(int peer);
  void throw_if_aborted();
  // The cause the rank that failed first published, if one did.
  std::optional<Abort> published_abort();
  // Fails with that cause, when there is one.
  void fail_if_published();
  // Records `abort` (the first one wins), publishes it when it is this
  // rank's own, and closes every connection.
  void abort_with(Abort abort, bool publish) noexcept;
  std::string rank_name(int q) const;

  SharedStore& store_;
  std::string key_prefix_;
  int rank_;
  int size_;
  std::vector<int> names_;
  double timeout_s_;
  std::size_t one_shot_bytes_;
  bool direct_;  // the large collectives go direct, not in a ring
  std::size_t message_bytes_;  // a record and the largest payload
  std::shared_ptr<::gloo::transport::Device> device_;
  std::shared_ptr<Mesh> mesh_;

  // The agreement exchange: per peer, a region for its message in and one
  // for ours out (records, then payloads), and buffers over them; to_all_
  // buffers all view the first out region, for payloads that every peer gets.
  std::vector<unsigned char> inbox_memory_;
  std::vector<unsigned char> outbox_memory_;
  std::vector<std::unique_ptr<WatchedBuffer>> inbox_;
  std::vector<std::unique_ptr<WatchedBuffer>> to_each_;
  std::vector<std::unique_ptr<WatchedBuffer>> to_all_;
  std::vector<std::optional<std::string>> broken_;  // found by arm(): gloo's reason
  std::vector<unsigned char> sentinel_memory_;
  std::vector<std::unique_ptr<WatchedBuffer>> sentinels_;  // a never-sent receive a peer
  std::vector<CallRecord> records_;
  std::vector<bool> heard_;  // whose message of the current exchange arrived
  bool exchanging_ = false;  // a wait belongs to the agreement exchange
  std::vector<const void*> sources_;  // one a rank, for the one-shot reductions
  // The direct collectives' scratch, kept from call to call: freshly
  // allocated, tens of megabytes cost about as much CPU in page faults
  // (the kernel zeroing each page) as the reductions over them.
  std::unique_ptr<unsigned char[]> scratch_;
  std::size_t scratch_bytes_ = 0;

  OpLabel label_{"", 0};
  SteadyClock::time_point deadline_;
  std::mutex abort_mutex_;
  std::optional<Abort> abort_;
  std::atomic<bool> aborted_{false};
};

}  // namespace concord::gloo
