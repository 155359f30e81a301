// Implements FullGradBuffer (grad_buffer.h).
#include "zero/grad_buffer.h"

#include <ATen/ATen.h>

namespace dscpp::zero {

FullGradBuffer::FullGradBuffer(const std::vector<at::Tensor>& params,
                               const std::vector<std::pair<int64_t, int64_t>>& segments,
                               int64_t padded, int64_t side, const at::TensorOptions& options)
    : params_(params), segments_(segments) {
  storage_ = at::zeros({side + padded}, options);
  side_ = storage_.narrow(0, 0, side);
  grads_ = storage_.narrow(0, side, padded);
  attach_views();
}

void FullGradBuffer::attach_views() {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto [off, n] = segments_[i];
    auto view = grads_.narrow(0, off, n);
    const at::Tensor& g = params_[i].grad();
    if (g.defined() && g.data_ptr() == view.data_ptr()) continue;
    if (g.defined())
      view.copy_(g.reshape({-1}));
    else
      view.zero_();
    params_[i].mutable_grad() = view.view(params_[i].sizes());
  }
}

}  // namespace dscpp::zero
