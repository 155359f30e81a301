// Implements FullGradBuffer (grad_buffer.h, NOTE [first gradient is written]).
#include "zero/grad_buffer.h"

#include <ATen/ATen.h>

namespace dscpp::zero {

FullGradBuffer::FullGradBuffer(const std::vector<at::Tensor>& params,
                               const std::vector<std::pair<int64_t, int64_t>>& segments,
                               int64_t padded, int64_t side, const at::TensorOptions& options)
    : params_(params), stale_(params.size(), 1) {
  storage_ = at::zeros({side + padded}, options);
  detached_ = !params_.empty() && params_[0].scalar_type() != storage_.scalar_type();
  side_ = storage_.narrow(0, 0, side);
  grads_ = storage_.narrow(0, side, padded);
  for (size_t i = 0; i < params_.size(); ++i) {
    auto [off, n] = segments[i];
    views_.push_back(grads_.narrow(0, off, n).view(params_[i].sizes()));
  }
  attach_views();
}

void FullGradBuffer::attach_views() {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& g = params_[i].grad();
    if (g.defined() && g.data_ptr() == views_[i].data_ptr()) continue;
    if (g.defined()) {
      views_[i].copy_(g);
      stale_[i] = 0;
      params_[i].mutable_grad() = detached_ ? at::Tensor() : views_[i];
    } else if (!detached_) {
      stale_[i] = 1;
    }
  }
}

void FullGradBuffer::zero() {
  for (size_t i = 0; i < params_.size(); ++i) {
    stale_[i] = 1;
    params_[i].mutable_grad() = at::Tensor();
  }
}

bool FullGradBuffer::take(size_t i, const at::Tensor& grad) {
  at::NoGradGuard no_grad;
  if (!stale_[i]) {
    if (!detached_) return false;  // autograd adds it into the view
    views_[i].add_(grad);          // NOTE [accumulation dtype]
    return true;
  }
  views_[i].copy_(grad);
  stale_[i] = 0;
  if (!detached_) params_[i].mutable_grad() = views_[i];
  return true;
}

void FullGradBuffer::settle(size_t i) {
  if (!stale_[i]) return;
  views_[i].zero_();
  stale_[i] = 0;
  if (!detached_) params_[i].mutable_grad() = views_[i];
}

}  // namespace dscpp::zero
