// AllReduceReducer: stage 0's gradient path (data parallelism). The gradients accumulate over the
// micro-steps in a full gradient buffer (grad_buffer.h); during a reducing backward (the
// accumulation boundary) each complete bucket of it is all-reduced, overlapped with the rest of
// backward, and the mean over ranks is applied once every bucket is in.
//
// NOTE [side channel]: the gradient buffer has `side_channel` extra elements before the first
// parameter. They ride along in the last bucket (the one at the start of the buffer) and are
// summed over ranks but never scaled, so the engine gets per-step statistics (the window's loss,
// which ranks saw a non-finite loss or a failed backward) without a collective of their own.
// That bucket is launched only by finish_backward(), never from a hook, so the engine can still
// rewrite the statistics when a backward fails.
#pragma once

#include "zero/grad_buffer.h"
#include "zero/reducer.h"

namespace dscpp::zero {

class AllReduceReducer final : public GradReducer {
 public:
  // `params`: views into a flat buffer of `padded` elements at `segments` (partition.h).
  // `side_channel`: extra fp32 elements summed with the last bucket (fp32 training only).
  AllReduceReducer(std::vector<at::Tensor> params, std::vector<std::string> names,
                   std::vector<std::pair<int64_t, int64_t>> segments, int64_t padded,
                   comm::Communicator& comm, ReduceOptions options, int64_t side_channel = 0);
  ~AllReduceReducer() override;

  // Averages the accumulated gradients over ranks outside a backward (an epoch's flush, or after
  // no_sync), bucket by bucket; blocks until done.
  void reduce_all_now();
  at::Tensor grads() const { return buffer_.grads(); }  // [padded]
  // [side_channel] fp32: written before a reducing backward, summed over ranks by it.
  at::Tensor side_channel() const { return buffer_.side(); }
  int64_t grad_bytes() const override { return buffer_.bytes(); }
  void zero_grads() override { buffer_.zero(); }

 private:
  void before_backward() override { buffer_.attach_views(); }
  bool take_gradient_locked(int param, const at::Tensor& grad) override {
    return buffer_.take(param, grad);
  }
  bool may_launch_locked(const Bucket& b) const override;
  void launch_locked(Bucket& b) override;
  void after_finish() override;

  int64_t numel_;  // of the parameters, without padding
  FullGradBuffer buffer_;
};

}  // namespace dscpp::zero
