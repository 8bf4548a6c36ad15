#include "comm/gloo/gloo_backend.hpp"

#include <signal.h>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/types.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "base/env.hpp"
#include "base/format.hpp"
#include "base/interrupt.hpp"
#include "comm/blocks.hpp"
#include "comm/gloo/partial.hpp"
#include "comm/gloo/setup_agreement.hpp"
#include "comm/gloo/store_adapter.hpp"
#include "kernels/cpu/reduce.hpp"
#include "rendezvous/store.hpp"

namespace concord::gloo {
namespace {

// Slots of our own traffic, apart from those of gloo's collectives
// (gloo/types.h uses prefixes 1 to 8).
const std::uint64_t kExchangeSlot = ::gloo::Slot::build(0x40, 0);
const std::uint64_t kRingSlot = ::gloo::Slot::build(0x41, 0);
const std::uint64_t kSentinelSlot = ::gloo::Slot::build(0x42, 0);
// The direct steps: a reduce-scatter's, an all-gather's (all_reduce: both).
const std::uint64_t kScatterSlot = ::gloo::Slot::build(0x43, 0);
const std::uint64_t kGatherSlot = ::gloo::Slot::build(0x44, 0);

// A peer's message in the agreement exchange: its record, then its payload
// at an offset that keeps the payload aligned for any dtype.
constexpr std::size_t kPayloadOffset = 128;
static_assert(sizeof(CallRecord) <= kPayloadOffset);

// How long a rank that saw a connection break waits for the cause a
// failing peer is publishing (it claims the record, then writes it).
constexpr double kPublishingSeconds = 1.0;

// Gloo writes to its sockets with writev(2), which raises SIGPIPE when the
// peer has closed its end; SIGPIPE's default action ends the process, so
// one dead rank would kill every survivor. Unless the program handles
// SIGPIPE itself it is ignored (as Python does): the write then fails with
// EPIPE, which gloo reports as a broken connection.
void ignore_sigpipe() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && !(current.sa_flags & SA_SIGINFO) &&
      current.sa_handler == SIG_DFL)
    signal(SIGPIPE, SIG_IGN);
}

// The context's timeout bounds gloo's own waits while it connects the mesh.
std::chrono::milliseconds gloo_timeout(double seconds) {
  return std::chrono::ceil<std::chrono::milliseconds>(deadline_after(seconds) - SteadyClock::now());
}

// Gloo's options take a typed pointer only to learn the element size.
template <std::size_t N>
struct Element {
  unsigned char bytes[N];
};

template <std::size_t N>
void set_typed(::gloo::AllreduceOptions& opts, const void* in, void* out, std::size_t count) {
  using E = Element<N>;
  if (in != out) opts.setInput(static_cast<E*>(const_cast<void*>(in)), count);
  opts.setOutput(static_cast<E*>(out), count);
}

// in == out: in place.
void set_buffers(::gloo::AllreduceOptions& opts, const void* in, void* out, std::size_t count,
                 std::size_t element) {
  switch (element) {
    case 1: return set_typed<1>(opts, in, out, count);
    case 2: return set_typed<2>(opts, in, out, count);
    case 4: return set_typed<4>(opts, in, out, count);
    case 8: return set_typed<8>(opts, in, out, count);
  }
  invalid_argument("gloo: no element type of ", element, " bytes");
}

// `count` values of `send` in the dtype partial results travel in: `send`
// itself when that is its dtype, else a converted copy that `holder` keeps.
const unsigned char* carried_values(const void* send, DType dtype, DType carried,
                                    std::size_t count, std::unique_ptr<unsigned char[]>& holder) {
  if (carried == dtype) return bytes_of(send);
  holder = std::make_unique_for_overwrite<unsigned char[]>(count * dtype_size(carried));
  convert(send, dtype, holder.get(), carried, count);
  return holder.get();
}

// Whether the large collectives of `ranks` ranks go direct:
// CONCORD_GLOO_ALGORITHM (direct, ring) or by the number of ranks.
bool goes_direct(int ranks) {
  const auto forced = env::get("CONCORD_GLOO_ALGORITHM");
  if (!forced) return ranks <= kMostDirectRanks;
  if (*forced == "direct") return true;
  if (*forced == "ring") return false;
  invalid_argument("CONCORD_GLOO_ALGORITHM='", *forced, "' must be 'direct' or 'ring'");
}

}  // namespace

