// OneCycle: DeepSpeed's 1Cycle LR and momentum policy (deepspeed/runtime/lr_schedules.py),
// formula for formula, including its stair quantisation and the fixed beta2 of 0.99.
#include <cmath>

#include "dscpp/error.h"
#include "dscpp/lr_schedule.h"
#include "util/log.h"

namespace dscpp {

namespace {
constexpr double kOneCycleBeta2 = 0.99;  // DeepSpeed's min_moms / max_moms second entry
}  // namespace

OneCycle::OneCycle(const OneCycleParams& params, double optimizer_lr, bool optimizer_has_betas)
    : p_(params) {
  DSCPP_CHECK(params.cycle_first_step_size > 0, ConfigError,
              "scheduler.params.cycle_first_step_size must be > 0, got ",
              params.cycle_first_step_size);
  first_step_size_ = static_cast<double>(params.cycle_first_step_size);
  second_step_size_ = params.cycle_second_step_size
                          ? static_cast<double>(*params.cycle_second_step_size)
                          : first_step_size_;
  DSCPP_CHECK(second_step_size_ >= 0.0, ConfigError,
              "scheduler.params.cycle_second_step_size must be >= 0");
  total_size_ = first_step_size_ + second_step_size_;
  step_ratio_ = first_step_size_ / total_size_;
  first_stair_count_ = params.cycle_first_stair_count;
  second_stair_count_ = params.cycle_second_stair_count.value_or(first_stair_count_);
  const bool no_decay_steps = params.decay_step_size == 0;
  skip_lr_decay_ = no_decay_steps || params.decay_lr_rate == 0.0;
  skip_mom_decay_ = no_decay_steps || params.decay_mom_rate == 0.0;
  cycle_momentum_ = params.cycle_momentum && optimizer_has_betas;
  if (params.cycle_momentum && !optimizer_has_betas) {
    DSCPP_LOG_WARN(
        "scheduler OneCycle: cycle_momentum is disabled because the optimizer has no "
        "betas (as DeepSpeed does for SGD and Adagrad)");
  }
  std::optional<std::pair<double, double>> initial_betas;
  if (cycle_momentum_) initial_betas = std::make_pair(params.cycle_min_mom, kOneCycleBeta2);
  start(params.last_batch_iteration, params.cycle_min_lr, initial_betas, optimizer_lr);
}

double OneCycle::scale_factor(int64_t it) const {
  const double batch_iteration = static_cast<double>(it + 1);
  const double cycle = std::floor(1.0 + batch_iteration / total_size_);
  const double x = 1.0 + batch_iteration / total_size_ - cycle;
  double scale;
  int64_t stair_count;
  if (x <= step_ratio_) {
    scale = x / step_ratio_;
    stair_count = first_stair_count_;
  } else {
    scale = (x - 1.0) / (step_ratio_ - 1.0);
    stair_count = second_stair_count_;
  }
  // Stairs are quantised from the integer offset in the cycle, not from `scale`.
  if (stair_count > 0) {
    const double cycle_iteration = std::fmod(batch_iteration, total_size_);
    double stair_position;
    if (cycle_iteration <= first_step_size_) {
      stair_position = cycle_iteration * static_cast<double>(stair_count) / first_step_size_;
    } else {
      stair_position =
          (total_size_ - cycle_iteration) * static_cast<double>(stair_count) / second_step_size_;
    }
    scale = std::floor(stair_position) / static_cast<double>(stair_count);
  }
  return scale;
}

double OneCycle::lr_at(int64_t it) const {
  if (static_cast<double>(it) < total_size_) {
    return p_.cycle_min_lr + (p_.cycle_max_lr - p_.cycle_min_lr) * scale_factor(it);
  }
  if (skip_lr_decay_) return p_.cycle_min_lr;
  const double decay_interval =
      static_cast<double>(it - total_size_ + 1) / static_cast<double>(p_.decay_step_size);
  return p_.cycle_min_lr / (1.0 + p_.decay_lr_rate * decay_interval);
}

std::optional<std::pair<double, double>> OneCycle::betas_at(int64_t it) const {
  if (!cycle_momentum_) return std::nullopt;
  if (static_cast<double>(it) < total_size_) {
    const double momentum =
        p_.cycle_max_mom - (p_.cycle_max_mom - p_.cycle_min_mom) * scale_factor(it);
    return std::make_pair(momentum, kOneCycleBeta2);
  }
  if (skip_mom_decay_) return std::make_pair(p_.cycle_max_mom, kOneCycleBeta2);
  const double decay_interval =
      static_cast<double>(it - total_size_ + 1) / static_cast<double>(p_.decay_step_size);
  return std::make_pair(p_.cycle_max_mom * (1.0 + p_.decay_mom_rate * decay_interval),
                        kOneCycleBeta2);
}

}  // namespace dscpp
