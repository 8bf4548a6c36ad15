#include "dp/grad_sync.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <sstream>
#include <utility>

#include "base/format.hpp"
#include "kernels/front.hpp"
#include "kernels/multi_tensor.hpp"
#include "plugin/cuda_plugin.hpp"

namespace concord::dp {
namespace {

constexpr double kBytesPerMb = 1024.0 * 1024.0;  // as torch DDP's bucket_cap_mb

const char* compression_name(Compression c) {
  switch (c) {
    case Compression::kNone: return "none";
    case Compression::kBFloat16: return "bf16";
    case Compression::kFloat16: return "fp16";
  }
  return "unknown";
}

void check_options(const GradSyncOptions& o) {
  for (auto [name, mb] : {std::pair{"bucket_cap_mb", o.bucket_cap_mb},
                          std::pair{"first_bucket_mb", o.first_bucket_mb}})
    if (!std::isfinite(mb) || !(mb > 0))
      invalid_argument("GradientSynchronizer: ", name, " must be finite and > 0, got ", mb);
  if (o.op != ReduceOp::kMean && o.op != ReduceOp::kSum)
    invalid_argument("GradientSynchronizer: op must be mean or sum, got ", reduce_op_name(o.op));
  if (o.compress != Compression::kNone && o.compress != Compression::kBFloat16 &&
      o.compress != Compression::kFloat16)
    invalid_argument("GradientSynchronizer: unknown compression ", static_cast<int>(o.compress));
}

using kernels::device_str;

void check_grad(std::size_t index, const TensorView& g, const TensorView& first,
                const GradSyncOptions& o) {
  if (!(g.device == first.device))
    invalid_argument("GradientSynchronizer: gradient ", index, " is on ", device_str(g.device),
                     " but gradient 0 is on ", device_str(first.device),
                     "; all gradients of a synchronizer must be on one device (the CPU or one "
                     "CUDA device)");
  if (o.compress != Compression::kNone && g.dtype != DType::kFloat32)
    invalid_argument("GradientSynchronizer: compression '", compression_name(o.compress),
                     "' applies to float32 gradients, but gradient ", index, " is ",
                     dtype_name(g.dtype), "; use compression 'none'");
  // Floating means travel as sums of pre-scaled values, other dtypes as the
  // op itself (an integer mean truncates, as NCCL's avg).
  check_reduce_op(dtype_is_floating(g.dtype) ? ReduceOp::kSum : o.op, g.dtype);
}


// ready_order must hold every index once; empty means reverse index order.
std::vector<std::size_t> fill_order(std::vector<std::size_t> order, std::size_t n) {
  if (order.empty()) {
    order.resize(n);
    std::iota(order.rbegin(), order.rend(), std::size_t{0});
    return order;
  }
  if (order.size() != n)
    invalid_argument("GradientSynchronizer: ready_order has ", order.size(), " entries for ", n,
                     " gradients; it must be a permutation of 0..", n - 1);
  std::vector<bool> seen(n, false);
  for (std::size_t i : order) {
    if (i >= n)
      invalid_argument("GradientSynchronizer: ready_order holds ", i, ", outside [0, ", n, ")");
    if (seen[i]) invalid_argument("GradientSynchronizer: ready_order holds ", i, " twice");
    seen[i] = true;
  }
  return order;
}

DType wire_dtype(DType grad, Compression c) {
  switch (c) {
    case Compression::kBFloat16: return DType::kBFloat16;
    case Compression::kFloat16: return DType::kFloat16;
    case Compression::kNone: break;
  }
  return grad;
}

// FNV-1a over the plan: equal on two ranks exactly when their buckets agree.
struct Fingerprint {
  std::uint64_t hash = 14695981039346656037ull;
  void add(std::uint64_t value) {
    for (int byte = 0; byte < 8; ++byte) {
      hash ^= (value >> (8 * byte)) & 0xFFu;
      hash *= 1099511628211ull;
    }
  }
};

// Walks the gradients in ready order with one open bucket per (dtype,
// device), as DDP does. A bucket closes once it reaches its capacity
// (first_cap for the first bucket of a dtype, later_cap after), counted in
// gradient bytes; a gradient that would overflow a non-empty bucket starts
// the next one, so only a gradient larger than the cap makes a bucket larger
// than the cap. Returns the buckets' members ordered by the ready position
// of their last gradient: the order in which they fill, and start.
std::vector<std::vector<std::size_t>> group_into_buckets(const std::vector<TensorView>& grads,
                                                         const std::vector<std::size_t>& order,
                                                         std::size_t first_cap,
                                                         std::size_t later_cap) {
  struct Open {
    DType dtype;
    Device device;
    std::vector<std::size_t> members;
    std::size_t bytes = 0;
    std::size_t closed = 0;  // buckets of this dtype and device closed so far
  };
  std::vector<std::size_t> position(order.size());
  for (std::size_t pos = 0; pos < order.size(); ++pos) position[order[pos]] = pos;
  std::vector<std::pair<std::size_t, std::vector<std::size_t>>> closed;  // (last position, members)
  auto close = [&](Open& o) {
    closed.emplace_back(position[o.members.back()], std::move(o.members));
    o.members.clear();
    o.bytes = 0;
    ++o.closed;
  };

  std::vector<Open> open;
  for (std::size_t index : order) {
    const TensorView& g = grads[index];
    auto it = std::find_if(open.begin(), open.end(), [&](const Open& o) {
      return o.dtype == g.dtype && o.device == g.device;
    });
    if (it == open.end()) it = open.insert(open.end(), Open{g.dtype, g.device, {}});
    auto cap = [&] { return it->closed == 0 ? first_cap : later_cap; };
    if (it->bytes != 0 && it->bytes + g.nbytes() > cap()) close(*it);
    it->members.push_back(index);
    it->bytes += g.nbytes();
    if (it->bytes >= cap()) close(*it);
  }
  for (Open& o : open)
    if (!o.members.empty()) close(o);

  std::sort(closed.begin(), closed.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::vector<std::size_t>> groups;
  for (auto& c : closed) groups.push_back(std::move(c.second));
  return groups;
}

std::string index_list(const std::vector<std::size_t>& indices) {
  constexpr std::size_t kShown = 16;
  std::ostringstream out;
  for (std::size_t k = 0; k < std::min(indices.size(), kShown); ++k)
    out << (k ? ", " : "") << indices[k];
  if (indices.size() > kShown) out << ", ... (" << indices.size() << " in all)";
  return out.str();
}

}  // namespace

GradientSynchronizer::GradientSynchronizer(Communicator& comm, std::vector<TensorView> grads,
                                           std::vector<std::size_t> ready_order,
                                           GradSyncOptions options)
    : comm_(comm), options_(options) {
  check_options(options_);
  for (std::size_t i = 0; i < grads.size(); ++i) check_grad(i, grads[i], grads[0], options_);
  const std::vector<std::size_t> order = fill_order(std::move(ready_order), grads.size());
  // Every argument is checked; now whether the device can be used at all.
  if (!grads.empty()) device_ = grads[0].device;
  // CUDA gradients need the plugin's kernels, a device and NCCL: say which
  // is missing now, before the plan's collective, rather than in the first step.
  if (device_.kind == DeviceKind::kCUDA)
    plugin::require_device(device_.id, /*need_nccl=*/true,
                           concat("GradientSynchronizer: the gradients are on ",
                                  device_str(device_)).c_str());
  slots_.resize(grads.size());
  for (std::size_t i = 0; i < grads.size(); ++i) slots_[i].like = grads[i];
  const auto first_cap = static_cast<std::size_t>(options_.first_bucket_mb * kBytesPerMb);
  const auto later_cap = static_cast<std::size_t>(options_.bucket_cap_mb * kBytesPerMb);
  lay_out(group_into_buckets(grads, order, first_cap, later_cap));
  // Before the collective: a rank out of memory fails here, and its peers
  // time out in the plan check rather than in their first step.
  allocate_buffers();
  check_plan_agrees();
  marked_.resize(slots_.size());
  start_step();
}

GradientSynchronizer::~GradientSynchronizer() {
  for (Bucket& b : buckets_) {
    settle(b.work);
    settle(b.direct_work);
  }
  if (device_.kind == DeviceKind::kCUDA) synchronize_device_buffers();
}

void GradientSynchronizer::DeviceFree::operator()(void* ptr) const noexcept {
  try {
    plugin::kernels().device_free(device, ptr);
  } catch (...) {
    // The plugin allocated it, so it is loaded; nothing to free otherwise.
  }
}

void GradientSynchronizer::allocate_buffers() {
  for (Bucket& b : buckets_) {
    const std::size_t bytes = b.numel * dtype_size(b.wire);
    if (device_.kind == DeviceKind::kCPU) {
      b.host_buffer = std::make_unique_for_overwrite<unsigned char[]>(bytes);
      b.buffer = b.host_buffer.get();
    } else if (bytes != 0) {
      const plugin::KernelsApi& api = plugin::kernels();
      void* ptr = nullptr;
      plugin::check(api.device_alloc(device_.id, bytes, &ptr), api.last_error,
                    concat("GradientSynchronizer: allocating a bucket of ", bytes, " bytes on ",
                           device_str(device_))
                        .c_str());
      b.device_buffer = std::unique_ptr<void, DeviceFree>(ptr, DeviceFree{device_.id});
      b.buffer = static_cast<unsigned char*>(ptr);
    }
  }
}

// The buffers may still be read or written by device work enqueued on the
// caller's streams (packs, all-reduces the stream waits for, unpacks): wait
// for the stream of each buffer's latest work, once per distinct stream,
// before the members free them. Every stream progresses: a collective that
// cannot finish is aborted by the communicator's watchdog at its timeout.
void GradientSynchronizer::synchronize_device_buffers() noexcept {
  std::vector<plugin::Stream> streams;
  for (const Bucket& b : buckets_)
    if (b.device_buffer && b.enqueued &&
        std::find(streams.begin(), streams.end(), b.last_stream) == streams.end())
      streams.push_back(b.last_stream);
  if (streams.empty()) return;
  bool finished = true;
  try {
    const plugin::KernelsApi& api = plugin::kernels();
    for (plugin::Stream stream : streams)
      if (api.stream_synchronize(device_.id, stream) != 0) finished = false;
  } catch (...) {
    finished = false;
  }
  if (!finished)
    for (Bucket& b : buckets_) (void)b.device_buffer.release();  // leaked, not freed in use
}

void GradientSynchronizer::lay_out(const std::vector<std::vector<std::size_t>>& groups) {
  const bool mean = options_.op == ReduceOp::kMean;
  for (const auto& members : groups) {
    Bucket& b = buckets_.emplace_back();
    const TensorView& first = slots_[members.front()].like;
    const bool floating = dtype_is_floating(first.dtype);
    b.wire = wire_dtype(first.dtype, options_.compress);
    b.op = floating ? ReduceOp::kSum : options_.op;
    b.pack_scale = floating && mean ? 1.0 / comm_.size() : 1.0;
    b.members = members;
    for (std::size_t index : members) {
      Slot& slot = slots_[index];
      slot.bucket = buckets_.size() - 1;
      slot.direct = options_.compress == Compression::kNone && slot.like.nbytes() >= kDirectBytes;
      if (slot.direct) {
        b.direct.push_back(index);
        continue;
      }
      b.packed.push_back(index);
      slot.offset = b.numel;
      b.numel += static_cast<std::size_t>(slot.like.numel);
    }
  }
}

// Ranks that planned different buckets would all-reduce buffers of
// different sizes against each other; one small all_gather at construction
// turns that into an error here.
void GradientSynchronizer::check_plan_agrees() {
  Fingerprint fp;
  fp.add(slots_.size());
  fp.add(static_cast<std::uint64_t>(options_.op));
  fp.add(static_cast<std::uint64_t>(device_.kind));  // the backend every rank must use
  for (const Bucket& b : buckets_) {
    fp.add(static_cast<std::uint64_t>(b.wire));
    fp.add(b.members.size());
    for (std::size_t index : b.members) {
      fp.add(index);
      fp.add(slots_[index].direct);
      fp.add(static_cast<std::uint64_t>(slots_[index].like.dtype));
      fp.add(static_cast<std::uint64_t>(slots_[index].like.numel));
    }
  }
  const int world = comm_.size();
  std::int64_t mine[2] = {static_cast<std::int64_t>(slots_.size()),
                          static_cast<std::int64_t>(fp.hash)};
  std::vector<std::int64_t> all(2 * static_cast<std::size_t>(world));
  comm_.all_gather(TensorView::flat(mine, 2, DType::kInt64, Device{}),
                   TensorView::flat(all.data(), 2 * world, DType::kInt64, Device{}), false);
  std::vector<std::size_t> disagreeing;
  for (int q = 1; q < world; ++q)
    if (all[2 * q] != all[0] || all[2 * q + 1] != all[1]) disagreeing.push_back(q);
  if (!disagreeing.empty())
    fail(StatusCode::kMismatch, "GradientSynchronizer: ranks ", index_list(disagreeing),
         " planned different gradient buckets than rank 0 (rank 0 has ", all[0],
         " gradients; rank ", disagreeing.front(), " has ", all[2 * disagreeing.front()],
         "); every rank must pass gradients of the same dtypes and sizes, the same ready "
         "order and the same options");
}

std::size_t GradientSynchronizer::bucket_of(std::size_t index) const {
  check_index("bucket_of", index);
  return slots_[index].bucket;
}

std::span<const std::size_t> GradientSynchronizer::bucket_members(std::size_t bucket) const {
  if (bucket >= buckets_.size())
    invalid_argument("GradientSynchronizer: bucket ", bucket, " is outside [0, ", buckets_.size(),
                     ")");
  return buckets_[bucket].members;
}

bool GradientSynchronizer::bucket_done(std::size_t bucket) const {
  bucket_members(bucket);  // range check
  const Bucket& b = buckets_[bucket];
  return bucket < next_launch_ && (!b.work || b.work->done()) &&
         (!b.direct_work || b.direct_work->done());
}

void GradientSynchronizer::check_index(const char* op, std::size_t index) const {
  if (index >= slots_.size())
    invalid_argument("GradientSynchronizer::", op, ": gradient index ", index,
                     " is outside [0, ", slots_.size(), ")");
}

void GradientSynchronizer::mark_ready(std::size_t index, const TensorView& grad,
                                      plugin::Stream stream) {
  check_index("mark_ready", index);
  if (is_marked_[index])
    invalid_argument("GradientSynchronizer::mark_ready: gradient ", index,
                     " was already marked ready in this step; call wait() before marking it "
                     "again");
  const Slot& slot = slots_[index];
  const TensorView& like = slot.like;
  if (!(grad.device == like.device))
    invalid_argument("GradientSynchronizer::mark_ready: gradient ", index, " is on ",
                     device_str(grad.device), " but the synchronizer's gradients are on ",
                     device_str(like.device), "; all gradients of a synchronizer must be on "
                     "one device");
  if (grad.dtype != like.dtype)
    invalid_argument("GradientSynchronizer::mark_ready: gradient ", index, " is ",
                     dtype_name(grad.dtype), " but was planned as ", dtype_name(like.dtype));
  if (!(grad.shape == like.shape))
    invalid_argument("GradientSynchronizer::mark_ready: grad has shape ", grad.shape.str(),
                     " but gradient ", index, " was planned with shape ", like.shape.str());
  Bucket& bucket = buckets_[slot.bucket];
  if (slot.direct) {
    settle(bucket.direct_work);  // a failed step's all-reduce may still write it
  } else {
    // CPU: a failed step's all-reduce may still write the buffer. CUDA: the
    // stream orders this pack after it (see the top of grad_sync.hpp).
    settle(bucket.work);
    if (grad.numel != 0) {
      kernels::pack({&grad, 1}, bucket.buffer + slot.offset * dtype_size(bucket.wire),
                    bucket.wire, bucket.pack_scale, stream);
      bucket.last_stream = stream;
      bucket.enqueued = true;
    }
  }
  marked_[index] = grad;
  is_marked_[index] = true;
  --bucket.unmarked;
  launch_full_buckets(stream);
}

// Buckets start strictly in bucket order, even when a later one fills
// first: collectives on a communicator pair up by issue order, so every
// rank must issue the same buckets in the same order.
//
// CPU: asynchronous collectives on the progress thread, finished by wait().
// CUDA: the collectives are enqueued after the work on `stream`, which waits
// for their results; a blocking call returns as soon as they are enqueued,
// and a Work would only add a completion callback that nothing waits for.
// Direct members are all-reduced in place as one NCCL group.
void GradientSynchronizer::launch_full_buckets(plugin::Stream stream) {
  const bool async = device_.kind == DeviceKind::kCPU;
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].unmarked == 0) {
    Bucket& b = buckets_[next_launch_];
    b.work.reset();
    b.direct_work.reset();
    if (b.numel != 0) {
      const TensorView view = wire_view(b);
      b.work = comm_.all_reduce(view, view, b.op, async, stream);
      b.last_stream = stream;
      b.enqueued = true;
    }
    // Direct members were not pre-scaled: the backend's mean divides them.
    if (!b.direct.empty())
      b.direct_work = comm_.all_reduce_multi(marked_views(b.direct), options_.op, async, stream);
    ++next_launch_;
  }
}