std::size_t default_one_shot_bytes(int ranks) {
  constexpr std::size_t kMost = 32u << 10;
  constexpr std::size_t kBudget = 1u << 20;  // a direction, over all peers
  const std::size_t fair = kBudget / static_cast<std::size_t>(std::max(1, ranks - 1));
  // A multiple of the payload's offset keeps every message region aligned.
  return std::min(kMost, fair / kPayloadOffset * kPayloadOffset);
}

GlooBackend::GlooBackend(SharedStore& store, const std::string& name, int rank,
                         std::vector<int> names, double timeout_s, std::size_t one_shot_bytes,
                         const SetupAgreement& setup)
    : store_(store), key_prefix_(name + "/gloo"), rank_(rank), size_(static_cast<int>(names.size())),
      names_(std::move(names)), timeout_s_(timeout_s), one_shot_bytes_(one_shot_bytes),
      direct_(goes_direct(size_)), message_bytes_(kPayloadOffset + one_shot_bytes),
      broken_(names_.size()),
      records_(names_.size()), heard_(names_.size()), sources_(names_.size()) {
  ignore_sigpipe();
  std::string store_host;
  int store_port = 0;
  {
    std::lock_guard lock(store.mutex);
    store_host = store.client->host();
    store_port = store.client->port();
  }
  Watch& watch = *this;
  device_ = std::make_shared<WatchedDevice>(device_attr(store_host, store_port), watch);
  mesh_ = std::make_shared<Mesh>(rank_, size_);
  mesh_->setTimeout(gloo_timeout(timeout_s_));
  StoreAdapter adapter(store, key_prefix_, timeout_s_, setup, names_);
  try {
    mesh_->connectFullMesh(adapter, device_);
  } catch (const Error&) {
    throw;  // from the store: a timeout, a peer's failed set-up, an interrupt
  } catch (const std::exception& e) {
    fail(StatusCode::kUnavailable, "gloo: rank ", rank_name(rank_),
         " could not connect to its peers: ", gloo_reason(e));
  }

  inbox_memory_.resize(static_cast<std::size_t>(size_) * message_bytes_);
  outbox_memory_.resize(static_cast<std::size_t>(size_) * message_bytes_);
  const auto transport = mesh_->transport().shared_from_this();
  auto buffer_over = [&](std::vector<unsigned char>& memory, int region) {
    return std::make_unique<WatchedBuffer>(transport, memory.data() + region * message_bytes_,
                                           message_bytes_, watch);
  };
  inbox_.resize(size_);
  to_each_.resize(size_);
  to_all_.resize(size_);
  sentinel_memory_.resize(size_);
  sentinels_.resize(size_);
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    inbox_[q] = buffer_over(inbox_memory_, q);
    to_each_[q] = buffer_over(outbox_memory_, q);
    // Our own region of the outbox is no peer's: it holds what all get.
    to_all_[q] = buffer_over(outbox_memory_, rank_);
    sentinels_[q] = std::make_unique<WatchedBuffer>(transport, &sentinel_memory_[q], 1, watch);
    sentinels_[q]->try_recv(q, kSentinelSlot, 0, 1);  // nobody sends there
  }
  arm();
}

std::string GlooBackend::rank_name(int q) const { return std::to_string(names_[q]); }

// ---- the agreement exchange ------------------------------------------------

void GlooBackend::arm() {
  for (int q = 0; q < size_; ++q)
    if (q != rank_ && !broken_[q]) broken_[q] = inbox_[q]->try_recv(q, kExchangeSlot, 0, message_bytes_);
}

