// DeepSpeed's learning-rate schedules (deepspeed/runtime/lr_schedules.py): WarmupLR,
// WarmupDecayLR, WarmupCosineLR, OneCycle (with momentum cycling) and LRRangeTest, with
// DeepSpeed's parameters, defaults and formulas; docs/optim.md writes them out.
//
// NOTE [LR schedule order of events]: like DeepSpeed, a schedule holds last_batch_iteration
// (-1 at the start) and the LR (and betas) in force for the NEXT optimizer step:
//   - construction with last_batch_iteration == -1 sets the initial value, exactly as DeepSpeed's
//     __init__ writes it into the optimizer: WarmupLR / WarmupDecayLR: warmup_min_lr;
//     WarmupCosineLR: 0; OneCycle: cycle_min_lr (and betas (cycle_min_mom, 0.99)); LRRangeTest:
//     lr_range_test_min_lr. So the FIRST optimizer step runs at that value, not at the
//     optimizer's configured lr (only "no scheduler" runs the first step at the configured lr).
//     Constructed with last_batch_iteration >= 0, DeepSpeed leaves the optimizer's lr (and
//     betas) alone until the first tick, and so does dscpp.
//   - step() ticks after each APPLIED optimizer step: last_batch_iteration += 1, then the LR is
//     the schedule's value at that iteration (lr_at()). A skipped step (fp16 overflow) does not
//     tick.
//   - set_last_batch_iteration(n) restores a checkpoint: the LR is then what DeepSpeed's
//     optimizer state holds after the tick that reached n (lr_at(n); the initial value for -1).
// Torch-free; not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "dscpp/config.h"

namespace dscpp {

namespace optim {
class Optimizer;
}

class LRSchedule {
 public:
  virtual ~LRSchedule() = default;
  // "WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest" or "Constant".
  virtual const char* name() const = 0;

  // Ticks the schedule after an applied optimizer step (NOTE [LR schedule order of events]).
  void step();
  // The LR of the next optimizer step.
  double get_lr() const { return lr_; }
  // The (beta1, beta2) of the next optimizer step when the schedule sets them (OneCycle with
  // cycle_momentum on an optimizer with betas), else nullopt: pass it as
  // StepContext::betas_override.
  std::optional<std::pair<double, double>> get_betas() const { return betas_; }
  // Ticks so far minus one: -1 before the first tick.
  int64_t last_batch_iteration() const { return last_batch_iteration_; }
  // Restores the state of a checkpoint (DeepSpeed's load_state_dict). n >= -1.
  void set_last_batch_iteration(int64_t n);

  // The schedule's LR / betas once last_batch_iteration == it (it >= 0): DeepSpeed's get_lr()
  // and get_mom().
  virtual double lr_at(int64_t it) const = 0;
  virtual std::optional<std::pair<double, double>> betas_at(int64_t /*it*/) const {
    return std::nullopt;
  }

 protected:
  LRSchedule() = default;
  // Called once by each constructor: the state at construction. initial_lr / initial_betas
  // are what DeepSpeed's __init__ writes when last_batch_iteration == -1; otherwise the
  // optimizer's own lr (and no betas override) stay until the first tick.
  void start(int64_t last_batch_iteration, double initial_lr,
             std::optional<std::pair<double, double>> initial_betas, double optimizer_lr);

 private:
  int64_t last_batch_iteration_ = -1;
  double lr_ = 0.0;
  std::optional<std::pair<double, double>> betas_;
  double initial_lr_ = 0.0;
  std::optional<std::pair<double, double>> initial_betas_;
};

// No "scheduler" section: the optimizer's configured lr at every step.
class ConstantLR : public LRSchedule {
 public:
  explicit ConstantLR(double lr);
  const char* name() const override { return "Constant"; }
  double lr_at(int64_t it) const override;

