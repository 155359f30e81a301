// The reduce-scatter gradient paths of ZeRO stages 1-3: each rank keeps the sum of its shard.
//
// InPlaceReducer (stage 1): the gradients accumulate over the micro-steps in a full gradient
// buffer (grad_buffer.h). During the boundary backward each complete bucket is reduce-scattered
// in place, so this rank's part of the bucket (the part inside its shard) ends up holding the
// sum and the rest of the buffer is left as it was; no second gradient shard exists.
//
// SlotReducer (stages 2-3): there is no full gradient buffer. Each bucket's gradients accumulate
// in a staging slot (NOTE [stage 2 slots]); when the bucket is complete the slot is
// reduce-scattered (every rank receives the part of the bucket that falls in its shard of the
// bucket's group), that part is added into this rank's gradient shard (grad_shard.h: in memory,
// or on disk), which accumulates over the micro-steps, and the slot is free for a later bucket.
// Every backward reduces.
//
// NOTE [stage 2 slots]: just before a bucket's first gradient is accumulated (a pre-hook on the
// parameter's gradient accumulator), the bucket gets a staging slot; each parameter's first
// gradient of the backward is copied into its place in the slot (not added to zeros: NOTE
// [first gradient is written] in grad_buffer.h), which becomes its .grad, so autograd adds any
// further gradient into the slot in place and frees its own result at once, exactly as at
// stages 0-1; a place with no gradient by launch is zeroed then. Letting autograd keep the
// gradients it allocates until the bucket is complete (and copying them then) made each backward
// allocate up to a model's worth of fresh memory that the allocator had given back to the OS after
// the previous step: on the 150M GPT page faults took 40% of stage 2's step (docs/zero.md). There
// is one slot, or two with overlap_comm. When every slot is busy, the arriving gradient waits for
// the oldest reduction to finish and take its slot (so without overlap_comm a bucket's reduction
// runs while backward computes up to the next bucket's first gradient, and no further). Only
// when every slot serves a bucket that is still accumulating (gradients arriving out of bucket
// order) does autograd keep the gradient; it is copied into the slot when its bucket gets one,
// or into a buffer of the bucket's own at launch.
//
// At stage 3 the parameters that stay whole on every rank (the resident group: small ones and
// those in no unit) do not use the slots: their gradients accumulate in a full buffer of their
// own during backward, which is reduce-scattered into the shard when backward ends (their buckets
// come last in launch order), so they never hold a slot that a unit's gradients wait for.
//
// Settings (DeepSpeed's meaning): `overlap_comm` lets reductions run while backward goes on;
// without it a bucket's reduction finishes before any later bucket's gradient is accumulated
// (DeepSpeed's single buffer), and stage 2 keeps one staging slot instead of two.
// `contiguous_gradients` (stages 2-3) keeps the staging slots allocated for the whole run (else
// each bucket's is allocated when the bucket gets a slot and freed once reduced);
// `reduce_scatter` false all-reduces the bucket and keeps this rank's part.
#pragma once

#include <functional>
#include <memory>

#include "zero/grad_buffer.h"
#include "zero/grad_shard.h"
#include "zero/reducer.h"

namespace dscpp::zero {

class InPlaceReducer final : public GradReducer {
 public:
  // `params`: views into a flat buffer of `padded` elements at `segments` (partition.h).
  InPlaceReducer(std::vector<at::Tensor> params, std::vector<std::string> names,
                 std::vector<std::pair<int64_t, int64_t>> segments, int64_t padded,
                 comm::Communicator& comm, ReduceOptions options);
  ~InPlaceReducer() override;

  // Reduces the accumulated gradients outside a backward (after no_sync, or a flush).
  void reduce_all_now();
  // This rank's shard of the averaged gradient, a view into the full buffer (valid after a
  // reducing backward). [shard]
  at::Tensor grad_shard() const { return grad_shard_; }
  int64_t grad_bytes() const override { return buffer_.bytes(); }
  void zero_grads() override { buffer_.zero(); }

 private:
  void before_backward() override { buffer_.attach_views(); }
  bool take_gradient_locked(int param, const at::Tensor& grad) override {
    return buffer_.take(param, grad);
  }
  at::Tensor accumulated_grad_locked(int param) const override { return buffer_.view(param); }
  void on_arriving_locked(int param, Bucket& b) override;
  void launch_locked(Bucket& b) override;
  void on_reduced_locked(InFlight& f) override;

