// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"; DeepSpeed's FusedLion
// and CPU Lion): sign of the interpolated momentum, decoupled weight decay; fused on CPU
// (kernels_impl.h: lion_range), ATen ops elsewhere.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "dscpp/error.h"
#include "dscpp/optim.h"
#include "optim/step_util.h"

namespace dscpp::optim {

Lion::Lion(const LionParams& params, int64_t numel, at::TensorOptions options)
    : Optimizer(numel), params_(params) {
  exp_avg_ = at::zeros({numel}, options);
}

std::optional<std::pair<double, double>> Lion::betas() const {
  return std::make_pair(params_.betas[0], params_.betas[1]);
}

std::vector<std::pair<std::string, at::Tensor>> Lion::state() { return {{"exp_avg", exp_avg_}}; }

void Lion::step(at::Tensor& params, const at::Tensor& grads, const StepContext& ctx) {
  check_step_args(params, grads, ctx, exp_avg_);
  // This call's range of the state (StepContext::offset).
  at::Tensor exp_avg = detail::state_of(ctx, 0, exp_avg_, params);
  const auto [beta1, beta2] = detail::step_betas(ctx, params_.betas);
  const double lr = ctx.lr, wd = params_.weight_decay;

  if (const auto path = detail::fused_path(params, grads, {exp_avg})) {
    kernels::LionArgs a{};
    a.p = params.data_ptr<float>();
    a.g = grads.data_ptr<float>();
    a.m = exp_avg.data_ptr<float>();
    a.lr = static_cast<float>(lr);
    a.decay = static_cast<float>(1.0 - lr * wd);
    a.beta1 = static_cast<float>(beta1);
    a.one_minus_beta1 = static_cast<float>(1.0 - beta1);
    a.beta2 = static_cast<float>(beta2);
    a.one_minus_beta2 = static_cast<float>(1.0 - beta2);
    a.inv_scale = static_cast<float>(1.0 / ctx.grad_scale);
    const kernels::LionFn fn = kernel_table(*path).lion;
    parallel_elements(params.numel(), [&](int64_t b, int64_t e) { fn(a, b, e); });
    return;
  }

  const c10::AutoGradMode no_grad(false);  // in-place updates of leaf parameters
  const at::Tensor g = detail::unscaled_grads(grads, params, ctx.grad_scale);
  at::Tensor c = exp_avg.mul(beta1).add_(g, 1.0 - beta1);
  if (wd != 0.0) params.mul_(1.0 - lr * wd);
  params.add_(c.sign_(), -lr);
  exp_avg.mul_(beta2).add_(g, 1.0 - beta2);
}

}  // namespace dscpp::optim
