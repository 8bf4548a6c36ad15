// Gradient buckets (concord.training.GradientSynchronizer in Python): DDP's
// bucketed all-reduce for any framework's gradients.
//
// A step: mark_ready(i, grad) for every gradient, in any order, as backward
// produces them; each packs its gradient into its bucket and a full bucket
// starts its all-reduce at once, overlapping the rest of backward. wait()
// then finishes every bucket and unpacks the results into the gradients.
//
// All gradients of a synchronizer live on one device: the CPU, or one CUDA
// device. Buckets are buffers on that device, allocated once and reused by
// every step.
//
// Without compression, gradients of kDirectBytes and more are not packed:
// their bucket's launch all-reduces them where they are (on the CPU the shm
// backend already moves large buffers in pipelined chunks; on CUDA they join
// one NCCL group, reduced in place, so a copy into the bucket and back would
// only add two passes over memory and device memory for a second copy of the
// largest gradients). Such a gradient is written in place, so a collective
// that fails part-way may leave it partially reduced.
//
// CPU gradients: the all-reduces run on the communicator's progress thread;
// wait() waits for them (each within the communicator's timeout) and only
// then unpacks, so a failed collective raises from wait() and leaves every
// packed gradient as it was.
//
// CUDA gradients: nothing in a step waits on the host. Work
// is ordered by the caller's CUDA stream, passed to mark_ready() and wait():
// a gradient is packed on its mark_ready's stream; a bucket's all-reduce is
// enqueued on NCCL after the work on the stream of the call that launched it
// (the mark_ready completing it, or wait()), and that stream waits for the
// result; wait() enqueues the unpacks on its stream and returns. Use one
// stream for every call (the framework's current stream); with several, the
// caller must order them (CUDA events) so that each call's stream is ordered
// after the streams of the calls before it, in this step and the previous
// one. A gradient must stay allocated until the unpacks enqueued by wait()
// have run. A collective's failure (a lost peer, the timeout) is seen by the
// communicator's watchdog on the device's schedule, after the call returned:
// it aborts the communicator, and the error surfaces from a later call that
// reaches the communicator (the next step's bucket launch, or any other
// collective). By then wait() may have unpacked a partial or unreduced
// result: after such an error no gradient of that step, packed or not, can
// be trusted.
//
// The first bucket launch of the first step creates the communicator's nccl
// backend (a one-time rendezvous through the store) unless a CUDA collective
// on the communicator already did.
//
// One thread drives a step; the synchronizer is not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "base/tensor_view.hpp"
#include "comm/communicator.hpp"
#include "comm/work.hpp"
#include "base/reduce_op.hpp"
#include "plugin/cuda_plugin_abi.hpp"

namespace concord::dp {

enum class Compression { kNone, kBFloat16, kFloat16 };

// Gradients this large are handed to all_reduce_multi whole, which reduces
// them in place rather than packing them again.
inline constexpr std::size_t kDirectBytes = kMultiPackBelowBytes;

// No defaults here: those belong to the public signatures (Python, and the
// C ABI's CONCORD_GRAD_SYNC_OPTIONS_INIT); every caller passes every field.
struct GradSyncOptions {
  double bucket_cap_mb;    // capacity of every bucket after the first
  double first_bucket_mb;  // of the first (small, so the first all-reduce starts early)
  ReduceOp op;             // kMean or kSum
  Compression compress;    // float32 gradients only
};

class GradientSynchronizer {
 public:
  // Plans buckets for gradients like `grads` (dtype, shape, device; data
  // is not read), filled in `ready_order` (a permutation of the
  // indices; empty = reverse index order, the order backward produces
  // them). Collective over `comm`: every rank must plan the same buckets,
  // which is checked. `comm` must outlive the synchronizer. Gradients on
  // more than one device: InvalidArgument naming two of them. CUDA
  // gradients without a usable CUDA plugin, device or NCCL: Unavailable
  // with the reason, before any communication.
  GradientSynchronizer(Communicator& comm, std::vector<TensorView> grads,
                       std::vector<std::size_t> ready_order, GradSyncOptions options);
  // Waits for the bucket all-reduces still in flight: they use its buffers.
  // On CUDA it blocks the host, once, until the stream of the latest work
  // on each buffer (that of the latest mark_ready or wait using it) has
  // finished, then frees the buffers: those streams must still exist.
  // Should that wait fail, the buffers are left allocated rather than freed
  // under device work that may still be running.
  ~GradientSynchronizer();
  GradientSynchronizer(const GradientSynchronizer&) = delete;
  GradientSynchronizer& operator=(const GradientSynchronizer&) = delete;