  FullGradBuffer buffer_;
  at::Tensor grad_shard_;
};

class SlotReducer final : public GradReducer {
 public:
  // `params`: the trainable parameters at `segments` of the flat gradient space made of
  // `groups` (param_group: each parameter's group; empty: one group). This rank's gradient shard
  // is the concatenation of its shards of the groups.
  // `resident_group` (stage 3, or -1): the group whose gradients accumulate in a full buffer
  // and are reduced when backward ends; it must be group 0, so its buckets launch last.
  // `on_group_complete` (optional): called (under the reducer's lock, from a gradient hook or
  // finish_backward) when every gradient of a group has arrived in a reducing backward.
  // `shard` (optional): where the gradient shard is summed (its numel the sum of the groups'
  // shards); null: in memory.
  SlotReducer(std::vector<at::Tensor> params, std::vector<std::string> names,
              std::vector<std::pair<int64_t, int64_t>> segments, std::vector<GroupGeometry> groups,
              std::vector<int> param_group, comm::Communicator& comm, ReduceOptions options,
              int resident_group = -1, std::function<void(int group)> on_group_complete = nullptr,
              std::unique_ptr<GradShard> shard = nullptr);
  ~SlotReducer() override;

  // This rank's shard of the averaged gradient, summed over the micro-steps [sum of shards];
  // undefined when the shard is not in memory (shard() then reads it).
  at::Tensor grad_shard() const { return shard_->tensor(); }
  GradShard& shard() { return *shard_; }
  const GradShard& shard() const { return *shard_; }
  // Gradients of the last backward that autograd kept because they arrived before their
  // bucket could have a slot (NOTE [stage 2 slots]); 0 when they arrive in bucket order.
  int64_t kept_gradients() const;
  // The shard, and at stage 3 the resident group's buffer.
  int64_t grad_bytes() const override;
  int64_t staging_bytes() const override;
  void zero_grads() override;

 private:
  bool reduces_every_backward() const override { return true; }
  void before_backward() override;
  void reset_locked() override;
  void on_arriving_locked(int param, Bucket& b) override;
  bool take_gradient_locked(int param, const at::Tensor& grad) override;
  bool may_launch_locked(const Bucket& b) const override;
  void launch_locked(Bucket& b) override;
  void on_reduced_locked(InFlight& f) override;
  at::Tensor final_piece_locked(const InFlight& f) const override;
  void release_slot_locked(int slot) override;
  void on_bucket_complete_locked(Bucket& b) override;
  void after_finish() override;
  bool resident(const Bucket& b) const { return b.group == resident_group_; }
  // Gives `b` a free slot, waiting for the oldest reduction to free one when all are busy;
  // leaves b.slot at -1 when every slot serves a bucket that is still accumulating.
  void acquire_slot_locked(Bucket& b);
  // Gives b `slot`: the gradients autograd kept for b's parameters are copied into their places
  // (now their .grad); the other places are stale until the first gradient is copied in
  // (take_gradient_locked) or, with none in this backward, zeroed at launch (NOTE [first
  // gradient is written] in grad_buffer.h, for the slots).
  void attach_locked(Bucket& b, int slot);
  // Parameter p's place in its bucket's slot, in p's shape.
  at::Tensor slot_view(const Bucket& b, int p) const;
  void copy_kept_gradients(const Bucket& b, const at::Tensor& dst);

  std::unique_ptr<GradShard> shard_;
  // The staging slots (contiguous_gradients: allocated once, else per bucket) and the bucket each
  // one serves (-1: free).
  std::vector<at::Tensor> staging_;
  std::vector<int> slot_bucket_;
  int64_t largest_bucket_ = 0;
  int64_t kept_gradients_ = 0;
  std::vector<char> stale_;  // per parameter: its place in an attached slot awaits its gradient
  int resident_group_ = -1;
  std::unique_ptr<FullGradBuffer> resident_;  // the resident group's gradients this backward
  std::function<void(int)> on_group_complete_;
  std::vector<int> group_buckets_;    // buckets per group
  std::vector<int> group_remaining_;  // of them not complete in this backward
};

}  // namespace dscpp::zero
