// FullGradBuffer: the gradient buffer of stages 0 and 1, where every parameter's gradient lives
// between steps. Each parameter's .grad is a view into it, so autograd accumulates straight into
// the buffer the collectives and the optimizer use, over the micro-steps.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace dscpp::zero {

class FullGradBuffer {
 public:
  // [side | gradients (padded) ]: `side` extra elements before the first parameter (NOTE [side
  // channel] in all_reduce.h). Zeroed; the parameters' .grad become views.
  FullGradBuffer(const std::vector<at::Tensor>& params,
                 const std::vector<std::pair<int64_t, int64_t>>& segments, int64_t padded,
                 int64_t side, const at::TensorOptions& options);
  // Puts the views back where a user's model->zero_grad() (set_to_none in libtorch 2.x) or
  // optimizer replaced a .grad, keeping its values.
  void attach_views();
  at::Tensor grads() const { return grads_; }      // [padded]
  at::Tensor side() const { return side_; }        // [side]
  at::Tensor storage() const { return storage_; }  // [side + padded]
  void zero() { storage_.zero_(); }
  int64_t bytes() const { return static_cast<int64_t>(storage_.nbytes()); }

 private:
  std::vector<at::Tensor> params_;
  std::vector<std::pair<int64_t, int64_t>> segments_;
  at::Tensor storage_, side_, grads_;
};

}  // namespace dscpp::zero
