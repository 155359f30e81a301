// Helpers shared by the optimizers' step(): choosing between the fused CPU kernel and the ATen
// path, and the per-step scalars every optimizer derives from StepContext.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <initializer_list>
#include <optional>
#include <utility>

#include "dscpp/optim.h"
#include "optim/dispatch.h"

namespace dscpp::optim::detail {

// The SIMD path when params, grads and every defined state tensor are contiguous CPU fp32 (grads
// also bf16 when `bf16_grads`: a kernel that widens them itself) and the active path is not
// kTorch; nullopt: run the ATen path.
std::optional<KernelPath> fused_path(const at::Tensor& params, const at::Tensor& grads,
                                     std::initializer_list<at::Tensor> state,
                                     bool bf16_grads = false);

// grads * (1/grad_scale) in the dtype of `like` (grads itself when neither scaling nor casting
// is needed; never modified in place).
at::Tensor unscaled_grads(const at::Tensor& grads, const at::Tensor& like, double grad_scale);

// This step's elements of state tensor i (`own`, the optimizer's): the caller's
// StepContext::state[i] when it passes the state, else own's [offset, offset + params.numel()),
// offset 0 for the whole buffer (undefined stays undefined).
inline at::Tensor state_of(const StepContext& ctx, size_t i, const at::Tensor& own,
                           const at::Tensor& params) {
  if (!ctx.state.empty()) return ctx.state.at(i);
  return own.defined() ? own.narrow(0, ctx.offset.value_or(0), params.numel()) : own;
}

// ctx.betas_override, else the configured betas.
std::pair<double, double> step_betas(const StepContext& ctx, const std::array<double, 2>& betas);

}  // namespace dscpp::optim::detail
