// GradReducer: the data-parallel gradient path of ZeRO stage 0.
//
// The model's trainable parameters become views into one flat fp32 buffer and their gradients
// views into a second one (so autograd accumulates straight into the buffer the collectives
// and the fused optimizer use; no copies per step). The gradient buffer is cut into buckets of
// about reduce_bucket_size elements, taken from the end of the buffer (the last parameters'
// gradients are ready first in backward). A post-hook on each parameter's gradient
// accumulator counts a bucket down; when a backward must reduce, a bucket whose gradients are
// all ready is all-reduced at once, while backward goes on.
//
// NOTE [bucket order]: buckets are launched strictly in index order on every rank, even if
// a later bucket is ready first, so ranks always issue the same collectives in the same
// order (a parameter unused on one rank only cannot reorder them). Buckets still pending
// when backward returns (unused parameters) are launched then, in order.
//
// NOTE [side channel]: the gradient buffer has `side_channel` extra elements after the last
// parameter. They ride along in the first bucket launched (the one at the end of the buffer)
// and are summed over ranks but never scaled, so the engine gets per-step statistics (the
// window's loss, which ranks saw a non-finite one) without a collective of their own.
//
// Threading: hooks run on the autograd thread(s); the bucket state is guarded by a mutex.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/comm.h"

namespace dscpp::engine {

struct GradReduceOptions {
  int64_t reduce_bucket_size = 500000000;  // elements per bucket (DeepSpeed's unit)
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
};

class GradReducer {
 public:
  // `params`: the trainable parameters, distinct, fp32, contiguous-able, on one device.
  // Replaces each parameter's storage by a view into the flat buffer (values kept).
  // The flat buffers are padded with zeros to a multiple of `pad_multiple` elements (ZeRO: the
  // world size, so every rank's shard is equal).
  GradReducer(std::vector<at::Tensor> params, std::vector<std::string> names,
              comm::Communicator& comm, GradReduceOptions options, int64_t side_channel = 0,
              int64_t pad_multiple = 1);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Call before loss.backward(): whether this backward averages gradients over ranks.
  void prepare_backward(bool reduce);
  // Call after loss.backward(): launches the buckets still pending (in order) and waits for
  // every reduction of this backward. Returns the seconds spent waiting.
  double finish_backward();
  // Averages the accumulated gradients over ranks outside a backward (flush at the end of an
  // epoch), bucket by bucket; blocks until done.
  void reduce_all_now();

  at::Tensor flat_params() const { return flat_params_.narrow(0, 0, numel_); }  // [numel] fp32
  at::Tensor flat_grads() const { return flat_grads_.narrow(0, 0, numel_); }    // [numel] fp32
  // The same buffers with their zero padding: [padded_numel] fp32.
  at::Tensor padded_params() const { return flat_params_; }
  at::Tensor padded_grads() const { return flat_grads_; }
  // [side_channel] fp32: written before a reducing backward, summed over ranks by it.
  at::Tensor side_channel() const { return side_channel_; }
  int64_t numel() const { return numel_; }
  int64_t padded_numel() const { return flat_params_.numel(); }
  const std::vector<at::Tensor>& params() const { return params_; }
  const std::vector<std::string>& names() const { return names_; }
  // [offset, numel) of each parameter in the flat buffers.
  const std::vector<std::pair<int64_t, int64_t>>& segments() const { return segments_; }
  size_t num_buckets() const { return buckets_.size(); }
  void zero_grads();

 private:
  struct Bucket {
    int64_t offset = 0;
    int64_t numel = 0;
    std::vector<int> params;
    int pending = 0;
    bool launched = false;
  };
  void on_grad_ready(int param);
  void launch_in_order_locked();
  void launch(Bucket& b);
  void reattach_grads();

  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<std::pair<int64_t, int64_t>> segments_;
  comm::Communicator& comm_;
  GradReduceOptions options_;
  int64_t numel_ = 0;  // elements of the parameters, without padding
  at::Tensor flat_params_;
  at::Tensor flat_grads_;
  at::Tensor side_channel_;
  at::Tensor grad_storage_;  // [numel + side_channel]: flat_grads_ and side_channel_ are views
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_param_;
  // The hooked gradient accumulators (kept alive) and their hook keys, removed on destruction so
  // a model that outlives its engine never calls into a dead reducer.
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>> hooks_;

  std::mutex mu_;
  bool reducing_ = false;
  size_t next_bucket_ = 0;
  std::vector<comm::WorkHandle> works_;
};

}  // namespace dscpp::engine
