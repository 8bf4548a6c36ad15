#include "comm/shm/shm_backend.hpp"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "base/deadline.hpp"
#include "base/env.hpp"
#include "base/format.hpp"
#include "base/interrupt.hpp"
#include "comm/blocks.hpp"
#include "comm/shm/cma.hpp"
#include "comm/shm/futex.hpp"
#include "kernels/cpu/reduce.hpp"
#include "rendezvous/store.hpp"

namespace concord::shm {

namespace {

using Clock = std::chrono::steady_clock;

// Waiting: a short spin catches peers running on other cores; yielding lets
// peers that share our core run (4 ranks on 2 cores); then sleep on a futex.
// With more ranks than cores a peer we wait for is usually not running, so
// spinning only delays it: yield at once. The same holds for a peer the
// scheduler placed on our CPU, which happens with few ranks too when other
// processes keep the cores busy.
constexpr int kSpinIterations = 256;
constexpr int kYieldIterations = 64;

int spin_iterations(int nranks) {
  const unsigned cores = std::thread::hardware_concurrency();
  return cores != 0 && static_cast<unsigned>(nranks) > cores ? 0 : kSpinIterations;
}
constexpr long kSleepSliceMicros = 2000;
constexpr auto kLivenessPeriod = std::chrono::milliseconds(50);
constexpr std::uint32_t kAbortClaimed = 0xFFFFFFFFu;
// Published instead of a segment name when rank 0 could not make one.
constexpr const char* kNoSegment = "-";

// The elements rank q reduces within a chunk of n elements: whole cache
// lines, so that ranks never write the same line.
Block part_of(int q, std::size_t n, int nranks, std::size_t elem_size) {
  return block_of(q, n, nranks, std::max<std::size_t>(1, kCacheLine / elem_size));
}

bool process_alive(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  // A dead child not yet reaped by its parent still answers kill().
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return true;
  auto paren = text.rfind(')');
  if (paren == std::string::npos || paren + 2 >= text.size()) return true;
  char state = text[paren + 2];
  return state != 'Z' && state != 'X';
}

std::string unique_segment_name() {
  static std::atomic<unsigned> counter{0};
  std::random_device rd;
  char name[96];
  std::snprintf(name, sizeof name, "/concord-%d-%u-%08x", static_cast<int>(getpid()),
                counter.fetch_add(1), rd());
  return name;
}

}  // namespace

ShmConfig ShmConfig::from_env(int nranks, double timeout_s) {
  ShmConfig config;
  config.timeout_s = timeout_s;
  if (auto bytes = env::get_int("CONCORD_SHM_CHUNK_BYTES")) {
    if (*bytes < 256)
      invalid_argument("CONCORD_SHM_CHUNK_BYTES must be at least 256, got ", *bytes);
    config.slot_bytes = static_cast<std::size_t>(*bytes);
  } else {
    // Keep the segment near 16 MiB on hosts with many ranks.
    std::size_t budget = (16u << 20) / (2 * static_cast<std::size_t>(nranks));
    config.slot_bytes = std::clamp<std::size_t>(budget, 64u << 10, 1u << 20);
  }
  config.slot_bytes = Layout::align(std::max(config.slot_bytes, nranks * kCacheLine), kCacheLine);
  if (auto bytes = env::get_int("CONCORD_SHM_ONESHOT_BYTES")) {
    if (*bytes < 0) invalid_argument("CONCORD_SHM_ONESHOT_BYTES must be >= 0, got ", *bytes);
    config.one_shot_bytes = static_cast<std::size_t>(*bytes);
  }
  if (auto bytes = env::get_int("CONCORD_SHM_CMA_BYTES")) {
    if (*bytes < 0) invalid_argument("CONCORD_SHM_CMA_BYTES must be >= 0, got ", *bytes);
    config.single_copy_bytes = static_cast<std::size_t>(*bytes);
  }
  return config;
}

ShmBackend::ShmBackend(StoreClient& store, const std::string& name, int rank, int nranks,
                       ShmConfig config)
    : config_(config), rank_(rank), nranks_(nranks), spin_iterations_(spin_iterations(nranks)),
      sources_(static_cast<std::size_t>(nranks)) {
  std::optional<Status> failure;
  try {
    attach(store, name);
  } catch (const Error& e) {
    failure = e.status();
  }
  agree_on_attaching(store, name, failure);
  agree_on_single_copy();
}

void ShmBackend::attach(StoreClient& store, const std::string& name) {
  const Layout layout = Layout::of(nranks_, config_.slot_bytes);
  const std::string segment_key = name + "/shm/segment";
  if (rank_ == 0) {
    try {
      std::string segment_name = unique_segment_name();
      segment_ = Segment::create(segment_name, layout.total);
      auto* header = new (segment_.data()) Header{};
      header->magic = kMagic;
      header->nranks = static_cast<std::uint32_t>(nranks_);
      header->slot_bytes = config_.slot_bytes;
      store.set(segment_key, concat(segment_name, " ", layout.total));
    } catch (const Error&) {
      store.set(segment_key, kNoSegment);  // the others need not wait for it
      throw;
    }
  } else {
    const std::string published_text =
        store.get(segment_key, std::chrono::duration<double>(config_.timeout_s));
    if (published_text == kNoSegment)
      fail(StatusCode::kRemote, "rank 0 could not create the shm segment");
    std::istringstream published(published_text);
    std::string segment_name;
    std::size_t total = 0;
    published >> segment_name >> total;
    if (total != layout.total)
      fail(StatusCode::kMismatch, "ranks disagree on the shm segment size (", total, " vs ",
           layout.total, " bytes): set CONCORD_SHM_CHUNK_BYTES alike on every rank");
    segment_ = Segment::open(segment_name, total);
  }
  char* base = static_cast<char*>(segment_.data());
  header_ = reinterpret_cast<Header*>(base);
  controls_ = reinterpret_cast<RankControl*>(base + layout.controls);
  descriptors_ = reinterpret_cast<Descriptor*>(base + layout.descriptors);
  data_ = base + layout.data;
  if (header_->magic != kMagic || header_->nranks != static_cast<std::uint32_t>(nranks_))
    fail(StatusCode::kMismatch, "shm segment of ", name, " was made for ", header_->nranks,
         " ranks, this communicator has ", nranks_);
  controls_[rank_].pid = static_cast<std::int32_t>(getpid());
  controls_[rank_].probe_address = reinterpret_cast<std::uint64_t>(&probe_value_);
}

// Every rank counts itself in, whether it attached or not (a failure counts
// 2^32 and leaves its reason under a key), and waits for all to have
// counted: then every rank either succeeds or fails, none returns while a
// peer failed. Once every rank has attached the name is no longer needed:
// rank 0 unlinks it, so nothing is left in /dev/shm whatever happens later;
// on failure the Segment it created unlinks itself.
void ShmBackend::agree_on_attaching(StoreClient& store, const std::string& name,
                                    const std::optional<Status>& failure) {
  constexpr std::int64_t kFailed = std::int64_t{1} << 32;
  const std::string count_key = name + "/shm/attached";
  const std::string done_key = name + "/shm/all_counted";
  const std::string failure_key = name + "/shm/failure";
  if (failure)
    store.set(failure_key, concat(static_cast<int>(failure->code), " rank ", rank_, ": ",
                                  failure->message));
  if ((store.add(count_key, failure ? kFailed + 1 : 1) & (kFailed - 1)) == nranks_)
    store.set(done_key, "1");
  store.wait({done_key}, std::chrono::duration<double>(config_.timeout_s));
  if (failure) throw_status(*failure);
  if (store.add(count_key, 0) >= kFailed) {
    std::istringstream reason(store.get(failure_key, std::chrono::duration<double>(0)));
    int code = static_cast<int>(StatusCode::kRemote);
    reason >> code;
    std::string text;
    std::getline(reason >> std::ws, text);
    fail(static_cast<StatusCode>(code), "shm: ", text);
  }
  if (rank_ == 0) segment_.unlink();
}

// Every rank tries to read every peer's probe value, publishes whether it
// could, and then all of them read the verdicts: single-copy transfers are
// used only when every rank can read every peer (each one's algorithm must
// match the others'). CONCORD_SHM_CMA_BYTES=0 turns them off.
void ShmBackend::agree_on_single_copy() {
  if (nranks_ == 1) return;
  const OpLabel label{"set-up", 0};
  begin(label);
  bool reads_all = config_.single_copy_bytes != 0;
  for (int q = 0; q < nranks_ && reads_all; ++q) {
    std::uint64_t value = 0;
    reads_all = q == rank_ || (cma_read(controls_[q].pid, &value, controls_[q].probe_address,
                                        sizeof value) == 0 &&
                               value == kMagic);
  }
  controls_[rank_].reads_peers = reads_all ? 1 : 0;
  sync(label);
  single_copy_ = true;
  for (int q = 0; q < nranks_; ++q) single_copy_ = single_copy_ && controls_[q].reads_peers == 1;
}

char* ShmBackend::slot(int buffer, int rank) const noexcept {
  return data_ + (static_cast<std::size_t>(buffer) * nranks_ + rank) * config_.slot_bytes;
}

Descriptor& ShmBackend::descriptor(int buffer, int rank) const noexcept {
  return descriptors_[buffer * nranks_ + rank];
}

ShmBackend::Step ShmBackend::next_step() noexcept {
  return Step{static_cast<int>(buffer_turn_++ & 1u)};
}

void ShmBackend::begin(OpLabel label) {
  deadline_ = deadline_after(config_.timeout_s);
  check_aborted(label);
}

void ShmBackend::publish_descriptor(const Step& step, const OpContext& ctx, CallKind kind,
                                    std::uint64_t count, const void* address) noexcept {
  Descriptor& d = descriptor(step.buffer, rank_);
  static_cast<CallRecord&>(d) = record_of(kind, ctx, count);
  d.address = reinterpret_cast<std::uint64_t>(address);
}

void ShmBackend::check_descriptors(const Step& step, OpLabel label) {
  check_agreement(
      label, rank_, nranks_, [&](int q) -> const CallRecord& { return descriptor(step.buffer, q); },
      [](int q) { return q; });
}

void ShmBackend::sync(OpLabel label) {
  const std::uint32_t target = ++step_;
  const int cpu = sched_getcpu();
  controls_[rank_].cpu.store(cpu, std::memory_order_relaxed);
  controls_[rank_].step.store(target, std::memory_order_seq_cst);
  if (header_->sleepers.load(std::memory_order_seq_cst) != 0)
    futex_wake_all(&controls_[rank_].step);
  for (int peer = 0; peer < nranks_; ++peer)
    if (peer != rank_) wait_for_rank(peer, target, cpu, label);
}

void ShmBackend::wait_for_rank(int peer, std::uint32_t target, int cpu, OpLabel label) {
  std::atomic<std::uint32_t>& word = controls_[peer].step;
  auto reached = [&] {
    return static_cast<std::int32_t>(word.load(std::memory_order_acquire) - target) >= 0;
  };
  if (reached()) return;
  const bool shares_cpu = cpu >= 0 && controls_[peer].cpu.load(std::memory_order_relaxed) == cpu;
  const int spins = shares_cpu ? 0 : spin_iterations_;
  for (int i = 0; i < spins; ++i) {
    cpu_relax();
    if (reached()) return;
  }
  for (int i = 0; i < kYieldIterations; ++i) {
    sched_yield();
    if (reached()) return;
  }
  auto next_liveness_check = Clock::now();
  for (;;) {
    // Reached first: a peer may publish its last step and then exit, which
    // is no failure.
    if (reached()) return;
    check_aborted(label);
    const auto now = Clock::now();
    if (now >= deadline_)
      fail_waiting(label, target, StatusCode::kTimeout,
                   concat("timed out after ", config_.timeout_s, " s"));
    if (now >= next_liveness_check) {
      // Its step may have landed just before it exited.
      if (!peer_alive(peer) && !reached())
        fail_waiting(label, target, StatusCode::kRemote,
                     concat("rank ", peer, " (pid ", controls_[peer].pid, ") died"));
      if (interrupt_requested()) fail_waiting(label, target, StatusCode::kInterrupted, "interrupted");
      next_liveness_check = now + kLivenessPeriod;
    }
    header_->sleepers.fetch_add(1, std::memory_order_seq_cst);
    const std::uint32_t seen = word.load(std::memory_order_seq_cst);
    if (static_cast<std::int32_t>(seen - target) < 0) futex_wait(&word, seen, kSleepSliceMicros);
    header_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (reached()) return;
  }
}

void ShmBackend::fail_waiting(OpLabel label, std::uint32_t target, StatusCode code,
                              const std::string& why) {
  std::string missing;
  for (int q = 0; q < nranks_; ++q) {
    const auto seen = controls_[q].step.load(std::memory_order_acquire);
    if (static_cast<std::int32_t>(seen - target) < 0)
      missing += concat(missing.empty() ? "" : ", ", q);
  }
  fail_and_abort(label, code, concat(why, "; not heard from ranks [", missing, "]"));
}

void ShmBackend::fail_and_abort(OpLabel label, StatusCode code, const std::string& why) {
  std::string message = concat(label.name, " #", label.seq, " on rank ", rank_, " failed: ", why);
  // The peers fail with the root cause: this rank's timeout, or (a dead
  // peer, an interrupt here) a peer that failed.
  abort(Status{code == StatusCode::kTimeout ? code : StatusCode::kRemote, message});
  throw Error(code, message);
}

void ShmBackend::check_aborted(OpLabel label) {
  const std::uint32_t flag = header_->aborted.load(std::memory_order_acquire);
  if (flag == 0 || flag == kAbortClaimed) return;
  const int by = static_cast<int>(flag) - 1;
  // The peers learn the root cause: a rank that timed out makes every rank
  // time out, one that saw a peer die or was told to abort makes them fail
  // as Remote.
  const StatusCode code =
      by == rank_ ? StatusCode::kAborted : static_cast<StatusCode>(header_->abort_cause);
  fail(code, label.name, " #", label.seq, " on rank ", rank_, " failed: rank ", by,
       " aborted the communicator: ", header_->reason);
}

void ShmBackend::abort(const Status& cause) noexcept {
  std::uint32_t expected = 0;
  if (header_->aborted.compare_exchange_strong(expected, kAbortClaimed)) {
    std::snprintf(header_->reason, kReasonBytes, "%s", cause.message.c_str());
    header_->abort_cause = static_cast<std::int32_t>(cause.code);
    header_->aborted.store(static_cast<std::uint32_t>(rank_ + 1), std::memory_order_release);
  }
  for (int q = 0; q < nranks_; ++q) futex_wake_all(&controls_[q].step);
}

bool ShmBackend::peer_alive(int peer) const noexcept {
  const pid_t pid = controls_[peer].pid;
  if (pid == 0 || pid == getpid()) return true;
  return process_alive(pid);
}

// ---- collectives -----------------------------------------------------------

void ShmBackend::all_reduce(const OpContext& ctx, const void* send, void* recv, std::size_t count,
                            DType dtype, ReduceOp op) {
  const OpLabel label = ctx.label;
  begin(label);
  const std::size_t bytes = count * dtype_size(dtype);
  if (bytes <= std::min(config_.one_shot_bytes, config_.slot_bytes))
    all_reduce_one_shot(ctx, send, recv, count, dtype, op);
  else if (single_copy_ && bytes / nranks_ >= config_.single_copy_bytes)
    all_reduce_single_copy(ctx, send, recv, count, dtype, op);
  else
    all_reduce_pipelined(ctx, send, recv, count, dtype, op);
}

// Large messages, reading the peers' memory: each rank reduces its part
// from every peer's input (reduce_from_peers), then, once all parts are
// reduced, reads the others' parts from their results. Each part is
// reduced by one rank only, so every rank gets the same bits. In place, a
// rank's part of its input is overwritten only by its own reduction, and
// the other parts only after every peer has read them.
void ShmBackend::all_reduce_single_copy(const OpContext& ctx, const void* send, void* recv,
                                       std::size_t count, DType dtype, ReduceOp op) {
  const OpLabel label = ctx.label;
  const std::size_t elem = dtype_size(dtype);
  const Step step = next_step();
  publish_descriptor(step, ctx, CallKind::kAllReduce, count, send);
  descriptor(step.buffer, rank_).result = reinterpret_cast<std::uint64_t>(recv);
  sync(label);
  check_descriptors(step, label);
  const Block own = part_of(rank_, count, nranks_, elem);
  char* out = static_cast<char*>(recv);
  if (own.size != 0)
    reduce_from_peers(label, step, static_cast<const char*>(send) + own.begin * elem,
                      own.begin * elem, out + own.begin * elem, own.size, dtype, op);
  sync(label);
  for (int k = 1; k < nranks_; ++k) {
    const int q = (rank_ + k) % nranks_;
    const Block part = part_of(q, count, nranks_, elem);
    if (part.size != 0)
      read_peer(label, q, out + part.begin * elem,
                descriptor(step.buffer, q).result + part.begin * elem, part.size * elem);
  }
  sync(label);  // every result stays as it is until all peers have read it
}

// Small messages: every rank publishes all its data and reduces everything;
// one synchronisation in all.
void ShmBackend::all_reduce_one_shot(const OpContext& ctx, const void* send, void* recv,
                                     std::size_t count, DType dtype, ReduceOp op) {
  const OpLabel label = ctx.label;
  const Step step = next_step();
  const std::size_t bytes = count * dtype_size(dtype);
  if (bytes != 0) std::memcpy(slot(step.buffer, rank_), send, bytes);
  publish_descriptor(step, ctx, CallKind::kAllReduce, count);
  sync(label);
  check_descriptors(step, label);
  if (count == 0) return;
  for (int q = 0; q < nranks_; ++q) sources_[q] = q == rank_ ? send : slot(step.buffer, q);
  cpu::reduce_sources(recv, sources_.data(), nranks_, count, dtype, op, nranks_);
}

// Large messages, chunk by chunk: each rank reduces its part of the chunk
// reading every rank's slot (reduce-scatter), then copies the other parts
// (all-gather). Every rank sums the sources in rank order, so all ranks get
// bitwise-identical results.
void ShmBackend::all_reduce_pipelined(const OpContext& ctx, const void* send, void* recv,
                                      std::size_t count, DType dtype, ReduceOp op) {
  const OpLabel label = ctx.label;
  const std::size_t elem = dtype_size(dtype);
  const std::size_t chunk = config_.slot_bytes / elem;
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  for (std::size_t offset = 0; offset < count; offset += chunk) {
    const std::size_t n = std::min(chunk, count - offset);
    const Step step = next_step();
    char* mine = slot(step.buffer, rank_);
    for (int q = 0; q < nranks_; ++q) {
      const Block part = part_of(q, n, nranks_, elem);
      if (q != rank_ && part.size != 0)
        std::memcpy(mine + part.begin * elem, in + (offset + part.begin) * elem, part.size * elem);
    }
    const bool first = offset == 0;
    if (first) publish_descriptor(step, ctx, CallKind::kAllReduce, count);
    sync(label);
    if (first) check_descriptors(step, label);

    const Block own = part_of(rank_, n, nranks_, elem);
    if (own.size != 0) {
      for (int q = 0; q < nranks_; ++q)
        sources_[q] = q == rank_ ? in + (offset + own.begin) * elem
                                : slot(step.buffer, q) + own.begin * elem;
      char* result = out + (offset + own.begin) * elem;
      cpu::reduce_sources(result, sources_.data(), nranks_, own.size, dtype, op, nranks_);
      std::memcpy(mine + own.begin * elem, result, own.size * elem);
    }
    sync(label);
    for (int q = 0; q < nranks_; ++q) {
      const Block part = part_of(q, n, nranks_, elem);
      if (q != rank_ && part.size != 0)
        std::memcpy(out + (offset + part.begin) * elem, slot(step.buffer, q) + part.begin * elem,
                    part.size * elem);
    }
  }
}

void ShmBackend::all_gather(const OpContext& ctx, const void* send, void* recv, std::size_t bytes) {
  if (single_copy_ && bytes >= config_.single_copy_bytes)
    return all_gather_single_copy(ctx, send, recv, bytes);
  const OpLabel label = ctx.label;
  begin(label);
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  std::size_t offset = 0;
  do {
    const std::size_t n = std::min(config_.slot_bytes, bytes - offset);
    const Step step = next_step();
    if (n != 0) std::memcpy(slot(step.buffer, rank_), in + offset, n);
    const bool first = offset == 0;
    if (first) publish_descriptor(step, ctx, CallKind::kAllGather, bytes);
    sync(label);
    if (first) check_descriptors(step, label);
    for (int q = 0; q < nranks_ && n != 0; ++q) {
      char* dst = out + static_cast<std::size_t>(q) * bytes + offset;
      const char* src = q == rank_ ? in + offset : slot(step.buffer, q);
      if (dst != src) std::memcpy(dst, src, n);
    }
    offset += n;
  } while (offset < bytes);
}

void ShmBackend::reduce_scatter(const OpContext& ctx, const void* send, void* recv, std::size_t count,
                                DType dtype, ReduceOp op) {
  const std::size_t elem = dtype_size(dtype);
  if (single_copy_ && count * elem >= config_.single_copy_bytes)
    return reduce_scatter_single_copy(ctx, send, recv, count, dtype, op);
  const OpLabel label = ctx.label;
  begin(label);
  // Each step moves `block` elements of every rank's block; a slot holds one
  // such piece per destination rank.
  const std::size_t block = config_.slot_bytes / (elem * nranks_);
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  std::size_t offset = 0;
  do {
    const std::size_t n = std::min(block, count - offset);
    const Step step = next_step();
    char* mine = slot(step.buffer, rank_);
    for (int b = 0; b < nranks_ && n != 0; ++b)
      if (b != rank_)
        std::memcpy(mine + b * block * elem, in + (b * count + offset) * elem, n * elem);
    const bool first = offset == 0;
    if (first) publish_descriptor(step, ctx, CallKind::kReduceScatter, count);
    sync(label);
    if (first) check_descriptors(step, label);
    if (n != 0) {
      for (int q = 0; q < nranks_; ++q)
        sources_[q] = q == rank_ ? in + (rank_ * count + offset) * elem
                                : slot(step.buffer, q) + rank_ * block * elem;
      cpu::reduce_sources(out + offset * elem, sources_.data(), nranks_, n, dtype, op, nranks_);
    }
    offset += n;
  } while (offset < count);
}

void ShmBackend::broadcast(const OpContext& ctx, const void* send, void* recv, std::size_t bytes,
                           int root) {
  if (single_copy_ && bytes >= config_.single_copy_bytes)
    return broadcast_single_copy(ctx, send, recv, bytes, root);
  const OpLabel label = ctx.label;
  begin(label);
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  std::size_t offset = 0;
  do {
    const std::size_t n = std::min(config_.slot_bytes, bytes - offset);
    const Step step = next_step();
    if (rank_ == root && n != 0) std::memcpy(slot(step.buffer, root), in + offset, n);
    const bool first = offset == 0;
    if (first) publish_descriptor(step, ctx, CallKind::kBroadcast, bytes);
    sync(label);
    if (first) check_descriptors(step, label);
    if (n != 0) {
      const char* src = rank_ == root ? in + offset : slot(step.buffer, root);
      if (out + offset != src) std::memcpy(out + offset, src, n);
    }
    offset += n;
  } while (offset < bytes);
}

// Large gathers: every rank publishes where its input is and reads the
// peers' inputs straight into its result, one copy per byte instead of two
// through the segment; a second synchronisation keeps every input alive
// until all peers have read it.
void ShmBackend::all_gather_single_copy(const OpContext& ctx, const void* send, void* recv,
                                        std::size_t bytes) {
  const OpLabel label = ctx.label;
  begin(label);
  const Step step = next_step();
  publish_descriptor(step, ctx, CallKind::kAllGather, bytes, send);
  sync(label);
  check_descriptors(step, label);
  char* out = static_cast<char*>(recv);
  if (out + rank_ * bytes != send) std::memcpy(out + rank_ * bytes, send, bytes);
  // Peers in a rotated order, so that they are not all read at once.
  for (int k = 1; k < nranks_; ++k) {
    const int q = (rank_ + k) % nranks_;
    read_peer(label, q, out + q * bytes, descriptor(step.buffer, q).address, bytes);
  }
  sync(label);
}

// Large reduce-scatters: every rank reads its block of each peer's input
// straight from the peer's memory and reduces it.
void ShmBackend::reduce_scatter_single_copy(const OpContext& ctx, const void* send, void* recv,
                                            std::size_t count, DType dtype, ReduceOp op) {
  const OpLabel label = ctx.label;
  begin(label);
  const std::size_t elem = dtype_size(dtype);
  const Step step = next_step();
  publish_descriptor(step, ctx, CallKind::kReduceScatter, count, send);
  sync(label);
  check_descriptors(step, label);
  const std::size_t block = rank_ * count * elem;
  reduce_from_peers(label, step, static_cast<const char*>(send) + block, block, recv, count, dtype,
                    op);
  sync(label);  // every input stays alive until all peers have read it
}

// Reads `count` elements at byte `offset` of every peer's published buffer
// into this rank's slot, a chunk at a time, and reduces each chunk with
// `mine` into `out` while it is still in cache: each byte a peer
// contributes crosses memory once, where going through the segment copies
// it there and reads it back. Sources are combined in rank order.
void ShmBackend::reduce_from_peers(OpLabel label, const Step& step, const char* mine,
                                   std::uint64_t offset, void* out, std::size_t count, DType dtype,
                                   ReduceOp op) {
  const std::size_t elem = dtype_size(dtype);
  // The slot holds one chunk per peer; no peer reads it in these algorithms.
  const std::size_t chunk = config_.slot_bytes / (elem * (nranks_ - 1));
  char* scratch = slot(step.buffer, rank_);
  for (std::size_t done = 0; done < count; done += chunk) {
    const std::size_t n = std::min(chunk, count - done);
    for (int q = 0, k = 0; q < nranks_; ++q) {
      if (q == rank_) {
        sources_[q] = mine + done * elem;
        continue;
      }
      char* into = scratch + static_cast<std::size_t>(k++) * chunk * elem;
      read_peer(label, q, into, descriptor(step.buffer, q).address + offset + done * elem,
                n * elem);
      sources_[q] = into;
    }
    cpu::reduce_sources(static_cast<char*>(out) + done * elem, sources_.data(), nranks_, n, dtype,
                        op, nranks_);
  }
}

void ShmBackend::broadcast_single_copy(const OpContext& ctx, const void* send, void* recv,
                                       std::size_t bytes, int root) {
  const OpLabel label = ctx.label;
  begin(label);
  const Step step = next_step();
  publish_descriptor(step, ctx, CallKind::kBroadcast, bytes, rank_ == root ? send : nullptr);
  sync(label);
  check_descriptors(step, label);
  if (rank_ == root) {
    if (recv != send) std::memcpy(recv, send, bytes);
  } else {
    read_peer(label, root, recv, descriptor(step.buffer, root).address, bytes);
  }
  sync(label);
}

void ShmBackend::read_peer(OpLabel label, int peer, void* local, std::uint64_t address,
                           std::size_t bytes) {
  const int error = cma_read(controls_[peer].pid, local, address, bytes);
  if (error == 0) return;
  // ESRCH: the peer's memory is gone. A process being killed loses it
  // before it shows as a zombie, so its state may still read as running.
  if (error == ESRCH || !peer_alive(peer))
    fail_and_abort(label, StatusCode::kRemote,
                   concat("rank ", peer, " (pid ", controls_[peer].pid,
                          ") died while its buffer was read"));
  fail_and_abort(label, StatusCode::kInternal,
                 concat("reading rank ", peer, "'s buffer failed: ", std::strerror(error)));
}

void ShmBackend::barrier(const OpContext& ctx) {
  const OpLabel label = ctx.label;
  begin(label);
  const Step step = next_step();
  publish_descriptor(step, ctx, CallKind::kBarrier, 0);
  sync(label);
  check_descriptors(step, label);
}

}  // namespace concord::shm
