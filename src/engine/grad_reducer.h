// GradReducer: the data-parallel gradient path of ZeRO stages 0, 1 and 2.
//
// The model's trainable parameters become views into one flat buffer in the training dtype
// (fp32, or bf16/fp16 under mixed precision), padded with zeros so that every rank's shard is
// equal. The buffer is cut into buckets of about reduce_bucket_size elements, taken from the end
// (the last parameters' gradients are ready first in backward); a parameter is never split. A
// post-hook on each parameter's gradient accumulator counts its bucket down.
//
// Modes kAllReduce (stage 0) and kReduceScatterInPlace (stage 1): the gradients are views into a
// second flat buffer, so autograd accumulates straight into the buffer the collectives and the
// optimizer use, over the micro-steps. During a reducing backward (the boundary) each bucket is
// reduced as soon as it is complete: kAllReduce all-reduces it; kReduceScatterInPlace
// reduce-scatters it in place, so this rank's part of the bucket (the part inside its shard)
// ends up holding the sum and the rest of the buffer is left as it was.
//
// Mode kReduceScatter (stage 2): there is no full gradient buffer. Each bucket's gradients
// accumulate in a staging slot (NOTE [stage 2 slots]); when the bucket is complete the slot is
// reduce-scattered (every rank receives the part of the bucket that falls in its shard), that
// part is added into this rank's gradient shard, which accumulates over the micro-steps, and the
// slot is free for a later bucket. Every backward reduces.
//
// NOTE [stage 2 slots]: just before a bucket's first gradient is accumulated (a pre-hook on the
// parameter's gradient accumulator), the bucket gets a zeroed staging slot and its parameters'
// .grad become views into it, so autograd adds each gradient into the slot in place and frees
// its own result at once, exactly as at stages 0-1. Letting autograd keep the gradients it
// allocates until the bucket is complete (and copying them then) made each backward allocate up
// to a model's worth of fresh memory that the allocator had given back to the OS after the
// previous step: on the 150M GPT page faults took 40% of stage 2's step (docs/zero.md). There is
// one slot, or two with overlap_comm. When every slot is busy, the arriving gradient waits for
// the oldest reduction to finish and take its slot (so without overlap_comm a bucket's reduction
// runs while backward computes up to the next bucket's first gradient, and no further). Only
// when every slot serves a bucket that is still accumulating (gradients arriving out of bucket
// order) does autograd keep the gradient; it is copied into the slot when its bucket gets one,
// or into a buffer of the bucket's own at launch.
//
// Stages 1-2 (DeepSpeed's meaning): `overlap_comm` lets reductions run while backward goes on;
// without it a bucket's reduction finishes before any later bucket's gradient is accumulated
// (DeepSpeed's single buffer), stage 2 keeps one staging slot instead of two.
// `contiguous_gradients` (stage 2) keeps the staging slots allocated for the whole run (else
// each bucket's is allocated when the bucket gets a slot and freed once reduced);
// `reduce_scatter` false all-reduces the bucket and keeps this rank's part.
//
// NOTE [bucket cap]: a bucket larger than a sixteenth of the model (but at least kMinBucketCap
// elements) helps nothing: it only delays the first reduction, so less overlaps with backward,
// and at stage 2 it sizes the staging slots. DeepSpeed's default of 5e8 elements is larger than
// most models. capped_bucket_size() applies the cap to reduce_bucket_size and
// allgather_bucket_size; bucket sizes never change the trajectory, and smaller values are kept
// as given.
//
// Parameters that the loss does not reach (an unused branch) are found before backward runs, by
// walking the loss's autograd graph, and count as ready at once, so their buckets never hold the
// others back.
//
// NOTE [bucket order]: buckets are launched strictly in index order on every rank, even if
// a later bucket is ready first, so ranks always issue the same collectives in the same
// order (a parameter unused on one rank only cannot reorder them). Buckets still pending
// when backward returns (unused parameters) are launched then, in order, with zeros for the
// missing gradients.
//
// NOTE [side channel]: the gradient buffer has `side_channel` extra elements before the first
// parameter (kAllReduce only). They ride along in the last bucket (the one at the start of the
// buffer) and are summed over ranks but never scaled, so the engine gets per-step statistics
// (the window's loss, which ranks saw a non-finite loss or a failed backward) without a
// collective of their own. That bucket is launched only by finish_backward(), never from a
// hook, so the engine can still rewrite the statistics when a backward fails.
//
// Threading: hooks run on the autograd thread(s); the bucket state is guarded by a mutex.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/comm.h"

