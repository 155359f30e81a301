// Adagrad exactly like torch.optim.Adagrad: lr decayed as lr / (1 + (t-1)*lr_decay), L2 weight
// decay, sum of squares started at initial_accumulator_value; fused on CPU
// (kernels_impl.h: adagrad_range), ATen ops elsewhere.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "dscpp/error.h"
#include "dscpp/optim.h"
#include "optim/step_util.h"

namespace dscpp::optim {

Adagrad::Adagrad(const AdagradParams& params, int64_t numel, at::TensorOptions options)
    : Optimizer(numel), params_(params) {
  sum_ = at::full({numel}, params.initial_accumulator_value, options);
}

std::vector<std::pair<std::string, at::Tensor>> Adagrad::state() { return {{"sum", sum_}}; }

void Adagrad::step(at::Tensor& params, const at::Tensor& grads, const StepContext& ctx) {
  check_step_args(params, grads, ctx, sum_);
  // This call's range of the state (StepContext::offset).
  at::Tensor sum = detail::state_of(ctx, 0, sum_, params);
  const double wd = params_.weight_decay, eps = params_.eps;
  const double clr = ctx.lr / (1.0 + static_cast<double>(ctx.step - 1) * params_.lr_decay);

  if (const auto path = detail::fused_path(params, grads, {sum})) {
    kernels::AdagradArgs a{};
    a.p = params.data_ptr<float>();
    a.g = grads.data_ptr<float>();
    a.sum = sum.data_ptr<float>();
    a.clr = static_cast<float>(clr);
    a.wd = static_cast<float>(wd);
    a.eps = static_cast<float>(eps);
    a.inv_scale = static_cast<float>(1.0 / ctx.grad_scale);
    const kernels::AdagradFn fn = kernel_table(*path).adagrad;
    parallel_elements(params.numel(), [&](int64_t b, int64_t e) { fn(a, b, e); });
    return;
  }

  const c10::AutoGradMode no_grad(false);  // in-place updates of leaf parameters
  at::Tensor d = detail::unscaled_grads(grads, params, ctx.grad_scale);
  if (wd != 0.0) d = d.add(params, wd);
  sum.addcmul_(d, d, 1.0);
  params.addcdiv_(d, sum.sqrt().add_(eps), -clr);
}

}  // namespace dscpp::optim
