// WarmupLR, WarmupDecayLR and WarmupCosineLR: DeepSpeed's warmup family
// (deepspeed/runtime/lr_schedules.py), formula for formula.
#include <algorithm>
#include <cmath>
#include <string>

#include "dscpp/error.h"
#include "dscpp/lr_schedule.h"
#include "util/log.h"

namespace dscpp {
namespace {

constexpr double kPi = 3.14159265358979323846;  // Python's math.pi

// DeepSpeed falls back to "log" (with a warning) for an unknown warmup_type.
bool is_linear_warmup(const std::string& type) {
  if (type == "linear") return true;
  if (type != "log") {
    DSCPP_LOG_WARN(
        "scheduler.params.warmup_type '{}' is neither 'log' nor 'linear': using log "
        "(as DeepSpeed does)",
        type);
  }
  return false;
}

// DeepSpeed's warmup fraction for it < W: log: ln(it+1) / ln(W); linear: it / W.
double warmup_fraction(int64_t it, int64_t warmup_num_steps, bool linear) {
  if (linear) return static_cast<double>(it) / static_cast<double>(warmup_num_steps);
  const double inverse_log_warm_up = 1.0 / std::log(static_cast<double>(warmup_num_steps));
  return inverse_log_warm_up * std::log(static_cast<double>(it + 1));
}

}  // namespace

// ----- WarmupLR -------------------------------------------------------------------------------
WarmupLR::WarmupLR(double min_lr, double max_lr, int64_t warmup_num_steps, const std::string& type)
    : min_lr_(min_lr),
      max_lr_(max_lr),
      warmup_num_steps_(std::max<int64_t>(2, warmup_num_steps)),
      linear_(is_linear_warmup(type)) {}

WarmupLR::WarmupLR(const WarmupLRParams& params, double optimizer_lr)
    : WarmupLR(params.warmup_min_lr, params.warmup_max_lr.value_or(optimizer_lr),
               params.warmup_num_steps, params.warmup_type) {
  // DeepSpeed's get_lr() before the first step() returns min_lrs.
  start(params.last_batch_iteration, min_lr_, std::nullopt, optimizer_lr);
}

double WarmupLR::warmup_gamma(int64_t it) const {
  return warmup_fraction(it, warmup_num_steps_, linear_);
}

double WarmupLR::lr_at(int64_t it) const {
  const double gamma = it < warmup_num_steps_ ? warmup_gamma(it) : 1.0;
  return min_lr_ + (max_lr_ - min_lr_) * gamma;
}

// ----- WarmupDecayLR --------------------------------------------------------------------------
WarmupDecayLR::WarmupDecayLR(const WarmupDecayLRParams& params, double optimizer_lr)
    : WarmupLR(params.warmup_min_lr, params.warmup_max_lr, params.warmup_num_steps,
               params.warmup_type),
      total_num_steps_(params.total_num_steps) {
  if (total_num_steps_ < warmup_num_steps_) {
    DSCPP_LOG_WARN("scheduler.params.total_num_steps {} is less than warmup_num_steps {}",
                   total_num_steps_, warmup_num_steps_);
  }
  start(params.last_batch_iteration, min_lr_, std::nullopt, optimizer_lr);
}

double WarmupDecayLR::lr_at(int64_t it) const {
  double gamma;
  if (it < warmup_num_steps_) {
    gamma = warmup_gamma(it);
  } else {
    gamma =
        std::max(0.0, static_cast<double>(total_num_steps_ - it) /
                          std::max(1.0, static_cast<double>(total_num_steps_ - warmup_num_steps_)));
  }
  return min_lr_ + (max_lr_ - min_lr_) * gamma;
}

// ----- WarmupCosineLR -------------------------------------------------------------------------
WarmupCosineLR::WarmupCosineLR(const WarmupCosineLRParams& params, double optimizer_lr)
    : org_lr_(optimizer_lr),
      total_num_steps_(params.total_num_steps),
      warmup_min_ratio_(params.warmup_min_ratio),
      cos_min_ratio_(params.cos_min_ratio),
      warmup_num_steps_(std::max<int64_t>(2, params.warmup_num_steps)),
      linear_(is_linear_warmup(params.warmup_type)) {
  if (total_num_steps_ < warmup_num_steps_) {
    DSCPP_LOG_WARN("scheduler.params.total_num_steps {} is less than warmup_num_steps {}",
                   total_num_steps_, warmup_num_steps_);
  }
  // DeepSpeed's get_lr() before the first step() returns 0.0 for every group.
  start(params.last_batch_iteration, 0.0, std::nullopt, optimizer_lr);
}

double WarmupCosineLR::lr_at(int64_t it) const {
  double ratio;
  if (it < warmup_num_steps_) {
    ratio = warmup_fraction(it, warmup_num_steps_, linear_);
    ratio = warmup_min_ratio_ + ratio * (1.0 - warmup_min_ratio_);
  } else {
    const double real_last_step = static_cast<double>(it - warmup_num_steps_ + 1);
    const double real_total_steps =
        static_cast<double>(std::max<int64_t>(1, total_num_steps_ - warmup_num_steps_));
    // Clamped at 1 (DeepSpeed >= 0.16): the ratio stays at cos_min_ratio past the end.
    const double progress = std::min(1.0, real_last_step / real_total_steps);
    ratio = (1.0 + std::cos(kPi * progress)) / 2.0;
    ratio = std::max(0.0, cos_min_ratio_ + (1.0 - cos_min_ratio_) * ratio);
  }
  return org_lr_ * ratio;
}

}  // namespace dscpp
