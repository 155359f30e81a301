// Implements InPlaceReducer and SlotReducer (reduce_scatter.h, NOTE [stage 2 slots]).
#include "zero/reduce_scatter.h"

#include <ATen/ATen.h>

#include "dscpp/error.h"

namespace dscpp::zero {

// ----- stage 1: reduce-scatter in place ------------------------------------------------------

InPlaceReducer::InPlaceReducer(std::vector<at::Tensor> params, std::vector<std::string> names,
                               std::vector<std::pair<int64_t, int64_t>> segments, int64_t padded,
                               comm::Communicator& comm, ReduceOptions options)
    : GradReducer(std::move(params), std::move(names), std::move(segments),
                  {GroupGeometry{0, padded, padded / comm.world_size(), 0}}, {}, comm, options),
      buffer_(params_, segments_, padded, /*side=*/0, buffer_options_) {
  const int64_t shard = groups_[0].shard;
  grad_shard_ = buffer_.grads().narrow(0, comm_.rank() * shard, shard);
  install_hooks();
}

InPlaceReducer::~InPlaceReducer() { drain_quietly(); }

void InPlaceReducer::on_arriving_locked(int, Bucket&) {
  // Without overlap_comm the reductions in flight finish before a later bucket accumulates.
  if (options_.overlap_comm) return;
  while (!in_flight_.empty()) retire_oldest_locked();
}

void InPlaceReducer::launch_locked(Bucket& b) {
  for (int p : b.params) buffer_.settle(p);
  at::Tensor staging = buffer_.grads().narrow(0, b.offset, b.numel);
  int64_t own_start = 0;
  std::vector<int64_t> counts = rank_counts(b, &own_start);
  const int64_t from = own_start - b.offset, count = counts[comm_.rank()];
  InFlight f;
  f.staging = staging;
  f.result = staging.narrow(0, from, count);
  f.shard_pos = own_start - comm_.rank() * groups_[0].shard;
  // All-reduced, the whole bucket is the sum and comes back (the buffer is read whole after).
  at::Tensor wire = options_.reduce_scatter ? on_wire(b, staging, from, count, f)
                                            : on_wire(b, staging, 0, b.numel, f);
  prescale(wire);
  f.work = options_.reduce_scatter
               ? comm_.reduce_scatter(wire.narrow(0, from, count), wire, counts, reduce_op())
               : comm_.all_reduce(wire, reduce_op());
  in_flight_.push_back(std::move(f));
}

void InPlaceReducer::on_reduced_locked(InFlight& f) {
  const double factor = postscale_factor();
  if (f.result.numel() > 0 && factor != 1.0) f.result.mul_(factor);
}

void InPlaceReducer::reduce_all_now() {
  prepare_backward(true);
  finish_backward();
}

// ----- stages 2-3: staging slots reduce-scattered into a shard --------------------------------

SlotReducer::SlotReducer(std::vector<at::Tensor> params, std::vector<std::string> names,
                         std::vector<std::pair<int64_t, int64_t>> segments,
                         std::vector<GroupGeometry> groups, std::vector<int> param_group,
                         comm::Communicator& comm, ReduceOptions options, int resident_group,
                         std::function<void(int)> on_group_complete,
                         std::unique_ptr<GradShard> shard)
    : GradReducer(std::move(params), std::move(names), std::move(segments), std::move(groups),
                  std::move(param_group), comm, options),
      shard_(std::move(shard)),
      resident_group_(resident_group),
      on_group_complete_(std::move(on_group_complete)) {
  DSCPP_CHECK(resident_group_ <= 0, Error, "internal: the resident group must be group 0");
  DSCPP_CHECK(!options_.accumulate_dtype, Error,
              "internal: gradients accumulate in a dtype of their own at stage 1 only");
  int64_t shard_total = 0;
  for (const auto& g : groups_) shard_total += g.shard;
  if (!shard_) shard_ = make_memory_grad_shard(shard_total, buffer_options_);
  DSCPP_CHECK(shard_->numel() == shard_total, Error, "internal: a gradient shard of ",
              shard_->numel(), " elements for ", shard_total);
  for (const auto& b : buckets_) {  // where each bucket's reduction lands in the shard
    int64_t own_start = 0;
    const int64_t n = rank_counts(b, &own_start)[comm_.rank()];
    const GroupGeometry& g = groups_[b.group];
    if (n > 0) shard_->expect(g.shard_base + own_start - (g.base + comm_.rank() * g.shard), n);
  }
  for (auto& p : params_) p.mutable_grad() = at::Tensor();
  stale_.assign(params_.size(), 0);
  if (resident_group_ == 0) {
    // The resident group is group 0, first in the flat space: its parameters are the first ones.
    std::vector<at::Tensor> rp;
    std::vector<std::pair<int64_t, int64_t>> rs;
    for (size_t i = 0; i < params_.size() && param_group_[i] == 0; ++i) {
      rp.push_back(params_[i]);
      rs.push_back(segments_[i]);
    }
    resident_ = std::make_unique<FullGradBuffer>(rp, rs, groups_[0].padded, 0, buffer_options_);
  }
  group_buckets_.assign(groups_.size(), 0);
  for (const auto& b : buckets_) ++group_buckets_[b.group];
  group_remaining_ = group_buckets_;
  // NOTE [stage 2 slots]: one slot, or two with overlap_comm.
  const int slots = options_.overlap_comm ? 2 : 1;
  staging_.resize(slots);
  slot_bucket_.assign(slots, -1);
  for (const auto& b : buckets_) {
    if (!resident(b)) largest_bucket_ = std::max(largest_bucket_, b.numel);
  }
  if (options_.contiguous_gradients) {
    for (auto& slot : staging_) slot = at::empty({largest_bucket_}, buffer_options_);
  }
  install_hooks();
}

SlotReducer::~SlotReducer() { drain_quietly(); }

void SlotReducer::before_backward() {
  // Autograd puts each gradient where the bucket's slot says (or keeps it, see the NOTE); the
  // resident group's into its own buffer.
  for (auto& p : params_) p.mutable_grad() = at::Tensor();
  if (resident_) resident_->attach_views();
}

void SlotReducer::reset_locked() {
  shard_->begin_backward(final_);
  std::fill(slot_bucket_.begin(), slot_bucket_.end(), -1);
  if (!options_.contiguous_gradients) {
    for (auto& slot : staging_) slot = at::Tensor();
  }
  kept_gradients_ = 0;
  group_remaining_ = group_buckets_;
}

bool SlotReducer::may_launch_locked(const Bucket& b) const {
  return !resident(b) || finishing_;  // the resident group goes when backward is over
}

void SlotReducer::on_arriving_locked(int, Bucket& b) {
  if (!resident(b) && b.slot < 0) acquire_slot_locked(b);
}

bool SlotReducer::take_gradient_locked(int param, const at::Tensor& grad) {
  // The resident group's parameters are the first ones, in the same order in its buffer.
  if (resident_ && param_group_[param] == resident_group_) return resident_->take(param, grad);
  const Bucket& b = buckets_[bucket_of_param_[param]];
  if (b.slot < 0 || !stale_[param]) return false;  // kept by autograd, or accumulated into
  at::NoGradGuard no_grad;
  at::Tensor view = slot_view(b, param);
  view.copy_(grad);
  stale_[param] = 0;
  params_[param].mutable_grad() = view;
  return true;
}

void SlotReducer::on_bucket_complete_locked(Bucket& b) {
  if (--group_remaining_[b.group] == 0 && on_group_complete_) on_group_complete_(b.group);
}

void SlotReducer::after_finish() {
  if (resident_) resident_->zero();  // its sums are in the shard now
  shard_->end_backward();
}

void SlotReducer::acquire_slot_locked(Bucket& b) {
  for (;;) {
    for (size_t s = 0; s < staging_.size(); ++s) {
      if (slot_bucket_[s] >= 0) continue;
      attach_locked(b, static_cast<int>(s));
      return;
    }
    // Every slot is busy: wait for the oldest reduction to free one (backpressure), unless
    // every slot serves a bucket still accumulating (gradients arriving out of bucket order).
    if (in_flight_.empty()) return;
    retire_oldest_locked();
  }
}

void SlotReducer::attach_locked(Bucket& b, int slot) {
  slot_bucket_[slot] = static_cast<int>(&b - buckets_.data());
  b.slot = slot;
  if (!staging_[slot].defined()) staging_[slot] = at::empty({b.numel}, buffer_options_);
  at::NoGradGuard no_grad;
  for (int p : b.params) {
    const at::Tensor& kept = params_[p].grad();
    stale_[p] = !kept.defined();
    if (stale_[p]) continue;
    at::Tensor view = slot_view(b, p);
    view.copy_(kept);
    ++kept_gradients_;
    params_[p].mutable_grad() = view;
  }
}

at::Tensor SlotReducer::slot_view(const Bucket& b, int p) const {
  auto [off, n] = segments_[p];
  return staging_[b.slot].narrow(0, off - b.offset, n).view(params_[p].sizes());
}

void SlotReducer::copy_kept_gradients(const Bucket& b, const at::Tensor& dst) {
  at::NoGradGuard no_grad;
  for (int p : b.params) {
    auto [off, n] = segments_[p];
    at::Tensor view = dst.narrow(0, off - b.offset, n);
    const at::Tensor& g = params_[p].grad();
    if (g.defined()) {
      view.copy_(g.reshape({-1}));
      ++kept_gradients_;
    } else {
      view.zero_();
    }
  }
}

void SlotReducer::launch_locked(Bucket& b) {
  // The bucket's gradients are in its slot, or in a buffer of its own when every slot serves a
  // bucket still accumulating; the resident group's in its full buffer.
  if (!resident(b) && b.slot < 0) acquire_slot_locked(b);
  at::Tensor staging;
  if (resident(b)) {
    for (int p : b.params) resident_->settle(p);
    staging = resident_->grads().narrow(0, b.offset - groups_[b.group].base, b.numel);
  } else if (b.slot >= 0) {
    for (int p : b.params) {  // no gradient in this backward: zeros
      if (stale_[p]) slot_view(b, p).zero_();
      stale_[p] = 0;
    }
    staging = staging_[b.slot].narrow(0, 0, b.numel);
  } else {
    staging = at::empty({b.numel}, buffer_options_);
    copy_kept_gradients(b, staging);
  }
  if (!resident(b)) {
    for (int p : b.params) params_[p].mutable_grad() = at::Tensor();
  }
  int64_t own_start = 0;
  std::vector<int64_t> counts = rank_counts(b, &own_start);
  const int64_t from = own_start - b.offset, count = counts[comm_.rank()];
  const GroupGeometry& g = groups_[b.group];
  InFlight f;
  f.staging = staging;
  f.result = staging.narrow(0, from, count);
  f.shard_pos = g.shard_base + own_start - (g.base + comm_.rank() * g.shard);
  f.slot = b.slot;
  at::Tensor wire = on_wire(b, staging, from, count, f);
  prescale(wire);
  at::Tensor out = wire.narrow(0, from, count);
  if (!options_.reduce_scatter) {
    f.work = comm_.all_reduce(wire, reduce_op());
  } else if (options_.quantize_gradients && !resident(b)) {
    f.work = comm_.reduce_scatter_quantized(out, wire, counts, reduce_op());
  } else {
    f.work = comm_.reduce_scatter(out, wire, counts, reduce_op());
  }
  in_flight_.push_back(std::move(f));
}

void SlotReducer::on_reduced_locked(InFlight& f) {
  if (f.result.numel() == 0) return;
  shard_->add(f.shard_pos, f.result, postscale_factor());
}

at::Tensor SlotReducer::final_piece_locked(const InFlight& f) const {
  const at::Tensor shard = shard_->tensor();
  DSCPP_CHECK(shard.defined(), Error,
              "internal: a listener for final pieces of a gradient shard that is not in memory");
  return shard.narrow(0, f.shard_pos, f.result.numel());
}

void SlotReducer::release_slot_locked(int slot) {
  slot_bucket_[slot] = -1;
  if (!options_.contiguous_gradients) staging_[slot] = at::Tensor();
}

int64_t SlotReducer::kept_gradients() const {
  std::lock_guard<std::mutex> g(mu_);
  return kept_gradients_;
}

int64_t SlotReducer::staging_bytes() const {
  if (!options_.contiguous_gradients) return 0;  // allocated per bucket, freed once reduced
  int64_t total = 0;
  for (const auto& s : staging_) total += static_cast<int64_t>(s.nbytes());
  return total;
}

int64_t SlotReducer::grad_bytes() const {
  return shard_->bytes() + (resident_ ? resident_->bytes() : 0);
}

void SlotReducer::zero_grads() {
  shard_->zero();
  for (auto& p : params_) p.mutable_grad() = at::Tensor();
  if (resident_) {
    resident_->zero();
    resident_->attach_views();
  }
}

}  // namespace dscpp::zero