void GlooBackend::exchange(const CallRecord& mine, Payload payload) {
  for (int q = 0; q < size_; ++q)
    if (broken_[q]) lost(q, *broken_[q]);
  // A rank alone sends nothing: its one-step payload (any size, see
  // one_step) is read where it is and must not be copied into a message.
  if (size_ == 1) payload = {};
  auto write = [&](int region, const void* data) {
    unsigned char* message = outbox_memory_.data() + region * message_bytes_;
    std::memcpy(message, &mine, sizeof mine);
    if (payload.bytes != 0) std::memcpy(message + kPayloadOffset, data, payload.bytes);
  };
  auto& senders = payload.stride == 0 ? to_all_ : to_each_;
  if (payload.stride == 0) write(rank_, payload.data);
  for (int q = 0; q < size_; ++q)
    if (q != rank_ && payload.stride != 0) write(q, bytes_of(payload.data) + q * payload.stride);

  exchanging_ = true;
  std::fill(heard_.begin(), heard_.end(), false);
  heard_[rank_] = true;
  for (int q = 0; q < size_; ++q)
    if (q != rank_) senders[q]->send(q, kExchangeSlot, 0, kPayloadOffset + payload.bytes);
  for (int q = 0; q < size_; ++q)
    if (q != rank_) {
      inbox_[q]->waitRecv(nullptr, {});
      heard_[q] = true;
    }
  for (int q = 0; q < size_; ++q)
    if (q != rank_) senders[q]->waitSend(nullptr, {});
  exchanging_ = false;

  for (int q = 0; q < size_; ++q) {
    if (q == rank_)
      records_[q] = mine;
    else
      std::memcpy(&records_[q], inbox_memory_.data() + q * message_bytes_, sizeof(CallRecord));
  }
  try {
    check_agreement(
        label_, rank_, size_, [&](int q) -> const CallRecord& { return records_[q]; },
        [&](int q) { return names_[q]; });
  } catch (const Error&) {
    arm();  // nobody reduced anything: the communicator stays usable
    throw;
  }
}

const unsigned char* GlooBackend::payload_of(int q) const {
  return inbox_memory_.data() + q * message_bytes_ + kPayloadOffset;
}

// ---- waits, failures, abort ------------------------------------------------

void GlooBackend::begin(const OpContext& ctx) {
  label_ = ctx.label;
  deadline_ = deadline_after(timeout_s_);
  exchanging_ = false;
  throw_if_aborted();
}

template <class F>
void GlooBackend::guarded(F&& body) {
  try {
    body();
  } catch (const Error&) {
    throw;
  } catch (const ::gloo::IoException& e) {
    lost(-1, gloo_reason(e));
  } catch (const std::exception& e) {
    fail(StatusCode::kInternal, label_.name, " #", label_.seq, ": gloo: ", gloo_reason(e));
  }
}

std::chrono::steady_clock::time_point GlooBackend::next_check() const {
  return std::min(deadline_, SteadyClock::now() + kInterruptPeriod);
}

void GlooBackend::check(int peer) {
  throw_if_aborted();
  // A peer closed its connections: if it failed, it said why.
  const bool closed = std::any_of(sentinels_.begin(), sentinels_.end(),
                                  [](const auto& s) { return s && s->broken(); });
  if (closed) fail_if_published();
  if (SteadyClock::now() >= deadline_)
    fail_waiting(StatusCode::kTimeout, concat("timed out after ", timeout_s_, " s"), missing(peer));
  if (interrupt_requested()) fail_waiting(StatusCode::kInterrupted, "interrupted", missing(peer));
}

void GlooBackend::lost(int peer, const std::string& what) {
  throw_if_aborted();
  fail_if_published();
  const std::string why = peer < 0 ? concat("a connection broke (", what, ")")
                                   : concat("lost the connection to rank ", rank_name(peer), " (",
                                            what, ")");
  fail_waiting(StatusCode::kRemote, why, missing(peer));
}

std::vector<int> GlooBackend::missing(int peer) {
  std::vector<int> ranks;
  if (exchanging_) {
    for (int q = 0; q < size_; ++q)
      if (!heard_[q] && !inbox_[q]->received()) ranks.push_back(names_[q]);
  } else if (peer >= 0) {
    ranks.push_back(names_[peer]);
  }
  return ranks;
}

