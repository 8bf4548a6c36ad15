// Gradient buckets (DESIGN.md §2 Bucket, §5 GradientSynchronizer): DDP's
// bucketed all-reduce for any framework's gradients.
//
// A step: mark_ready(i, grad) for every gradient, in any order, as backward
// produces them; each packs its gradient into its bucket and a full bucket
// starts its all-reduce at once, overlapping the rest of backward. wait()
// then finishes every bucket and unpacks the results into the gradients.
//
// Without compression, gradients of kDirectBytes and more are not packed:
// their bucket's launch all-reduces them where they are (the shm backend
// already moves large buffers in pipelined chunks, so a copy into the bucket
// and back would only add two passes over memory). Such a gradient is
// written in place, so a collective that fails part-way may leave it
// partially reduced; packed gradients are untouched by a failure.
// One thread drives a step; the synchronizer is not thread-safe.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "base/tensor_view.hpp"
#include "comm/communicator.hpp"
#include "comm/work.hpp"
#include "kernels/reduce_op.hpp"

namespace concord::dp {

enum class Compression { kNone, kBFloat16, kFloat16 };

// Gradients this large are handed to all_reduce_multi whole, which reduces
// them in place rather than packing them again.
inline constexpr std::size_t kDirectBytes = kMultiPackBelowBytes;

struct GradSyncOptions {
  double bucket_cap_mb = 25.0;   // capacity of every bucket after the first
  double first_bucket_mb = 1.0;  // small, so the first all-reduce starts early
  ReduceOp op = ReduceOp::kMean;  // kMean or kSum
  Compression compress = Compression::kNone;  // float32 gradients only
};

class GradientSynchronizer {
 public:
  // Plans buckets for gradients like `grads` (dtype, element count, device;
  // data is not read), filled in `ready_order` (a permutation of the
  // indices; empty = reverse index order, the order backward produces
  // them). Collective over `comm`: every rank must plan the same buckets,
  // which is checked. `comm` must outlive the synchronizer.
  GradientSynchronizer(Communicator& comm, std::vector<TensorView> grads,
                       std::vector<std::size_t> ready_order, GradSyncOptions options);
  // Waits for the bucket all-reduces still in flight: they use its buffers.
  ~GradientSynchronizer();
  GradientSynchronizer(const GradientSynchronizer&) = delete;
  GradientSynchronizer& operator=(const GradientSynchronizer&) = delete;

  std::size_t num_grads() const noexcept { return slots_.size(); }
  std::size_t num_buckets() const noexcept { return buckets_.size(); }
  std::size_t bucket_of(std::size_t index) const;
  // Gradient indices of a bucket, in the order they fill it.
  std::span<const std::size_t> bucket_members(std::size_t bucket) const;
  // Buckets whose all-reduce started in this step (they start in bucket
  // order), and whether one finished.
  std::size_t launched_buckets() const noexcept { return next_launch_; }
  bool bucket_done(std::size_t bucket) const;

  // Packs `grad` (like gradient `index`: dtype, element count, device) into
  // its bucket, scaled by 1/world size for a mean and compressed if asked.
  // `grad` must stay valid until wait(), which writes the result into it.
  void mark_ready(std::size_t index, const TensorView& grad);
  // Finishes every bucket (each wait bounded by the communicator's timeout)
  // and only then unpacks into the gradients, so a failed collective leaves
  // every packed gradient as it was. Ready for the next step afterwards, also after
  // such a failure. With gradients not yet marked it raises before anything
  // else and the step stays open: mark them and call wait() again.
  void wait();

 private:
  struct Slot {
    TensorView like;  // the planned gradient
    std::size_t bucket = 0;
    std::size_t offset = 0;  // in elements of the bucket's wire dtype
    bool direct = false;     // reduced where it is, not packed (see kDirectBytes)
  };
  struct Bucket {
    DType wire = DType::kFloat32;
    Device device;
    ReduceOp op = ReduceOp::kSum;  // what the bucket all-reduces with
    double pack_scale = 1.0;       // applied while packing: 1 / world size for a floating mean
    std::vector<std::size_t> members;
    std::vector<std::size_t> direct;           // members reduced in place
    std::size_t numel = 0;                     // of the packed members
    std::unique_ptr<unsigned char[]> buffer;  // allocated once, reused every step
    std::size_t unmarked = 0;                  // members not yet marked in this step
    std::shared_ptr<Work> work;                // packed members, latest launch
    std::shared_ptr<Work> direct_work;         // direct members, latest launch
  };

  // Buckets from their member lists, in launch order.
  void lay_out(const std::vector<std::vector<std::size_t>>& groups);
  void check_plan_agrees();
  void check_index(const char* op, std::size_t index) const;
  void settle(const std::shared_ptr<Work>& work);
  void launch_full_buckets();
  void finish(std::size_t bucket);
  void start_step();
  TensorView wire_view(Bucket& bucket);
  std::vector<TensorView> marked_views(const std::vector<std::size_t>& indices) const;
  std::vector<std::size_t> packed_members(const Bucket& bucket) const;

  Communicator& comm_;
  GradSyncOptions options_;
  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;
  std::vector<TensorView> marked_;  // this step's gradients, where is_marked_
  std::vector<bool> is_marked_;
  std::size_t next_launch_ = 0;
};

}  // namespace concord::dp
