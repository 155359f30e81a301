// The LRSchedule state machine (NOTE [LR schedule order of events] in lr_schedule.h), the
// constant schedule used without a "scheduler" section, and make_lr_schedule().
#include "dscpp/lr_schedule.h"

#include "dscpp/error.h"
#include "dscpp/optim.h"

namespace dscpp {

void LRSchedule::start(int64_t last_batch_iteration, double initial_lr,
                       std::optional<std::pair<double, double>> initial_betas,
                       double optimizer_lr) {
  DSCPP_CHECK(last_batch_iteration >= -1, ConfigError,
              "scheduler.params.last_batch_iteration: ", last_batch_iteration,
              " < -1. HINT: -1 starts the schedule from the beginning");
  last_batch_iteration_ = last_batch_iteration;
  initial_lr_ = initial_lr;
  initial_betas_ = initial_betas;
  if (last_batch_iteration == -1) {
    lr_ = initial_lr;
    betas_ = initial_betas;
  } else {
    // DeepSpeed's __init__ leaves the optimizer alone when resuming mid-schedule.
    lr_ = optimizer_lr;
    betas_ = std::nullopt;
  }
}

void LRSchedule::step() {
  ++last_batch_iteration_;
  lr_ = lr_at(last_batch_iteration_);
  betas_ = betas_at(last_batch_iteration_);
}

void LRSchedule::set_last_batch_iteration(int64_t n) {
  DSCPP_CHECK(n >= -1, Error, name(), ": last_batch_iteration ", n, " < -1");
  last_batch_iteration_ = n;
  if (n == -1) {
    lr_ = initial_lr_;
    betas_ = initial_betas_;
  } else {
    lr_ = lr_at(n);
    betas_ = betas_at(n);
  }
}

ConstantLR::ConstantLR(double lr) : lr_(lr) { start(-1, lr, std::nullopt, lr); }

double ConstantLR::lr_at(int64_t /*it*/) const { return lr_; }

std::unique_ptr<LRSchedule> make_lr_schedule(const SchedulerConfig& cfg, double optimizer_lr,
                                             bool optimizer_has_betas) {
  if (cfg.type.empty()) return std::make_unique<ConstantLR>(optimizer_lr);
  if (cfg.type == "WarmupLR") return std::make_unique<WarmupLR>(cfg.warmup_lr, optimizer_lr);
  if (cfg.type == "WarmupDecayLR") {
    return std::make_unique<WarmupDecayLR>(cfg.warmup_decay_lr, optimizer_lr);
  }
  if (cfg.type == "WarmupCosineLR") {
    return std::make_unique<WarmupCosineLR>(cfg.warmup_cosine_lr, optimizer_lr);
  }
  if (cfg.type == "OneCycle") {
    return std::make_unique<OneCycle>(cfg.one_cycle, optimizer_lr, optimizer_has_betas);
  }
  if (cfg.type == "LRRangeTest") {
    return std::make_unique<LRRangeTest>(cfg.lr_range_test, optimizer_lr);
  }
  DSCPP_FAIL(ConfigError, "scheduler.type: '", cfg.type,
             "' is not a schedule dscpp implements. HINT: use WarmupLR, WarmupDecayLR, "
             "WarmupCosineLR, OneCycle or LRRangeTest");
}

std::unique_ptr<LRSchedule> make_lr_schedule(const SchedulerConfig& cfg,
                                             const optim::Optimizer& optimizer) {
  return make_lr_schedule(cfg, optimizer.lr(), optimizer.betas().has_value());
}

}  // namespace dscpp