void GlooBackend::fail_waiting(StatusCode code, const std::string& why,
                               const std::vector<int>& missing) {
  std::string message =
      concat(label_.name, " #", label_.seq, " on rank ", rank_name(rank_), " failed: ", why);
  if (!missing.empty()) message += concat("; not heard from ranks [", rank_list(missing), "]");
  // The peers fail with the root cause: this rank's timeout, or (a lost
  // peer, an interrupt here) a peer that failed.
  abort_with({rank_, code == StatusCode::kTimeout ? code : StatusCode::kRemote, message},
             /*publish=*/true);
  throw Error(code, message);
}

void GlooBackend::throw_if_aborted() {
  if (aborted_.load(std::memory_order_acquire)) fail_aborted();
}

void GlooBackend::fail_aborted() {
  Abort abort;
  {
    std::lock_guard lock(abort_mutex_);
    abort = *abort_;
  }
  // As the shm backend reports it: a rank that timed out makes every rank
  // time out; one that lost a peer or was told to abort makes them fail
  // as Remote.
  fail(abort.by == rank_ ? StatusCode::kAborted : abort.code, label_.name, " #", label_.seq,
       " on rank ", rank_name(rank_), " failed: rank ", rank_name(abort.by),
       " aborted the communicator: ", abort.reason);
}

void GlooBackend::fail_if_published() {
  if (auto cause = published_abort()) {
    abort_with(std::move(*cause), /*publish=*/false);
    fail_aborted();
  }
}

std::optional<GlooBackend::Abort> GlooBackend::published_abort() {
  try {
    std::lock_guard lock(store_.mutex);
    StoreClient& store = *store_.client;
    if (store.add(key_prefix_ + "/abort", 0) == 0) return std::nullopt;
    std::istringstream record(store.get(key_prefix_ + "/abort_reason",
                                        std::chrono::duration<double>(
                                            std::min(timeout_s_, kPublishingSeconds))));
    int code = static_cast<int>(StatusCode::kRemote);
    int by = 0;
    record >> code >> by;
    std::string reason;
    std::getline(record >> std::ws, reason);
    if (by < 0 || by >= size_) return std::nullopt;
    return Abort{by, static_cast<StatusCode>(code), reason};
  } catch (const Error&) {
    return std::nullopt;  // the store is gone too: nothing to learn there
  }
}

void GlooBackend::abort(const Status& cause) noexcept {
  abort_with({rank_, cause.code, cause.message}, /*publish=*/true);
}

void GlooBackend::abort_with(Abort abort, bool publish) noexcept {
  {
    std::lock_guard lock(abort_mutex_);
    if (abort_) return;
    abort_ = abort;
    aborted_.store(true, std::memory_order_release);
  }
  // Published before any connection closes, so a peer that sees one close
  // finds the cause. The first rank to claim the record writes it.
  if (publish) {
    try {
      std::lock_guard lock(store_.mutex);
      StoreClient& store = *store_.client;
      if (store.add(key_prefix_ + "/abort", 1) == 1)
        store.set(key_prefix_ + "/abort_reason",
                  concat(static_cast<int>(abort.code), " ", abort.by, " ", abort.reason));
    } catch (const std::exception&) {
      // The peers still fail when the connections close, as if this rank died.
    }
  }
  try {
    mesh_->transport().close_all(concat("rank ", rank_name(abort.by), " aborted the communicator"));
  } catch (const std::exception&) {
  }
}

// ---- collectives -----------------------------------------------------------

void GlooBackend::all_reduce(const OpContext& ctx, const void* send, void* recv, std::size_t count,
                             DType dtype, ReduceOp op) {
  begin(ctx);
  const std::size_t bytes = count * dtype_size(dtype);
  const bool one_shot = one_step(bytes);
  guarded([&] {
    exchange(record_of(CallKind::kAllReduce, ctx, count), one_shot ? Payload{send, bytes} : Payload{});
    if (!one_shot && direct_) return direct_all_reduce(send, recv, count, dtype, op);
    if (!one_shot) return ring_all_reduce(send, recv, count, dtype, op);
    // Every rank reduces every rank's values in rank order, as the shm
    // backend's one-shot all_reduce does: the ranks agree bitwise.
    for (int q = 0; q < size_; ++q) sources_[q] = q == rank_ ? send : payload_of(q);
    if (count != 0) cpu::reduce_sources(recv, sources_.data(), size_, count, dtype, op, size_);
  });
  arm();
}