namespace dscpp::engine {

enum class ReduceMode { kAllReduce, kReduceScatterInPlace, kReduceScatter };

constexpr int64_t kBucketsPerModel = 16;
constexpr int64_t kMinBucketCap = int64_t{1} << 20;  // elements
// The bucket size used for a configured size and a model of `numel` trainable elements
// (NOTE [bucket cap]): min(configured, max(kMinBucketCap, ceil(numel / kBucketsPerModel))).
int64_t capped_bucket_size(int64_t configured, int64_t numel);

struct GradReduceOptions {
  ReduceMode mode = ReduceMode::kAllReduce;
  at::ScalarType dtype = at::kFloat;       // of the parameters and gradients in training
  // Elements per bucket (DeepSpeed's unit), used as given: the engine applies the cap.
  int64_t reduce_bucket_size = 500000000;
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  // kReduceScatter only (DeepSpeed's meaning, see above).
  bool overlap_comm = false;
  bool contiguous_gradients = true;
  bool reduce_scatter = true;
};

class GradReducer {
 public:
  // `params`: the trainable parameters, distinct, fp32, on one device. Replaces each
  // parameter's storage by a view into the flat buffer, cast to options.dtype. The flat buffer
  // is padded with zeros to a multiple of the world size.
  // `side_channel`: extra gradient elements summed with the last bucket (kAllReduce only;
  // NOTE [side channel]).
  GradReducer(std::vector<at::Tensor> params, std::vector<std::string> names,
              comm::Communicator& comm, GradReduceOptions options, int64_t side_channel = 0);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Call before loss.backward(): whether this backward reduces gradients over ranks
  // (kReduceScatter always does). `loss` (optional) lets parameters it cannot reach count as
  // ready at once.
  void prepare_backward(bool reduce, const at::Tensor& loss = at::Tensor());
  // Call after loss.backward(): launches the buckets still pending (in order) and waits for
  // every reduction of this backward. Returns the seconds spent waiting.
  double finish_backward();
  // Averages the accumulated gradients over ranks outside a backward (stages 0-1: flush at the
  // end of an epoch, or after no_sync), bucket by bucket; blocks until done.
  void reduce_all_now();
  // Names of the parameters that got no gradient in the last backward on this rank.
  std::vector<std::string> unused_in_last_backward() const;

  at::Tensor flat_params() const { return flat_params_.narrow(0, 0, numel_); }  // [numel]
  // The parameters with their zero padding: [padded_numel].
  at::Tensor padded_params() const { return flat_params_; }
  // Stages 0-1: the gradients, [numel] and with padding [padded_numel].
  at::Tensor flat_grads() const { return flat_grads_.narrow(0, 0, numel_); }
  at::Tensor padded_grads() const { return flat_grads_; }
  // Stages 1-2: this rank's shard of the averaged gradient (stage 2: summed over the
  // micro-steps; stage 1: a view into the gradient buffer, valid after a reducing backward).
  at::Tensor grad_shard() const { return grad_shard_; }
  // [side_channel] fp32: written before a reducing backward, summed over ranks by it.
  at::Tensor side_channel() const { return side_channel_; }
  int64_t numel() const { return numel_; }
  int64_t padded_numel() const { return flat_params_.numel(); }
  int64_t shard_numel() const { return padded_numel() / comm_.world_size(); }
  int64_t shard_offset() const { return comm_.rank() * shard_numel(); }
  const std::vector<at::Tensor>& params() const { return params_; }
  const std::vector<std::string>& names() const { return names_; }
  // [offset, numel) of each parameter in the flat buffers.
  const std::vector<std::pair<int64_t, int64_t>>& segments() const { return segments_; }
  size_t num_buckets() const { return buckets_.size(); }
  // Buckets launched so far in the current backward (all of them once finish_backward returns).
  size_t buckets_launched() const;
  // Whether every parameter's gradient of this backward is in (or known not to come): the
  // gradients are complete, whatever has been launched.
  bool all_gradients_ready() const;
  // Whether a gradient arrived after its bucket was reduced in this backward (an error was
  // raised from the hook; the gradients are incomplete).
  bool late_gradient() const;
  // Stage 2: gradients of the last backward that autograd kept because they arrived before
  // their bucket could have a slot (NOTE [stage 2 slots]); 0 when they arrive in bucket order.
  int64_t kept_gradients() const;
  // Bytes of the gradient buffers held between steps (full buffer or shard) and of the staging
  // buffers (kReduceScatter with contiguous_gradients).
  int64_t grad_bytes() const;
  int64_t staging_bytes() const;
  void zero_grads();

