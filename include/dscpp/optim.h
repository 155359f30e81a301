// The fused optimizers: Adam/AdamW, SGD, Adagrad, Lamb, Lion and Muon, each over ONE flat
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
#include <functional>
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
  // Muon: the learning rate of its Adam half this step (its own LR schedule, as DeepSpeed
  // schedules each param group from its own lr). Unset: lr * adam_lr() / lr().
  std::optional<double> adam_lr;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // "Adam", "AdamW", "SGD", "Adagrad", "Lamb", "Lion" or "Muon".
  virtual const char* name() const = 0;

  // One update. params and grads [numel()] (or a piece, see StepContext::offset): contiguous,
  // same device as the state;
  // fp32 (the fused CPU kernel; other floating dtypes take the ATen path; grads also bf16 when
  // fuses_bf16()). Updates params and
  // the state in place; grads are only read. Throws dscpp::Error when the shapes, devices or
  // ctx are wrong (nothing is modified then).
  virtual void step(at::Tensor& params, const at::Tensor& grads, const StepContext& ctx) = 0;

  // The state tensors held for every element, by name ("exp_avg", "exp_avg_sq",
  // "momentum_buffer", "sum"), each [numel()] and contiguous, in a fixed order. They alias the
  // live state: copy_() into them to restore one. SGD without momentum has none. Muon holds its
  // exp_avg_sq for part of the buffer only: it is in state_names() but not here.
  virtual std::vector<std::pair<std::string, at::Tensor>> state() = 0;

  // Every state's name, in the order a checkpoint records them (state()'s, and Muon's
  // exp_avg_sq last).
  virtual std::vector<std::string> state_names();
  // Elements [offset, offset + n) of state `i` (of state_names()) as a [n] fp32 tensor: a view
  // of the live state where it is held for every element, else a new tensor (zero where the
  // state holds nothing). What a checkpoint saves.
  virtual at::Tensor state_values(size_t i, int64_t offset, int64_t n);
  // Sets those elements from `values` [n] (a checkpoint's load); elements the state does not
  // hold must be zero in `values` (Error otherwise: the saved state is not this optimizer's).
  virtual void load_state_values(size_t i, int64_t offset, const at::Tensor& values);
  // Whether state_values(i, ...) is a view of the live state (a background checkpoint then copies
  // it before the next step changes it) rather than a copy.
  virtual bool state_values_are_views(size_t /*i*/) const { return true; }
  // Bytes the state holds.
  virtual int64_t state_bytes();

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

// How Newton-Schulz orthogonalises (MuonParams::ns_method).
enum class NsMethod { gram, standard };
NsMethod parse_ns_method(const std::string& name);  // "gram" or "standard"

// DeepSpeed's Muon direction for one matrix `m` [rows, cols]: five steps of the quintic
// Newton-Schulz iteration (3.4445, -4.7750, 2.0315) on m scaled to Frobenius norm <= 1 (taken
// wide, transposed back), times sqrt(rows / cols) when rows > cols. NsMethod::gram iterates on
// the Gram matrix X X^T of the wide matrix instead, restarting at step 2, as DeepSpeed 0.19's
// default does (the same result within rounding, fewer flops when cols >> rows). Computed in
// fp32 on the CPU; on CUDA in DeepSpeed's dtypes (gram fp16, standard bf16). Returns fp32.
at::Tensor muon_orthogonalize(const at::Tensor& m, NsMethod method);

