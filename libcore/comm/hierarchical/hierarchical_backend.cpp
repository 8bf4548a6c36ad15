#include "comm/hierarchical/hierarchical_backend.hpp"

#include <algorithm>
#include <cstring>

#include "base/format.hpp"
#include "comm/blocks.hpp"
#include "comm/gloo/partial.hpp"
#include "comm/gloo/setup_agreement.hpp"

namespace concord::hierarchical {
namespace {

// Messages shorter than this times the number of shards go as one shard:
// below it a step's latency outweighs spreading the bytes.
constexpr std::size_t kMinShardBytes = 64u << 10;

// A step's own context: the collective's label (ranks agreed on it), and
// the signature of what the step moves.
OpContext step_context(const OpContext& ctx, DType dtype, std::size_t count, int op = -1,
                       int root = -1) {
  OpContext step;
  step.label = ctx.label;
  step.signature = Signature{static_cast<int>(dtype), op, root,
                             Shape{static_cast<std::int64_t>(count)}};
  return step;
}

std::unique_ptr<unsigned char[]> scratch(std::size_t bytes) {
  return std::make_unique_for_overwrite<unsigned char[]>(bytes);
}

}  // namespace

HierarchicalBackend::HierarchicalBackend(HostLayout layout, std::unique_ptr<gloo::GlooBackend> world,
                                         std::unique_ptr<Backend> local,
                                         std::unique_ptr<Backend> across)
    : layout_(std::move(layout)), world_(std::move(world)), local_(std::move(local)),
      across_(std::move(across)) {
  std::vector<int> numbered(layout_.local_ranks().size());
  for (std::size_t i = 0; i < numbered.size(); ++i) numbered[i] = static_cast<int>(i);
  host_note_ = concat(" (shared memory of host ", layout_.host_ids[layout_.host], ", whose ranks ",
                      gloo::rank_list(layout_.local_ranks()), " it numbers ",
                      gloo::rank_list(numbered), ")");
}

void HierarchicalBackend::abort(const Status& cause) noexcept {
  world_->abort(cause);
  local_->abort(cause);
  if (across_) across_->abort(cause);
}

template <class Step>
void HierarchicalBackend::on_world(Step&& step) {
  try {
    step();
  } catch (const Error& e) {
    if (e.code() != StatusCode::kMismatch)
      abort({e.code() == StatusCode::kTimeout ? e.code() : StatusCode::kRemote, e.what()});
    throw;
  }
}

void HierarchicalBackend::agree(const OpContext& ctx, CallKind kind, std::uint64_t count) {
  on_world([&] { world_->agree(ctx, kind, count); });
}

template <class Step>
void HierarchicalBackend::run(Step&& step, const std::string& note) {
  try {
    step();
  } catch (const Error& e) {
    const std::string message = e.what() + note;
    // The peers on every host fail with the root cause.
    abort({e.code() == StatusCode::kTimeout ? e.code() : StatusCode::kRemote, message});
    throw Error(e.code(), message);
  }
}

int HierarchicalBackend::shards_for(std::size_t bytes) const {
  return bytes >= layout_.shards * kMinShardBytes ? layout_.shards : 1;
}

void HierarchicalBackend::barrier(const OpContext& ctx) { agree(ctx, CallKind::kBarrier, 0); }

void HierarchicalBackend::all_reduce_multi(const OpContext& ctx,
                                           std::span<const TensorView> tensors, ReduceOp op) {
  // As the gloo backend: ranks with only empty tensors still compare lists.
  if (std::any_of(tensors.begin(), tensors.end(), [](const TensorView& t) { return t.numel != 0; }))
    return Backend::all_reduce_multi(ctx, tensors, op);
  agree(ctx, CallKind::kAllReduce, 0);
}

void HierarchicalBackend::all_reduce(const OpContext& ctx, const void* send, void* recv,
                                     std::size_t count, DType dtype, ReduceOp op) {
  if (world_->one_step(count * dtype_size(dtype)))
    return on_world([&] { world_->all_reduce(ctx, send, recv, count, dtype, op); });
  agree(ctx, CallKind::kAllReduce, count);
  const DType carried = gloo::partial_dtype(dtype, op);
  const ReduceOp combine = gloo::partial_op(op);
  const std::size_t elem = dtype_size(carried);
  std::unique_ptr<unsigned char[]> widened;
  const void* in = send;
  unsigned char* buf = bytes_of(recv);
  if (carried != dtype) {
    widened = scratch(count * elem);
    gloo::convert(send, dtype, widened.get(), carried, count);
    in = buf = widened.get();
  }
  const int shards = shards_for(count * elem);
  const int host_size = static_cast<int>(layout_.local_ranks().size());
  // A host with exactly one rank a shard, and shards of equal size, can
  // reduce-scatter and all-gather; otherwise it all-reduces and broadcasts.
  const bool scatter = host_size == shards && count % shards == 0;
  const std::size_t shard = count / shards;
  const OpContext reduce_ctx = step_context(ctx, carried, count, static_cast<int>(combine));
  if (scatter)
    run([&] { local_->reduce_scatter(reduce_ctx, in, buf + layout_.local * shard * elem, shard,
                                     carried, combine); }, host_note_);
  else
    run([&] { local_->all_reduce(reduce_ctx, in, buf, count, carried, combine); }, host_note_);

  if (layout_.local < shards) {
    const Block mine = block_of(layout_.local, count, shards);
    unsigned char* part = buf + mine.begin * elem;
    if (mine.size != 0)
      run([&] {
        across_->all_reduce(step_context(ctx, carried, mine.size, static_cast<int>(combine)),
                            part, part, mine.size, carried, combine);
      });
    if (op == ReduceOp::kMean) gloo::divide_mean(part, carried, layout_.nranks(), mine.size);
  }

  if (scatter) {
    run([&] { local_->all_gather(step_context(ctx, carried, shard), buf + layout_.local * shard * elem,
                                 buf, shard * elem); }, host_note_);
  } else {
    for (int s = 0; s < shards; ++s) {
      const Block r = block_of(s, count, shards);
      run([&] { local_->broadcast(step_context(ctx, carried, r.size, -1, s), buf + r.begin * elem,
                                  buf + r.begin * elem, r.size * elem, s); }, host_note_);
    }
  }
  if (carried != dtype) gloo::convert(buf, carried, recv, dtype, count);
}

// Blocks travel in "super-blocks", one a shard and host: the blocks of that
// host's local ranks s, s + S, s + 2S, ..., padded to K slots so that every
// host's super-block has the same size. Shard s's super-blocks are reduced
// on each host, reduce-scattered within shard group s (each member gets
// its host's), and shared on each host.
void HierarchicalBackend::reduce_scatter(const OpContext& ctx, const void* send, void* recv,
                                         std::size_t count, DType dtype, ReduceOp op) {
  if (world_->one_step(count * dtype_size(dtype)))
    return on_world([&] { world_->reduce_scatter(ctx, send, recv, count, dtype, op); });
  agree(ctx, CallKind::kReduceScatter, count);
  if (count == 0) return;
  const DType carried = gloo::partial_dtype(dtype, op);
  const ReduceOp combine = gloo::partial_op(op);
  const std::size_t block = count * dtype_size(carried);
  const int hosts = layout_.nhosts();
  const int shards = shards_for(layout_.nranks() * block);
  const int slots = (layout_.widest + shards - 1) / shards;  // K
  const std::size_t super_block = static_cast<std::size_t>(slots) * block;
  const std::size_t shard_bytes = hosts * super_block;  // one shard, every host

  auto laid_out = scratch(shards * shard_bytes);
  std::memset(laid_out.get(), 0, shards * shard_bytes);
  for (int q = 0; q < layout_.nranks(); ++q) {
    const int i = layout_.local_of[q];
    unsigned char* slot = laid_out.get() + (i % shards) * shard_bytes +
                          layout_.host_of[q] * super_block + (i / shards) * block;
    gloo::convert(bytes_of(send) + q * count * dtype_size(dtype), dtype, slot, carried, count);
  }

  const int host_size = static_cast<int>(layout_.local_ranks().size());
  const OpContext reduce_ctx =
      step_context(ctx, carried, shards * shard_bytes / dtype_size(carried), static_cast<int>(combine));
  const std::size_t shard_count = shard_bytes / dtype_size(carried);
  unsigned char* host_sum = laid_out.get() + layout_.local * shard_bytes;
  if (host_size == shards)
    run([&] { local_->reduce_scatter(reduce_ctx, laid_out.get(), host_sum, shard_count, carried,
                                     combine); }, host_note_);
  else
    run([&] { local_->all_reduce(reduce_ctx, laid_out.get(), laid_out.get(), shards * shard_count,
                                 carried, combine); }, host_note_);

  // This host's super-block of each shard, reduced over every host.
  auto reduced = scratch(super_block);
  if (layout_.local < shards)
    run([&] {
      across_->reduce_scatter(step_context(ctx, carried, shard_count, static_cast<int>(combine)),
                              host_sum, reduced.get(), slots * count, carried, combine);
    });
  if (host_size > shards) {
    // Local ranks from S up get their block from their shard's rank.
    auto shared = scratch(super_block);
    for (int s = 0; s < shards; ++s) {
      run([&] {
        local_->broadcast(step_context(ctx, carried, slots * count, -1, s), reduced.get(),
                          shared.get(), super_block, s);
      }, host_note_);
      if (layout_.local % shards == s && layout_.local >= shards)
        std::memcpy(reduced.get(), shared.get() + (layout_.local / shards) * block, block);
    }
  }
  gloo::finish(reduced.get(), recv, dtype, op, layout_.nranks(), count);
}

void HierarchicalBackend::all_gather(const OpContext& ctx, const void* send, void* recv,
                                     std::size_t bytes) {
  if (world_->one_step(bytes))
    return on_world([&] { world_->all_gather(ctx, send, recv, bytes); });
  agree(ctx, CallKind::kAllGather, bytes);
  if (bytes == 0) return;
  const std::size_t host_bytes = layout_.widest * bytes;  // padded to the widest host
  auto gathered = scratch(host_bytes * (layout_.local == 0 ? layout_.nhosts() + 1 : 1));
  const std::size_t mine = layout_.local_ranks().size() * bytes;
  std::memset(gathered.get() + mine, 0, host_bytes - mine);  // the padding
  run([&] { local_->all_gather(step_context(ctx, DType::kUInt8, bytes), send, gathered.get(),
                               bytes); }, host_note_);
  const std::size_t total = layout_.nranks() * bytes;
  if (layout_.local == 0) {
    unsigned char* every_host = gathered.get() + host_bytes;
    run([&] { across_->all_gather(step_context(ctx, DType::kUInt8, host_bytes), gathered.get(),
                                  every_host, host_bytes); });
    for (int h = 0; h < layout_.nhosts(); ++h)
      for (std::size_t i = 0; i < layout_.host_ranks[h].size(); ++i)
        std::memcpy(bytes_of(recv) + layout_.host_ranks[h][i] * bytes,
                    every_host + h * host_bytes + i * bytes, bytes);
  }
  run([&] { local_->broadcast(step_context(ctx, DType::kUInt8, total, -1, 0), recv, recv, total,
                              0); }, host_note_);
}

// From the root to the rank of its shard group on its host (the carrier:
// itself, or the leader when it is in no group), across to that group's
// ranks, then on every host.
void HierarchicalBackend::broadcast(const OpContext& ctx, const void* send, void* recv,
                                    std::size_t bytes, int root) {
  if (world_->one_step(bytes))
    return on_world([&] { world_->broadcast(ctx, send, recv, bytes, root); });
  agree(ctx, CallKind::kBroadcast, bytes);
  if (bytes == 0) return;
  const int root_host = layout_.host_of[root];
  const int root_local = layout_.local_of[root];
  const int carrier = root_local < layout_.shards ? root_local : 0;
  const bool on_root_host = layout_.host == root_host;
  const OpContext step = step_context(ctx, DType::kUInt8, bytes);
  const void* source = layout_.rank == root ? send : recv;
  if (on_root_host && root_local != carrier)
    run([&] { local_->broadcast(step, source, recv, bytes, root_local); }, host_note_);
  if (layout_.local == carrier)
    run([&] { across_->broadcast(step, source, recv, bytes, root_host); });
  if (!on_root_host || root_local == carrier)
    run([&] { local_->broadcast(step, recv, recv, bytes, carrier); }, host_note_);
}

}  // namespace concord::hierarchical
