// The fused optimizers: Adam/AdamW, SGD, Adagrad, Lamb and Lion as one kernel each over ONE flat
// contiguous fp32 parameter buffer and its matching flat gradient buffer (the engine keeps every
// parameter as a view into such a buffer; ZeRO runs the same kernel on a rank's shard of it).
// On CPU fp32 tensors a step is one multithreaded pass over memory, vectorised with AVX2+FMA or
// AVX-512 chosen at run time (NOTE [optimizer SIMD dispatch] in src/optim/dispatch.h); other
// devices (CUDA) and dtypes run the same math as ATen ops. The update rules are DeepSpeed's and
// torch.optim's; docs/optim.md writes them out. An optimizer is not thread-safe: one caller steps
// it at a time.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/config.h"

namespace dscpp::optim {

// What changes from step to step; everything else is fixed at construction.
struct StepContext {
  // Learning rate of this step (the LR schedule's get_lr()). >= 0.
  double lr = 0.0;
  // 1-based count of applied steps including this one: bias correction uses beta^step, SGD's
  // momentum buffer starts from the gradient at step 1. A skipped (overflowed) step does not
  // count. >= 1.
  int64_t step = 1;
  // (beta1, beta2) replacing the configured betas for this step (OneCycle momentum cycling).
  // Adam/AdamW/Lamb/Lion use both; SGD takes .first as its momentum; Adagrad ignores it.
  std::optional<std::pair<double, double>> betas_override;
  // The gradients are multiplied by 1/grad_scale inside the kernel (the fp16 loss-scale unscale
  // fused with the step). 1.0: none. > 0.
  double grad_scale = 1.0;
  // Set: params and grads are elements [*offset, *offset + params.numel()) of the buffer the
  // optimizer was built for, so a large buffer can be stepped in pieces (ZeRO under mixed
  // precision casts the gradients to fp32 a piece at a time). Unset (default): the whole buffer.
  // Optimizers whose update needs the whole buffer at once (Lamb) refuse pieces
  // (supports_pieces()).
  std::optional<int64_t> offset;
  // Not empty: this call's optimizer state, one fp32 tensor [params.numel()] per state() entry in
  // that order, held by the caller (offload swaps a sub-group's state in from disk); the
  // optimizer's own state is neither read nor written, and offset is not used. An optimizer
  // built for 0 elements holds no state of its own (what offload builds).
  std::vector<at::Tensor> state;
  // Defined (an optimizer whose fuses_bf16() is true): bf16 mixed precision's parameters, bf16
  // [params.numel()], contiguous, on params' device; the step also writes the updated params
  // into it rounded to bf16 (to nearest even, as at::Tensor::to), in the update's own pass on
  // the CPU, so the caller needs no cast pass of its own. grads may then be bf16 too.
  at::Tensor bf16_params;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // "Adam", "AdamW", "SGD", "Adagrad", "Lamb" or "Lion".
  virtual const char* name() const = 0;

  // One update. params and grads [numel()] (or a piece, see StepContext::offset): contiguous,
  // same device as the state;
  // fp32 (the fused CPU kernel; other floating dtypes take the ATen path; grads also bf16 when
  // fuses_bf16()). Updates params and
  // the state in place; grads are only read. Throws dscpp::Error when the shapes, devices or
  // ctx are wrong (nothing is modified then).
  virtual void step(at::Tensor& params, const at::Tensor& grads, const StepContext& ctx) = 0;

  // The state tensors by name ("exp_avg", "exp_avg_sq", "momentum_buffer", "sum"), each
  // [numel()] and contiguous, in a fixed order. They alias the live state: read them to save a
  // checkpoint, copy_() into them to restore one. SGD without momentum has none.
  virtual std::vector<std::pair<std::string, at::Tensor>> state() = 0;

  // Whether step() takes a piece of the buffer (StepContext::offset); false for Lamb, whose
  // trust ratios need whole parameters.
  virtual bool supports_pieces() const { return true; }

  // Whether step() takes bf16 grads and StepContext::bf16_params (Adam, AdamW): under bf16 mixed
  // precision the cast of the gradients to fp32 and of the updated master weights to bf16 then
  // happen inside the update (NOTE [bf16 in the optimizer pass] in src/optim/kernels_impl.h).
  virtual bool fuses_bf16() const { return false; }

  // The configured learning rate (what the first step runs at without a schedule).
  virtual double lr() const = 0;
  // The configured (beta1, beta2) of the optimizers that have betas (Adam, AdamW, Lamb, Lion);
  // nullopt for SGD and Adagrad. DeepSpeed's OneCycle cycles momentum only when the optimizer
  // has betas (see lr_schedule.h).
  virtual std::optional<std::pair<double, double>> betas() const { return std::nullopt; }

  // Length of the flat buffer this optimizer updates.
  int64_t numel() const { return numel_; }

 protected:
  explicit Optimizer(int64_t numel) : numel_(numel) {}
  // Throws dscpp::Error unless params and grads are [numel_], contiguous and on `device`, and
  // ctx is valid.
  void check_step_args(const at::Tensor& params, const at::Tensor& grads, const StepContext& ctx,
                       const at::Tensor& any_state) const;
  int64_t numel_;
};

// Adam with DeepSpeed's FusedAdam / DeepSpeedCPUAdam semantics. adam_w_mode true (DeepSpeed's
// default): decoupled weight decay exactly like torch.optim.AdamW, p <- p*(1 - lr*wd) - update;
// false: L2, wd*p added to the gradient like torch.optim.Adam. State: exp_avg, exp_avg_sq.
class Adam : public Optimizer {
 public:
  Adam(const AdamParams& params, int64_t numel, at::TensorOptions options);
  const char* name() const override { return "Adam"; }
  void step(at::Tensor& params, const at::Tensor& grads, const StepContext& ctx) override;
  bool fuses_bf16() const override { return true; }
  std::vector<std::pair<std::string, at::Tensor>> state() override;
  double lr() const override { return params_.lr; }
  std::optional<std::pair<double, double>> betas() const override;

