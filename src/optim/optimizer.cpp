// The parts every optimizer shares: argument checks of step(), the fused-or-ATen decision, and
// make_optimizer() from the DeepSpeed config's optimizer section.
#include <ATen/ATen.h>

#include <cmath>
#include <string>

#include "dscpp/error.h"
#include "dscpp/optim.h"
#include "optim/step_util.h"

namespace dscpp::optim {

void Optimizer::check_step_args(const at::Tensor& params, const at::Tensor& grads,
                                const StepContext& ctx, const at::Tensor& any_state) const {
  DSCPP_CHECK(params.defined() && grads.defined(), Error, name(),
              ".step: params and grads must be defined tensors");
  const int64_t off = ctx.offset.value_or(0);
  if (!ctx.state.empty()) {
    DSCPP_CHECK(supports_pieces() && params.numel() == grads.numel(), Error, name(),
                ".step: StepContext::state (the caller's state) needs an optimizer that steps "
                "pieces and grads of params' length");
    for (const at::Tensor& s : ctx.state) {
      DSCPP_CHECK(s.defined() && s.numel() == params.numel() && s.is_contiguous() &&
                      s.device() == params.device() && s.scalar_type() == at::kFloat,
                  Error, name(), ".step: each StepContext::state tensor must be contiguous fp32 [",
                  params.numel(), "] on ", params.device());
    }
  }
  DSCPP_CHECK(!ctx.state.empty() ||
                  (params.numel() == grads.numel() &&
                   (ctx.offset ? supports_pieces() && off >= 0 && off + params.numel() <= numel_
                               : params.numel() == numel_)),
              Error, name(), ".step: params has ", params.numel(), " and grads ", grads.numel(),
              " elements", ctx.offset ? " at offset " + std::to_string(off) : std::string(),
              ", the optimizer was built for ", numel_,
              supports_pieces() ? "" : " and steps only the whole buffer",
              ". HINT: pass the same flat buffer (or ZeRO shard) the optimizer was made for, or "
              "set StepContext::offset for a piece of it");
  DSCPP_CHECK(params.is_contiguous() && grads.is_contiguous(), Error, name(),
              ".step: params and grads must be contiguous flat buffers");
  DSCPP_CHECK(at::isFloatingType(params.scalar_type()) && at::isFloatingType(grads.scalar_type()),
              Error, name(), ".step: params (", params.scalar_type(), ") and grads (",
              grads.scalar_type(), ") must be floating point");
  DSCPP_CHECK(params.device() == grads.device(), Error, name(), ".step: params on ",
              params.device(), " but grads on ", grads.device());
  if (const at::Tensor& out = ctx.bf16_params; out.defined()) {
    DSCPP_CHECK(fuses_bf16(), Error, name(),
                ".step: StepContext::bf16_params is set, but this optimizer does not write it "
                "(fuses_bf16() is false). HINT: cast the updated parameters yourself");
    DSCPP_CHECK(out.scalar_type() == at::kBFloat16 && out.numel() == params.numel() &&
                    out.is_contiguous() && out.device() == params.device(),
                Error, name(), ".step: StepContext::bf16_params must be contiguous bf16 [",
                params.numel(), "] on ", params.device(), ", got ", out.scalar_type(), " ",
                out.sizes(), " on ", out.device());
  }
  if (any_state.defined() && ctx.state.empty()) {
    DSCPP_CHECK(params.device() == any_state.device(), Error, name(), ".step: params on ",
                params.device(), " but the optimizer state on ", any_state.device(),
                ". HINT: make the optimizer with the options (device) of the buffer it updates");
  }
  DSCPP_CHECK(ctx.step >= 1, Error, name(), ".step: ctx.step is ", ctx.step,
              "; it counts applied steps from 1");
  DSCPP_CHECK(std::isfinite(ctx.lr) && ctx.lr >= 0.0, Error, name(), ".step: lr ", ctx.lr,
              " must be finite and >= 0");
  DSCPP_CHECK(std::isfinite(ctx.grad_scale) && ctx.grad_scale > 0.0, Error, name(),
              ".step: grad_scale ", ctx.grad_scale, " must be finite and > 0");
}

std::vector<std::string> Optimizer::state_names() {
  std::vector<std::string> out;
  for (const auto& [name, t] : state()) out.push_back(name);
  return out;
}

at::Tensor Optimizer::state_values(size_t i, int64_t offset, int64_t n) {
  return state().at(i).second.narrow(0, offset, n);
}

void Optimizer::load_state_values(size_t i, int64_t offset, const at::Tensor& values) {
  state().at(i).second.narrow(0, offset, values.numel()).copy_(values);
}

int64_t Optimizer::state_bytes() {
  int64_t bytes = 0;
  for (const auto& [name, t] : state()) bytes += static_cast<int64_t>(t.nbytes());
  return bytes;
}

namespace detail {

std::optional<KernelPath> fused_path(const at::Tensor& params, const at::Tensor& grads,
                                     std::initializer_list<at::Tensor> state, bool bf16_grads) {
  auto cpu_of = [](const at::Tensor& t, at::ScalarType dtype) {
    return t.device().is_cpu() && t.scalar_type() == dtype && t.is_contiguous();
  };
  auto cpu_fp32 = [&](const at::Tensor& t) { return cpu_of(t, at::kFloat); };
  if (!cpu_fp32(params)) return std::nullopt;
  if (!cpu_fp32(grads) && !(bf16_grads && cpu_of(grads, at::kBFloat16))) return std::nullopt;
  for (const at::Tensor& s : state) {
    if (s.defined() && !cpu_fp32(s)) return std::nullopt;
  }
  const KernelPath path = active_kernel_path();
  if (path == KernelPath::kTorch) return std::nullopt;
  return path;
}

at::Tensor unscaled_grads(const at::Tensor& grads, const at::Tensor& like, double grad_scale) {
  at::Tensor g = grads.scalar_type() == like.scalar_type() ? grads : grads.to(like.scalar_type());
  if (grad_scale != 1.0) g = g * (1.0 / grad_scale);
  return g;
}

std::pair<double, double> step_betas(const StepContext& ctx, const std::array<double, 2>& betas) {
  if (ctx.betas_override) return *ctx.betas_override;
  return {betas[0], betas[1]};
}

}  // namespace detail

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, int64_t numel,
                                          at::TensorOptions options,
                                          std::vector<std::pair<int64_t, int64_t>> segments) {
  DSCPP_CHECK(numel >= 0, Error, "make_optimizer: numel ", numel, " < 0");
  if (cfg.type == "Adam") return std::make_unique<Adam>(cfg.adam, numel, options);
  if (cfg.type == "AdamW") return std::make_unique<AdamW>(cfg.adam, numel, options);
  if (cfg.type == "SGD") return std::make_unique<SGD>(cfg.sgd, numel, options);
  if (cfg.type == "Adagrad") return std::make_unique<Adagrad>(cfg.adagrad, numel, options);
  if (cfg.type == "Lamb") {
    return std::make_unique<Lamb>(cfg.lamb, numel, options, std::move(segments));
  }
  if (cfg.type == "Lion") return std::make_unique<Lion>(cfg.lion, numel, options);
  if (cfg.type == "Muon") {
    return std::make_unique<Muon>(cfg.muon, numel, options, std::move(segments));
  }
  DSCPP_CHECK(!cfg.type.empty(), ConfigError,
              "optimizer: the config has no \"optimizer\" section. HINT: add one, e.g. "
              "{\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3}}, or bring your own optimizer");
  DSCPP_FAIL(ConfigError, "optimizer.type: '", cfg.type,
             "' is not an optimizer dscpp implements. HINT: use Adam, AdamW, SGD, Adagrad, "
             "Lamb, Lion or Muon");
}

}  // namespace dscpp::optim