void GlooBackend::ring_all_reduce(const void* send, void* recv, std::size_t count, DType dtype,
                                  ReduceOp op) {
  const DType carried = partial_dtype(dtype, op);
  const ReduceOp combine = partial_op(op);
  std::unique_ptr<unsigned char[]> widened;
  const void* in = send;
  void* out = recv;
  if (carried != dtype) {
    widened = std::make_unique_for_overwrite<unsigned char[]>(count * dtype_size(carried));
    convert(send, dtype, widened.get(), carried, count);
    in = out = widened.get();
  }
  ::gloo::AllreduceOptions opts(mesh_);
  set_buffers(opts, in, out, count, dtype_size(carried));
  opts.setReduceFunction([carried, combine](void* dst, const void* a, const void* b, std::size_t n) {
    const void* sources[2] = {a, b};
    cpu::reduce_sources(dst, sources, 2, n, carried, combine, 1);
  });
  ::gloo::allreduce(opts);
  finish(out, recv, dtype, op, size_, count);
}

void GlooBackend::all_gather(const OpContext& ctx, const void* send, void* recv, std::size_t bytes) {
  begin(ctx);
  const bool one_shot = one_step(bytes);
  guarded([&] {
    exchange(record_of(CallKind::kAllGather, ctx, bytes), one_shot ? Payload{send, bytes} : Payload{});
    unsigned char* out = bytes_of(recv);
    if (one_shot) {
      for (int q = 0; q < size_ && bytes != 0; ++q) {
        const void* src = q == rank_ ? send : payload_of(q);
        if (out + q * bytes != src) std::memcpy(out + q * bytes, src, bytes);
      }
      return;
    }
    if (direct_) return direct_all_gather(send, recv, bytes);
    ::gloo::AllgatherOptions opts(mesh_);
    if (send != out + rank_ * bytes) opts.setInput(static_cast<char*>(const_cast<void*>(send)), bytes);
    opts.setOutput(reinterpret_cast<char*>(out), bytes * size_);
    ::gloo::allgather(opts);
  });
  arm();
}

void GlooBackend::reduce_scatter(const OpContext& ctx, const void* send, void* recv,
                                 std::size_t count, DType dtype, ReduceOp op) {
  begin(ctx);
  const std::size_t block = count * dtype_size(dtype);
  const bool one_shot = one_step(block);
  guarded([&] {
    // One-shot: rank q gets block q of every rank.
    exchange(record_of(CallKind::kReduceScatter, ctx, count),
             one_shot ? Payload{send, block, block} : Payload{});
    if (!one_shot) {
      std::unique_ptr<unsigned char[]> widened;
      const unsigned char* in =
          carried_values(send, dtype, partial_dtype(dtype, op), count * size_, widened);
      if (direct_) return direct_reduce_scatter(in, recv, count, dtype, op);
      return ring_reduce_scatter(in, recv, count, dtype, op);
    }
    for (int q = 0; q < size_; ++q)
      sources_[q] = q == rank_ ? bytes_of(send) + rank_ * block : payload_of(q);
    if (count != 0) cpu::reduce_sources(recv, sources_.data(), size_, count, dtype, op, size_);
  });
  arm();
}