 protected:
  AdamParams params_;
  at::Tensor exp_avg_;     // [numel] first moment
  at::Tensor exp_avg_sq_;  // [numel] second moment
};

// Adam with adam_w_mode forced true (DeepSpeed's "AdamW").
class AdamW : public Adam {
 public:
  AdamW(const AdamParams& params, int64_t numel, at::TensorOptions options);
  const char* name() const override { return "AdamW"; }
};

// torch.optim.SGD: momentum, dampening, nesterov, L2 weight decay. State: momentum_buffer
// (only when momentum != 0).
class SGD : public Optimizer {
 public:
  SGD(const SgdParams& params, int64_t numel, at::TensorOptions options);
  const char* name() const override { return "SGD"; }
  void step(at::Tensor& params, const at::Tensor& grads, const StepContext& ctx) override;
  std::vector<std::pair<std::string, at::Tensor>> state() override;
  double lr() const override { return params_.lr; }

 private:
  SgdParams params_;
  at::Tensor momentum_buffer_;  // [numel], undefined when momentum == 0
};

// torch.optim.Adagrad: lr_decay, L2 weight decay, initial_accumulator_value, eps. State: sum.
class Adagrad : public Optimizer {
 public:
  Adagrad(const AdagradParams& params, int64_t numel, at::TensorOptions options);
  const char* name() const override { return "Adagrad"; }
  void step(at::Tensor& params, const at::Tensor& grads, const StepContext& ctx) override;
  std::vector<std::pair<std::string, at::Tensor>> state() override;
  double lr() const override { return params_.lr; }

 private:
  AdagradParams params_;
  at::Tensor sum_;  // [numel] running sum of squared gradients
};

// DeepSpeed's FusedLamb: Adam moments (not bias-corrected inside the update), update =
// m/(sqrt(v)+eps) + wd*p, trust ratio ||p||/||update|| per parameter segment clamped to
// [min_coeff, max_coeff] (1 when either norm is 0), p <- p - step_size*ratio*update with
// step_size = lr*sqrt(1-beta2^t)/(1-beta1^t). Two passes over memory (norms, then update).
// segments: [offset, length) of each parameter in the flat buffer, sorted and disjoint; elements
// no segment covers form segments of their own; empty: the whole buffer is one segment (what
// DeepSpeed's FusedLamb sees under fp16 or ZeRO, where the flat group is one tensor).
// max_grad_norm > 0 clips by the norm of this buffer's gradients (DeepSpeed's rule:
// clip = (norm + 1e-6) / max_grad_norm, applied when > 1). State: exp_avg, exp_avg_sq.
class Lamb : public Optimizer {
 public:
  Lamb(const LambParams& params, int64_t numel, at::TensorOptions options,
       std::vector<std::pair<int64_t, int64_t>> segments = {});
  const char* name() const override { return "Lamb"; }
  bool supports_pieces() const override { return false; }
  void step(at::Tensor& params, const at::Tensor& grads, const StepContext& ctx) override;
  std::vector<std::pair<std::string, at::Tensor>> state() override;
  double lr() const override { return params_.lr; }
  std::optional<std::pair<double, double>> betas() const override;
  // The trust ratio of each segment in the last step (DeepSpeed's get_lamb_coeffs()).
  const std::vector<double>& lamb_coeffs() const { return lamb_coeffs_; }

 private:
  LambParams params_;
  std::vector<std::pair<int64_t, int64_t>> segments_;  // covering [0, numel), sorted
  at::Tensor exp_avg_;                                 // [numel]
  at::Tensor exp_avg_sq_;                              // [numel]
  std::vector<double> lamb_coeffs_;                    // [segments]
};

// Lion (Chen et al. 2023; DeepSpeed's FusedLion): c = b1*m + (1-b1)*g;
// p <- p*(1 - lr*wd) - lr*sign(c); m <- b2*m + (1-b2)*g. State: exp_avg.
class Lion : public Optimizer {
 public:
  Lion(const LionParams& params, int64_t numel, at::TensorOptions options);
  const char* name() const override { return "Lion"; }
  void step(at::Tensor& params, const at::Tensor& grads, const StepContext& ctx) override;
  std::vector<std::pair<std::string, at::Tensor>> state() override;
  double lr() const override { return params_.lr; }
  std::optional<std::pair<double, double>> betas() const override;

 private:
  LionParams params_;
  at::Tensor exp_avg_;  // [numel]
};

// The optimizer of the DeepSpeed config's "optimizer" section (cfg.type, already normalised to
// its canonical spelling by Config). numel: length of the flat buffer this rank updates (its
// ZeRO shard, or everything); options: device and dtype of the state (fp32); segments: see
// Lamb (the others ignore it). Throws ConfigError when cfg.type is empty or unknown.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, int64_t numel,
                                          at::TensorOptions options,
                                          std::vector<std::pair<int64_t, int64_t>> segments = {});

}  // namespace dscpp::optim