 private:
  struct Bucket {
    int64_t offset = 0;
    int64_t numel = 0;
    std::vector<int> params;
    int pending = 0;
    bool launched = false;
    int slot = -1;  // kReduceScatter: the staging slot its gradients accumulate in, or -1
  };
  // A launched reduce-scatter of one bucket: where its result lands.
  struct InFlight {
    comm::WorkHandle work;
    at::Tensor staging;  // keeps the buffer alive until the reduction is done
    at::Tensor result;   // this rank's part of the bucket (a view of `staging`)
    int64_t shard_pos = 0;  // stage 2: where `result` is added in grad_shard_
    int slot = -1;          // stage 2: the staging slot to hand on, or -1
  };
  // Marks `param` as having its gradient for this backward; launches what is ready.
  void mark_ready_locked(int param);
  // Before `param`'s gradient is accumulated: stage 2 gives its bucket a slot (NOTE [stage 2
  // slots]); stage 1 without overlap_comm finishes the reductions in flight.
  void on_grad_arriving(int param);
  // After it was accumulated: counts its bucket down.
  void on_grad_ready(int param);
  void launch_in_order_locked();
  void launch_all_reduce(Bucket& b);
  void launch_reduce_scatter(Bucket& b);
  // Waits for the oldest in-flight reduction and scales its part (stage 2: adds it into the
  // shard and hands its slot on). The entry and its slot are released even when the wait throws.
  void retire_oldest_locked();
  // Scales a finished reduction's part (stage 2: adds it into the shard).
  void add_to_shard(const InFlight& f);
  // Retires the reductions already done, oldest first, without waiting.
  void retire_completed_locked();
  // Stage 2 (NOTE [stage 2 slots]): gives `b` a free slot, waiting for the oldest reduction to
  // free one when all are busy; leaves b.slot at -1 when every slot serves a bucket that is
  // still accumulating.
  void acquire_slot_locked(Bucket& b);
  // Points b's parameters' .grad at their place in `slot`, which first takes the gradients
  // autograd kept for them (zeros for the others).
  void attach_locked(Bucket& b, int slot);
  void copy_kept_gradients(const Bucket& b, const at::Tensor& dst);
  // The gradient accumulators `loss` reaches (empty: unknown, assume all).
  std::vector<char> reachable_from(const at::Tensor& loss) const;
  void attach_grad_views();

  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<std::pair<int64_t, int64_t>> segments_;
  comm::Communicator& comm_;
  GradReduceOptions options_;
  int64_t numel_ = 0;  // elements of the parameters, without padding
  at::Tensor flat_params_;
  at::Tensor flat_grads_;
  at::Tensor side_channel_;
  at::Tensor grad_storage_;  // [padded + side_channel]: flat_grads_ and side_channel_ are views
  at::Tensor grad_shard_;    // kReduceScatter: [shard_numel]
  // Stage 2: the staging slots (contiguous_gradients: allocated once, else per bucket) and the
  // bucket each one serves (-1: free).
  std::vector<at::Tensor> staging_;
  std::vector<int> slot_bucket_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_param_;
  // Per parameter in this backward: 0 nothing yet, 1 its gradient came, 2 the loss cannot reach
  // it (counted ready before backward).
  std::vector<char> got_grad_;
  // The hooked gradient accumulators (kept alive) and their hooks, removed on destruction so a
  // model that outlives its engine never calls into a dead reducer.
  struct Hooks {
    std::shared_ptr<torch::autograd::Node> acc;
    uintptr_t post_key;
    const torch::autograd::FunctionPreHook* pre;
  };
  std::vector<Hooks> hooks_;

  mutable std::mutex mu_;
  bool reducing_ = false;
  bool finishing_ = false;  // in finish_backward: the side channel's bucket may go
  bool late_gradient_ = false;
  int64_t kept_gradients_ = 0;
  size_t next_bucket_ = 0;
  std::vector<comm::WorkHandle> works_;  // kAllReduce
  std::deque<InFlight> in_flight_;       // stages 1-2
};

}  // namespace dscpp::engine
