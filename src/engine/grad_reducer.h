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
// Mode kReduceScatter (stage 2): there is no full gradient buffer. Autograd allocates each
// parameter's gradient; when a bucket is complete its gradients are copied into a staging
// buffer, released, and the bucket is reduce-scattered (every rank receives the part of the
// bucket that falls in its shard) and added into this rank's gradient shard, which accumulates
// over the micro-steps. Every backward reduces.
//
// Stages 1-2 (DeepSpeed's meaning): `overlap_comm` lets reductions run while backward goes on
// (stage 2: at most two buckets in flight); without it each reduction finishes inside the hook
// that launched it. `contiguous_gradients` (stage 2) keeps the staging buffers allocated for the
// whole run (else each is allocated per bucket and freed once reduced); `reduce_scatter` false
// all-reduces the bucket and keeps this rank's part.
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

struct GradReduceOptions {
  ReduceMode mode = ReduceMode::kAllReduce;
  at::ScalarType dtype = at::kFloat;       // of the parameters and gradients in training
  int64_t reduce_bucket_size = 500000000;  // elements per bucket (DeepSpeed's unit)
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
  };
  // A launched reduce-scatter of one bucket: where its result lands.
  struct InFlight {
    comm::WorkHandle work;
    at::Tensor staging;  // keeps the buffer alive until the reduction is done
    at::Tensor result;   // this rank's part of the bucket (a view of `staging`)
    int64_t shard_pos = 0;  // stage 2: where `result` is added in grad_shard_
    int slot = -1;          // staging slot to release (contiguous_gradients), or -1
  };
  // Marks `param` as having its gradient for this backward; launches what is ready.
  void mark_ready_locked(int param);
  void on_grad_ready(int param);
  void launch_in_order_locked();
  void launch_all_reduce(Bucket& b);
  void launch_reduce_scatter(Bucket& b);
  // Waits for the oldest in-flight reduction and scales its part (stage 2: adds it into the
  // shard). The entry and its staging slot are released even when the wait throws.
  void retire_oldest_locked();
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
  std::vector<at::Tensor> staging_;  // contiguous_gradients: persistent staging buffers
  std::vector<bool> staging_busy_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_param_;
  // Per parameter in this backward: 0 nothing yet, 1 its gradient came, 2 the loss cannot reach
  // it (counted ready before backward).
  std::vector<char> got_grad_;
  // The hooked gradient accumulators (kept alive) and their hook keys, removed on destruction so
  // a model that outlives its engine never calls into a dead reducer.
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>> hooks_;

  mutable std::mutex mu_;
  bool reducing_ = false;
  bool finishing_ = false;  // in finish_backward: the side channel's bucket may go
  bool late_gradient_ = false;
  size_t next_bucket_ = 0;
  std::vector<comm::WorkHandle> works_;  // kAllReduce
  std::deque<InFlight> in_flight_;       // stages 1-2
};

}  // namespace dscpp::engine
