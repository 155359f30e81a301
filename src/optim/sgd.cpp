// SGD exactly like torch.optim.SGD: L2 weight decay, momentum buffer started from the first
// gradient, dampening, nesterov; fused on CPU (kernels_impl.h: sgd_range), ATen ops elsewhere.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "dscpp/error.h"
#include "dscpp/optim.h"
#include "optim/step_util.h"

namespace dscpp::optim {

SGD::SGD(const SgdParams& params, int64_t numel, at::TensorOptions options)
    : Optimizer(numel), params_(params) {
  DSCPP_CHECK(!params.nesterov || (params.momentum > 0.0 && params.dampening == 0.0), ConfigError,
              "optimizer.params.nesterov: needs momentum > 0 and dampening 0 (torch.optim.SGD). "
              "HINT: set momentum, or nesterov false");
  if (params.momentum != 0.0) momentum_buffer_ = at::zeros({numel}, options);
}

std::vector<std::pair<std::string, at::Tensor>> SGD::state() {
  if (!momentum_buffer_.defined()) return {};
  return {{"momentum_buffer", momentum_buffer_}};
}

void SGD::step(at::Tensor& params, const at::Tensor& grads, const StepContext& ctx) {
  check_step_args(params, grads, ctx, momentum_buffer_);
  // This call's range of the state (StepContext::offset).
  at::Tensor momentum_buffer = detail::state_of(ctx, 0, momentum_buffer_, params);
  const double lr = ctx.lr, wd = params_.weight_decay, dampening = params_.dampening;
  // OneCycle-style override of the momentum (only with a momentum buffer).
  const double momentum = ctx.betas_override && momentum_buffer.defined()
                              ? ctx.betas_override->first
                              : params_.momentum;
  // torch.optim.SGD: the buffer is the first step's d, later momentum*buf + (1-dampening)*d.
  const bool first = ctx.step == 1;

  if (const auto path = detail::fused_path(params, grads, {momentum_buffer})) {
    kernels::SgdArgs a{};
    a.p = params.data_ptr<float>();
    a.g = grads.data_ptr<float>();
    a.buf = momentum_buffer.defined() ? momentum_buffer.data_ptr<float>() : nullptr;
    a.lr = static_cast<float>(lr);
    a.wd = static_cast<float>(wd);
    a.inv_scale = static_cast<float>(1.0 / ctx.grad_scale);
    a.buf_keep = first ? 0.0f : static_cast<float>(momentum);
    a.d_keep = first ? 1.0f : static_cast<float>(1.0 - dampening);
    a.nest_d = params_.nesterov ? 1.0f : 0.0f;
    a.nest_buf = params_.nesterov ? static_cast<float>(momentum) : 1.0f;
    const kernels::SgdFn fn = kernel_table(*path).sgd;
    parallel_elements(params.numel(), [&](int64_t b, int64_t e) { fn(a, b, e); });
    return;
  }

  const c10::AutoGradMode no_grad(false);  // in-place updates of leaf parameters
  at::Tensor d = detail::unscaled_grads(grads, params, ctx.grad_scale);
  if (wd != 0.0) d = d.add(params, wd);
  if (momentum_buffer.defined()) {
    if (first) {
      momentum_buffer.copy_(d);
    } else {
      momentum_buffer.mul_(momentum).add_(d, 1.0 - dampening);
    }
    d = params_.nesterov ? d.add(momentum_buffer, momentum) : momentum_buffer;
  }
  params.add_(d, -lr);
}

}  // namespace dscpp::optim
