// Adam and AdamW: DeepSpeed's FusedAdam / DeepSpeedCPUAdam update, one fused pass over
// p, g, exp_avg, exp_avg_sq on CPU (kernels_impl.h: adam_range) or ATen ops elsewhere.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>

#include "dscpp/error.h"
#include "dscpp/optim.h"
#include "optim/step_util.h"

namespace dscpp::optim {

Adam::Adam(const AdamParams& params, int64_t numel, at::TensorOptions options)
    : Optimizer(numel), params_(params) {
  DSCPP_CHECK(!params.amsgrad, ConfigError,
              "optimizer.params.amsgrad: true is not supported (DeepSpeed's fused Adam rejects it "
              "too). HINT: remove it");
  exp_avg_ = at::zeros({numel}, options);
  exp_avg_sq_ = at::zeros({numel}, options);
}

AdamW::AdamW(const AdamParams& params, int64_t numel, at::TensorOptions options)
    : Adam(params, numel, options) {
  params_.adam_w_mode = true;
}

std::optional<std::pair<double, double>> Adam::betas() const {
  return std::make_pair(params_.betas[0], params_.betas[1]);
}

std::vector<std::pair<std::string, at::Tensor>> Adam::state() {
  return {{"exp_avg", exp_avg_}, {"exp_avg_sq", exp_avg_sq_}};
}

void Adam::step(at::Tensor& params, const at::Tensor& grads, const StepContext& ctx) {
  check_step_args(params, grads, ctx, exp_avg_);
  // This call's range of the state (StepContext::offset).
  at::Tensor exp_avg = detail::state_of(ctx, 0, exp_avg_, params);
  at::Tensor exp_avg_sq = detail::state_of(ctx, 1, exp_avg_sq_, params);
  const auto [beta1, beta2] = detail::step_betas(ctx, params_.betas);
  const double lr = ctx.lr, wd = params_.weight_decay, eps = params_.eps;
  // Bias corrections: step_size = lr / (1 - beta1^t), denominators scaled by 1/sqrt(1-beta2^t).
  double step_size = lr, inv_sqrt_bc2 = 1.0;
  if (params_.bias_correction) {
    step_size = lr / (1.0 - std::pow(beta1, static_cast<double>(ctx.step)));
    inv_sqrt_bc2 = 1.0 / std::sqrt(1.0 - std::pow(beta2, static_cast<double>(ctx.step)));
  }
  const bool adamw = params_.adam_w_mode;

  if (const auto path =
          detail::fused_path(params, grads, {exp_avg, exp_avg_sq}, /*bf16_grads=*/true)) {
    kernels::AdamArgs a{};
    a.p = params.data_ptr<float>();
    if (grads.scalar_type() == at::kBFloat16) {
      a.g_bf16 = reinterpret_cast<const uint16_t*>(grads.const_data_ptr());
    } else {
      a.g = grads.data_ptr<float>();
    }
    if (ctx.bf16_params.defined())
      a.p_bf16 = reinterpret_cast<uint16_t*>(ctx.bf16_params.data_ptr());
    a.m = exp_avg.data_ptr<float>();
    a.v = exp_avg_sq.data_ptr<float>();
    a.beta1 = static_cast<float>(beta1);
    a.one_minus_beta1 = static_cast<float>(1.0 - beta1);
    a.beta2 = static_cast<float>(beta2);
    a.one_minus_beta2 = static_cast<float>(1.0 - beta2);
    a.eps = static_cast<float>(eps);
    a.step_size = static_cast<float>(step_size);
    a.inv_sqrt_bc2 = static_cast<float>(inv_sqrt_bc2);
    a.l2 = adamw ? 0.0f : static_cast<float>(wd);
    a.decay = adamw ? static_cast<float>(1.0 - lr * wd) : 1.0f;
    a.inv_scale = static_cast<float>(1.0 / ctx.grad_scale);
    const kernels::AdamFn fn = kernel_table(*path).adam;
    parallel_elements(params.numel(), [&](int64_t b, int64_t e) { fn(a, b, e); });
    return;
  }

  // ATen path: the same update as torch.optim.Adam / AdamW (single-tensor implementation).
  const c10::AutoGradMode no_grad(false);  // in-place updates of leaf parameters
  at::Tensor g = detail::unscaled_grads(grads, params, ctx.grad_scale);
  if (!adamw && wd != 0.0) g = g.add(params, wd);
  exp_avg.mul_(beta1).add_(g, 1.0 - beta1);
  exp_avg_sq.mul_(beta2).addcmul_(g, g, 1.0 - beta2);
  at::Tensor denom = exp_avg_sq.sqrt().mul_(inv_sqrt_bc2).add_(eps);
  if (adamw && wd != 0.0) params.mul_(1.0 - lr * wd);
  params.addcdiv_(exp_avg, denom, -step_size);
  if (ctx.bf16_params.defined()) ctx.bf16_params.copy_(params);
}

}  // namespace dscpp::optim