// Muon (DeepSpeed 0.17.6+'s MuonWithAuxAdam) over a flat buffer. The elements in
// `matrix_ranges` (the weight matrices, or the pieces of them this rank updates) take Muon's
// update; every other element Adam's (DeepSpeed's FusedAdam: bias correction, MuonParams' betas,
// eps, weight_decay and adam_w_mode). Muon's update needs each whole matrix, which under ZeRO no
// rank holds alone, so a step is three calls (the engine's zero::MuonMatrices makes the first
// two, gathering each matrix on the rank that orthogonalises it):
//   fold_momentum  each matrix piece's gradient into its momentum, m <- b*m + (1-b)*g, giving
//                  the iteration's input u = (1-b)*g + b*m (Nesterov, as DeepSpeed)
//   set_update     each piece's orthogonalised update U (muon_orthogonalize of the whole u)
//   step           p <- p*(1 - lr*wd) - lr*U on matrix elements, Adam on the rest; any piece
// State: exp_avg [numel] (Muon's momentum on matrix elements, Adam's first moment elsewhere) and
// exp_avg_sq, Adam's second moment, held for the Adam elements only (4 bytes per matrix element
// fewer than Adam: state() has exp_avg alone; a checkpoint reads exp_avg_sq through
// state_values(), zero on matrix elements, so it reshards as any optimizer's state). No betas():
// DeepSpeed's OneCycle does not cycle momentum for Muon. With `options` in bf16
// (bf16.bf16_optimizer_states) both states are held in bf16: each piece is widened, updated in
// fp32 and rounded back once per step, as the engine's store does for the other optimizers.
class Muon : public Optimizer {
 public:
  // matrix_ranges: [offset, length) of the matrix elements of the buffer, disjoint. options: the
  // states' device and dtype (fp32, or bf16).
  Muon(const MuonParams& params, int64_t numel, at::TensorOptions options,
       std::vector<std::pair<int64_t, int64_t>> matrix_ranges);
  const char* name() const override { return "Muon"; }
  void step(at::Tensor& params, const at::Tensor& grads, const StepContext& ctx) override;
  std::vector<std::pair<std::string, at::Tensor>> state() override {
    return {{"exp_avg", exp_avg_}};
  }
  std::vector<std::string> state_names() override { return {"exp_avg", "exp_avg_sq"}; }
  at::Tensor state_values(size_t i, int64_t offset, int64_t n) override;
  void load_state_values(size_t i, int64_t offset, const at::Tensor& values) override;
  bool state_values_are_views(size_t i) const override { return i == 0; }
  int64_t state_bytes() override;
  // The Muon half's learning rate (what the LR schedule starts from); adam_lr() the Adam half's.
  double lr() const override { return params_.muon_lr_or_default(); }
  double adam_lr() const { return params_.adam_lr_or_default(); }
  NsMethod ns_method() const { return ns_method_; }

  // Elements [offset, offset + grads.numel()) lie inside one matrix range: folds grads / grad_scale
  // into the momentum and returns u (fp32, a new tensor).
  at::Tensor fold_momentum(int64_t offset, const at::Tensor& grads, double grad_scale);
  // The update U of the matrix range starting at `offset` (update.numel() its length), for the
  // next step(); every range needs one before step() reaches it. The tensor is kept as given
  // (a view of a larger buffer keeps that buffer) until the step has applied the whole range.
  void set_update(int64_t offset, const at::Tensor& update);
  // The matrix ranges, sorted.
  const std::vector<std::pair<int64_t, int64_t>>& matrix_ranges() const { return ranges_; }

 private:
  // Index of the range holding [offset, offset + n), or throws.
  size_t range_of(int64_t offset, int64_t n, const char* what) const;
  // Matrix elements before buffer position `pos`.
  int64_t matrix_before(int64_t pos) const;
  // fn(lo, hi, matrix) for the consecutive runs of [begin, end): matrix elements or not.
  void for_each_run(int64_t begin, int64_t end,
                    const std::function<void(int64_t, int64_t, bool)>& fn) const;

  MuonParams params_;
  NsMethod ns_method_;
  Adam adam_;  // the Adam half: built for no elements, stepped with this optimizer's state
  std::vector<std::pair<int64_t, int64_t>> ranges_;  // sorted, disjoint
  std::vector<int64_t> compact_;                     // matrix elements before range i
  at::Tensor exp_avg_;                               // [numel]
  at::Tensor exp_avg_sq_;  // [numel - matrix_numel_]: the Adam elements, in buffer order
  int64_t matrix_numel_ = 0;
  std::vector<at::Tensor> updates_;  // [range i's length]: this step's U, set_update to step
  int64_t applied_ = 0;              // matrix elements step() has updated with updates_
};

// The optimizer of the DeepSpeed config's "optimizer" section (cfg.type, already normalised to
// its canonical spelling by Config). numel: length of the flat buffer this rank updates (its
// ZeRO shard, or everything); options: device and dtype of the state (fp32); segments: Lamb's
// parameter segments, Muon's matrix ranges (the others ignore it). Throws ConfigError when cfg.type
// is empty or unknown.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, int64_t numel,
                                          at::TensorOptions options,
                                          std::vector<std::pair<int64_t, int64_t>> segments = {});

}  // namespace dscpp::optim