  std::size_t num_grads() const noexcept { return slots_.size(); }
  std::size_t num_buckets() const noexcept { return buckets_.size(); }
  std::size_t bucket_of(std::size_t index) const;
  // Gradient indices of a bucket, in the order they fill it.
  std::span<const std::size_t> bucket_members(std::size_t bucket) const;
  // Buckets whose all-reduce started in this step (they start in bucket
  // order), and whether one finished. On CUDA a bucket counts as finished
  // once its all-reduce is enqueued: the device finishes it in stream order.
  std::size_t launched_buckets() const noexcept { return next_launch_; }
  bool bucket_done(std::size_t bucket) const;
  const Device& device() const noexcept { return device_; }

  // Packs `grad` (like gradient `index`: dtype, shape, device) into
  // its bucket, scaled by 1/world size for a floating mean (an integer mean
  // is the all-reduce's own, truncating) and compressed if asked;
  // a full bucket starts its all-reduce. `grad` must stay valid until
  // wait(), which writes the result into it. A gradient unlike the planned
  // one (device, dtype, shape): InvalidArgument, before anything is written.
  // `stream` (CUDA gradients only; nullptr = the legacy default stream):
  // the pack and a launched all-reduce are ordered after its work.
  void mark_ready(std::size_t index, const TensorView& grad, plugin::Stream stream = nullptr);
  // With gradients not yet marked it raises before anything else and the
  // step stays open: mark them and call wait() again. Otherwise it launches
  // any bucket not yet launched, then:
  // - CPU: finishes every bucket (each wait bounded by the communicator's
  //   timeout) and only then unpacks into the gradients, so a failed
  //   collective leaves every packed gradient as it was;
  // - CUDA: enqueues the unpacks on `stream` and returns without waiting;
  //   a collective's failure surfaces from a later call (see the top of
  //   this file), and the gradients of that step may hold partial results.
  // Ready for the next step afterwards, also after a failure.
  void wait(plugin::Stream stream = nullptr);

 private:
  struct Slot {
    TensorView like;  // the planned gradient
    std::size_t bucket = 0;
    std::size_t offset = 0;  // in elements of the bucket's wire dtype
    bool direct = false;     // reduced where it is, not packed (see kDirectBytes)
  };
  // Frees device memory of the synchronizer's CUDA device.
  struct DeviceFree {
    std::int32_t device;
    void operator()(void* ptr) const noexcept;
  };
  struct Bucket {
    DType wire = DType::kFloat32;
    ReduceOp op = ReduceOp::kSum;  // what the bucket all-reduces with
    double pack_scale = 1.0;       // applied while packing: 1 / world size for a floating mean
    std::vector<std::size_t> members;
    std::vector<std::size_t> direct;           // members reduced in place
    std::vector<std::size_t> packed;           // the others, in buffer order
    std::size_t numel = 0;                     // of the packed members
    // The wire buffer, allocated once and reused every step: host memory, or
    // device memory from the CUDA plugin (one of the two owners is set).
    std::unique_ptr<unsigned char[]> host_buffer;
    std::unique_ptr<void, DeviceFree> device_buffer;
    unsigned char* buffer = nullptr;
    // CUDA: the stream of the latest work enqueued on the buffer (pack,
    // all-reduce, unpack), and whether there was any.
    plugin::Stream last_stream = nullptr;
    bool enqueued = false;
    std::size_t unmarked = 0;                  // members not yet marked in this step
    std::shared_ptr<Work> work;                // packed members, latest launch
    std::shared_ptr<Work> direct_work;         // direct members, latest launch
  };

  // Buckets from their member lists, in launch order.
  void lay_out(const std::vector<std::vector<std::size_t>>& groups);
  void allocate_buffers();
  void check_plan_agrees();
  void synchronize_device_buffers() noexcept;
  void check_index(const char* op, std::size_t index) const;
  void settle(const std::shared_ptr<Work>& work);
  void launch_full_buckets(plugin::Stream stream);
  void finish(std::size_t bucket);
  void start_step();
  TensorView wire_view(Bucket& bucket);
  std::vector<TensorView> marked_views(const std::vector<std::size_t>& indices) const;

  Communicator& comm_;
  GradSyncOptions options_;
  Device device_;  // of every gradient; the CPU when there are none
  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;
  std::vector<TensorView> marked_;  // this step's gradients, where is_marked_
  std::vector<bool> is_marked_;
  std::size_t next_launch_ = 0;
};

}  // namespace concord::dp