// Ring reduce-scatter: at step s rank r sends its partial result of block
// r-s-1 to rank r+1 and folds the partial result of block r-s-2 from rank
// r-1 into its own values; after size-1 steps the block it folded last is
// its own block, reduced over every rank.
void GlooBackend::ring_reduce_scatter(const unsigned char* in, void* recv, std::size_t count,
                                      DType dtype, ReduceOp op) {
  const DType carried = partial_dtype(dtype, op);
  const ReduceOp combine = partial_op(op);
  const std::size_t block = count * dtype_size(carried);
  // The block coming in, two going out (one on the wire while the next is
  // reduced) and, when it needs finishing, the result.
  auto scratch = std::make_unique_for_overwrite<unsigned char[]>(4 * block);
  unsigned char* incoming = scratch.get();
  unsigned char* outgoing = scratch.get() + block;
  unsigned char* result = carried == dtype ? bytes_of(recv) : scratch.get() + 3 * block;
  auto in_buffer = mesh_->createUnboundBuffer(const_cast<unsigned char*>(in), block * size_);
  auto incoming_buffer = mesh_->createUnboundBuffer(incoming, block);
  auto outgoing_buffer = mesh_->createUnboundBuffer(outgoing, 2 * block);
  const int right = (rank_ + 1) % size_;
  const int left = (rank_ + size_ - 1) % size_;
  auto block_sent_at = [&](int step) { return (rank_ - step - 1 + 2 * size_) % size_; };
  for (int step = 0; step + 1 < size_; ++step) {
    incoming_buffer->recv(left, kRingSlot, 0, block);
    auto& sender = step == 0 ? in_buffer : outgoing_buffer;
    sender->send(right, kRingSlot,
                 step == 0 ? block_sent_at(0) * block : ((step - 1) % 2) * block, block);
    incoming_buffer->waitRecv();
    const void* sources[2] = {in + block_sent_at(step + 1) * block, incoming};
    unsigned char* folded = step + 2 == size_ ? result : outgoing + (step % 2) * block;
    cpu::reduce_sources(folded, sources, 2, count, carried, combine, 1);
    sender->waitSend();
  }
  finish(result, recv, dtype, op, size_, count);
}

unsigned char* GlooBackend::scratch(std::size_t bytes) {
  if (scratch_bytes_ < bytes) {
    scratch_.reset();  // before the new one: the old may be as large
    scratch_ = std::make_unique_for_overwrite<unsigned char[]>(bytes);
    scratch_bytes_ = bytes;
  }
  return scratch_.get();
}

// A buffer a peer and direction, so that a wait names the rank it is for.
template <class Incoming>
GlooBackend::Buffers GlooBackend::post_receives(std::uint64_t slot, Incoming&& incoming) {
  Buffers receives(size_);
  for (int q = 0; q < size_; ++q) {
    const Part in = incoming(q);
    if (q == rank_ || in.bytes == 0) continue;
    receives[q] = mesh_->createUnboundBuffer(const_cast<void*>(in.data), in.bytes);
    receives[q]->recv(q, slot, 0, in.bytes);
  }
  return receives;
}

template <class Outgoing>
void GlooBackend::send_and_wait(std::uint64_t slot, Outgoing&& outgoing, Buffers& receives) {
  Buffers sends(size_);
  for (int q = 0; q < size_; ++q) {
    const Part out = outgoing(q);
    if (q == rank_ || out.bytes == 0) continue;
    sends[q] = mesh_->createUnboundBuffer(const_cast<void*>(out.data), out.bytes);
    sends[q]->send(q, slot, 0, out.bytes);
  }
  for (auto& r : receives)
    if (r) r->waitRecv();
  for (auto& s : sends)
    if (s) s->waitSend();
}

template <class Outgoing, class Incoming>
void GlooBackend::direct_step(std::uint64_t slot, Outgoing&& outgoing, Incoming&& incoming) {
  Buffers receives = post_receives(slot, incoming);
  send_and_wait(slot, outgoing, receives);
}

// Rank q reduces block q of every rank's values, in rank order, and
// finishes it in the output's dtype; the ranks then share the blocks.
void GlooBackend::direct_all_reduce(const void* send, void* recv, std::size_t count, DType dtype,
                                    ReduceOp op) {
  const DType carried = partial_dtype(dtype, op);
  const ReduceOp combine = partial_op(op);
  const std::size_t wide = dtype_size(carried);
  const std::size_t narrow = dtype_size(dtype);
  std::unique_ptr<unsigned char[]> widened;
  const unsigned char* in = carried_values(send, dtype, carried, count, widened);
  const Block mine = block_of(rank_, count, size_);
  const std::size_t most = most_per_block(count, size_);
  // Each peer's part of block `mine`, and in our own slot the reduction.
  unsigned char* parts = scratch(size_ * most * wide);
  auto part_of = [&](int q) { return parts + q * most * wide; };
  // The gathered blocks' receives go first, so that no peer's block waits
  // for them. Block q arrives only once rank q has all of its parts, ours
  // included: our reads of it (in place, the same memory) are over.
  Buffers gathered = post_receives(kGatherSlot, [&](int q) {
    const Block b = block_of(q, count, size_);
    return Part{bytes_of(recv) + b.begin * narrow, b.size * narrow};
  });
  direct_step(
      kScatterSlot,
      [&](int q) {
        const Block b = block_of(q, count, size_);
        return Part{in + b.begin * wide, b.size * wide};
      },
      [&](int q) { return Part{part_of(q), mine.size * wide}; });
  if (mine.size != 0) {
    for (int q = 0; q < size_; ++q)
      sources_[q] = q == rank_ ? in + mine.begin * wide : part_of(q);
    cpu::reduce_sources(part_of(rank_), sources_.data(), size_, mine.size, carried, combine, 1);
    finish(part_of(rank_), bytes_of(recv) + mine.begin * narrow, dtype, op, size_, mine.size);
  }
  send_and_wait(
      kGatherSlot, [&](int) { return Part{bytes_of(recv) + mine.begin * narrow, mine.size * narrow}; },
      gathered);
}