 private:
  double lr_;
};

// warmup_min_lr + (warmup_max_lr - warmup_min_lr) * gamma(it), gamma rising over
// W = max(2, warmup_num_steps) steps: log: ln(it+1)/ln(W); linear: it/W; 1 from it >= W.
// warmup_max_lr unset: the optimizer's lr.
class WarmupLR : public LRSchedule {
 public:
  WarmupLR(const WarmupLRParams& params, double optimizer_lr);
  const char* name() const override { return "WarmupLR"; }
  double lr_at(int64_t it) const override;

 protected:
  WarmupLR(double min_lr, double max_lr, int64_t warmup_num_steps, const std::string& type);
  // The warmup fraction for it < W (log or linear).
  double warmup_gamma(int64_t it) const;
  double min_lr_, max_lr_;
  int64_t warmup_num_steps_;  // max(2, warmup_num_steps)
  bool linear_;
};

// WarmupLR, then from it >= W linear decay: gamma = max(0, (T - it) / max(1, T - W)).
class WarmupDecayLR : public WarmupLR {
 public:
  WarmupDecayLR(const WarmupDecayLRParams& params, double optimizer_lr);
  const char* name() const override { return "WarmupDecayLR"; }
  double lr_at(int64_t it) const override;

 private:
  int64_t total_num_steps_;
};

// optimizer lr * ratio(it): warmup from warmup_min_ratio to 1 (log or linear, as WarmupLR),
// then cosine from 1 to cos_min_ratio over T - W steps, held at cos_min_ratio after T.
class WarmupCosineLR : public LRSchedule {
 public:
  WarmupCosineLR(const WarmupCosineLRParams& params, double optimizer_lr);
  const char* name() const override { return "WarmupCosineLR"; }
  double lr_at(int64_t it) const override;

 private:
  double org_lr_;
  int64_t total_num_steps_;
  double warmup_min_ratio_, cos_min_ratio_;
  int64_t warmup_num_steps_;  // max(2, warmup_num_steps)
  bool linear_;
};

// One cycle from cycle_min_lr up to cycle_max_lr (cycle_first_step_size steps) and back down
// (cycle_second_step_size steps), optionally in stairs, then post-cycle decay
// cycle_min_lr / (1 + decay_lr_rate * k / decay_step_size). Momentum (beta1) moves inversely
// between cycle_max_mom and cycle_min_mom, beta2 fixed at 0.99 (DeepSpeed's choice), only when
// cycle_momentum and the optimizer has betas (DeepSpeed disables it, with a warning, for SGD
// and Adagrad).
class OneCycle : public LRSchedule {
 public:
  OneCycle(const OneCycleParams& params, double optimizer_lr, bool optimizer_has_betas);
  const char* name() const override { return "OneCycle"; }
  double lr_at(int64_t it) const override;
  std::optional<std::pair<double, double>> betas_at(int64_t it) const override;

 private:
  double scale_factor(int64_t it) const;
  OneCycleParams p_;
  double first_step_size_, second_step_size_, total_size_, step_ratio_;
  int64_t first_stair_count_, second_stair_count_;
  bool skip_lr_decay_, skip_mom_decay_, cycle_momentum_;
};

// lr_range_test_min_lr * (1 + lr_range_test_step_rate * x), x = (it+1) / step_size, floored
// when lr_range_test_staircase.
class LRRangeTest : public LRSchedule {
 public:
  LRRangeTest(const LRRangeTestParams& params, double optimizer_lr);
  const char* name() const override { return "LRRangeTest"; }
  double lr_at(int64_t it) const override;

 private:
  LRRangeTestParams p_;
};

// The schedule of the DeepSpeed config's "scheduler" section for this optimizer (its lr and
// whether it has betas); ConstantLR(optimizer lr) when cfg.type is empty. Throws ConfigError
// for an unknown type.
std::unique_ptr<LRSchedule> make_lr_schedule(const SchedulerConfig& cfg,
                                             const optim::Optimizer& optimizer);
std::unique_ptr<LRSchedule> make_lr_schedule(const SchedulerConfig& cfg, double optimizer_lr,
                                             bool optimizer_has_betas);

}  // namespace dscpp
