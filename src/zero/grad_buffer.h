// FullGradBuffer: the gradient buffer of stages 0 and 1 (and of stage 3's resident group), where
// every parameter's gradient lives between steps. A parameter's .grad is a view into it, so
// autograd accumulates straight into the buffer the collectives and the optimizer use, over the
// micro-steps.
//
// NOTE [first gradient is written]: a new window does not zero the buffer. Each parameter's view
// is stale (its .grad undefined, as after PyTorch's zero_grad()) until its first gradient, which
// the reducer's pre-hook copies into the view (take) instead of letting autograd add it to
// zeros: one pass over the gradient instead of a memset, a read and a write. Later gradients of
// the window accumulate into the view as before. A parameter still stale when its bucket is
// reduced (no gradient in the window) gets zeros then (settle).
//
// NOTE [accumulation dtype]: a buffer in a dtype other than the parameters' (stage 1, bf16
// training with data_types.grad_accum_dtype "fp32": DeepSpeed's BF16 optimizer) cannot be their
// .grad. Every gradient autograd brings is then taken in (the first copied, the later ones added,
// each rounded once into fp32), .grad stays undefined, and view() is where a parameter's
// gradient is. DeepSpeed adds each micro-step's bf16 gradient into its fp32 buffer after
// backward (at once with bf16.immediate_grad_update). Autograd hands a parameter one gradient
// per backward (a tied weight's uses are summed, in bf16, before its accumulator runs), so the
// sums are the same either way.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace dscpp::zero {

class FullGradBuffer {
 public:
  // [side | gradients (padded) ]: `side` extra elements before the first parameter (NOTE [side
  // channel] in all_reduce.h). Zeroed; a parameter's .grad defined already is copied in, the
  // others are stale.
  FullGradBuffer(const std::vector<at::Tensor>& params,
                 const std::vector<std::pair<int64_t, int64_t>>& segments, int64_t padded,
                 int64_t side, const at::TensorOptions& options);
  // Before a backward: a .grad that is not its view any more is taken in (a gradient the
  // program put there: copied; undefined, after a user's model->zero_grad() with set_to_none:
  // stale again, i.e. zeros).
  void attach_views();
  // A new window: every view stale, every .grad undefined (no memset).
  void zero();
  // Parameter i's first gradient of the window, copied into its view (now its .grad); false
  // when it has one already (autograd accumulates this one into the view).
  bool take(size_t i, const at::Tensor& grad);
  // Parameter i is reduced now: a stale view becomes zeros (and its .grad).
  void settle(size_t i);
  // Parameter i's gradient in the buffer, in its shape (undefined while stale).
  at::Tensor view(size_t i) const { return stale_[i] ? at::Tensor() : views_[i]; }
  at::Tensor grads() const { return grads_; }      // [padded]
  at::Tensor side() const { return side_; }        // [side]
  at::Tensor storage() const { return storage_; }  // [side + padded]
  int64_t bytes() const { return static_cast<int64_t>(storage_.nbytes()); }

 private:
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> views_;  // each parameter's gradient in the buffer, in its shape
  std::vector<char> stale_;
  bool detached_ = false;  // NOTE [accumulation dtype]: the views are never a .grad
  at::Tensor storage_, side_, grads_;
};

}  // namespace dscpp::zero