void GlooBackend::direct_reduce_scatter(const unsigned char* in, void* recv, std::size_t count,
                                        DType dtype, ReduceOp op) {
  const DType carried = partial_dtype(dtype, op);
  const ReduceOp combine = partial_op(op);
  const std::size_t block = count * dtype_size(carried);
  // Each peer's block q, and in our own slot the reduction.
  unsigned char* parts = scratch(block * size_);
  auto part_of = [&](int q) { return parts + q * block; };
  direct_step(
      kScatterSlot, [&](int q) { return Part{in + q * block, block}; },
      [&](int q) { return Part{part_of(q), block}; });
  for (int q = 0; q < size_; ++q) sources_[q] = q == rank_ ? in + rank_ * block : part_of(q);
  cpu::reduce_sources(part_of(rank_), sources_.data(), size_, count, carried, combine, 1);
  finish(part_of(rank_), recv, dtype, op, size_, count);
}

void GlooBackend::direct_all_gather(const void* send, void* recv, std::size_t bytes) {
  unsigned char* out = bytes_of(recv);
  direct_step(
      kGatherSlot, [&](int) { return Part{send, bytes}; },
      [&](int q) { return Part{out + q * bytes, bytes}; });
  if (send != out + rank_ * bytes) std::memcpy(out + rank_ * bytes, send, bytes);
}

void GlooBackend::broadcast(const OpContext& ctx, const void* send, void* recv, std::size_t bytes,
                            int root) {
  begin(ctx);
  const bool one_shot = one_step(bytes);
  guarded([&] {
    exchange(record_of(CallKind::kBroadcast, ctx, bytes),
             one_shot && rank_ == root ? Payload{send, bytes} : Payload{});
    if (one_shot) {
      const void* src = rank_ == root ? send : payload_of(root);
      if (bytes != 0 && recv != src) std::memcpy(recv, src, bytes);
      return;
    }
    ::gloo::BroadcastOptions opts(mesh_);
    opts.setRoot(root);
    if (rank_ == root && send != recv) opts.setInput(static_cast<char*>(const_cast<void*>(send)), bytes);
    opts.setOutput(static_cast<char*>(recv), bytes);
    ::gloo::broadcast(opts);
  });
  arm();
}

void GlooBackend::barrier(const OpContext& ctx) { agree(ctx, CallKind::kBarrier, 0); }

void GlooBackend::agree(const OpContext& ctx, CallKind kind, std::uint64_t count) {
  begin(ctx);
  guarded([&] { exchange(record_of(kind, ctx, count), {}); });
  arm();
}

void GlooBackend::all_reduce_multi(const OpContext& ctx, std::span<const TensorView> tensors,
                                   ReduceOp op) {
  // The default sends nothing when every tensor is empty; the ranks must
  // still compare their lists, or one with elements would wait for one
  // without any until the timeout.
  if (std::any_of(tensors.begin(), tensors.end(), [](const TensorView& t) { return t.numel != 0; }))
    return Backend::all_reduce_multi(ctx, tensors, op);
  agree(ctx, CallKind::kAllReduce, 0);
}

}  // namespace concord::gloo