void GradientSynchronizer::wait(plugin::Stream stream) {
  std::vector<std::size_t> missing;
  for (std::size_t i = 0; i < slots_.size(); ++i)
    if (!is_marked_[i]) missing.push_back(i);
  if (!missing.empty())
    invalid_argument("GradientSynchronizer::wait: ",
                     missing.size() == 1 ? "gradient " : "gradients ", index_list(missing),
                     missing.size() == 1 ? " was" : " were",
                     " not marked ready in this step; mark every gradient before wait()");
  try {
    launch_full_buckets(stream);  // normally done by mark_ready; again after a failed launch
    for (std::size_t b = 0; b < buckets_.size(); ++b) finish(b);  // CPU only: no Work on CUDA
    for (Bucket& b : buckets_) {
      if (b.numel == 0) continue;
      kernels::unpack(b.buffer, b.wire, marked_views(b.packed), 1.0, stream);
      b.last_stream = stream;
    }
  } catch (...) {
    start_step();
    throw;
  }
  start_step();
}

// Each all-reduce ends within its own timeout (or fails with its own error,
// naming the operation and the ranks not heard from); a second timeout
// counted from here would race it.
void GradientSynchronizer::finish(std::size_t bucket) {
  for (const auto& work : {buckets_[bucket].work, buckets_[bucket].direct_work}) {
    if (!work) continue;
    work->wait_interruptibly("GradientSynchronizer::wait");
    if (const Status status = work->status(); !status.ok())
      fail(status.code, "GradientSynchronizer::wait: bucket ", bucket, ": ", status.message);
  }
}

// A bucket's buffer may still be in use by an all-reduce of a step whose
// wait() failed. Every collective ends within its own timeout, so this wait
// is bounded too.
void GradientSynchronizer::settle(const std::shared_ptr<Work>& work) {
  if (work) work->wait();
}

void GradientSynchronizer::start_step() {
  std::fill(marked_.begin(), marked_.end(), TensorView{});
  is_marked_.assign(slots_.size(), false);
  for (Bucket& b : buckets_) b.unmarked = b.members.size();
  next_launch_ = 0;
}

TensorView GradientSynchronizer::wire_view(Bucket& bucket) {
  return TensorView::flat(bucket.buffer, static_cast<std::int64_t>(bucket.numel), bucket.wire, device_);
}

std::vector<TensorView> GradientSynchronizer::marked_views(
    const std::vector<std::size_t>& indices) const {
  std::vector<TensorView> views;
  views.reserve(indices.size());
  for (std::size_t index : indices) views.push_back(marked_[index]);
  return views;
}

}  // namespace concord::dp
