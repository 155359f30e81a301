// The LR schedules over 2000-step runs against closed-form formulas written here from DeepSpeed's
// documentation and code (not from the implementation): the LR of the k-th APPLIED optimizer
// step is the value set at construction for k = 1 and the schedule's value at
// last_batch_iteration = k - 2 after that (NOTE [LR schedule order of events]). Also: skipped
// steps do not tick, resuming from last_batch_iteration, and the factory.
#include "dscpp/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/error.h"
#include "dscpp/optim.h"

namespace dscpp {
namespace {

constexpr int kRun = 2000;
constexpr double kPi = 3.14159265358979323846;

void expect_close(double actual, double expected, const std::string& what) {
  EXPECT_NEAR(actual, expected, 1e-12 * std::max(1.0, std::abs(expected))) << what;
}

// Drives the schedule as the engine does: the k-th applied step (1-based) uses get_lr(), then the
// schedule ticks. Checks every step against expected(k) and (when given) expected_betas(k).
void check_run(LRSchedule& s, const std::function<double(int)>& expected,
               const std::function<std::optional<std::pair<double, double>>(int)>& betas = {}) {
  for (int k = 1; k <= kRun; ++k) {
    const std::string what = std::string(s.name()) + " applied step " + std::to_string(k);
    expect_close(s.get_lr(), expected(k), what);
    if (betas) {
      const auto want = betas(k);
      const auto got = s.get_betas();
      ASSERT_EQ(got.has_value(), want.has_value()) << what;
      if (want) {
        expect_close(got->first, want->first, what + " beta1");
        expect_close(got->second, want->second, what + " beta2");
      }
    } else {
      EXPECT_FALSE(s.get_betas().has_value()) << what;
    }
    EXPECT_EQ(s.last_batch_iteration(), k - 2) << what;
    s.step();
    if (::testing::Test::HasFailure()) return;  // one failure is enough to read
  }
}

// ----- WarmupLR -------------------------------------------------------------------------------
// LR at iteration i >= 0: min + (max - min) * frac, frac = log(i+1)/log(W) or i/W below W, then 1.
double warmup_expected(int i, double lo, double hi, int w, bool linear) {
  const double frac = i >= w ? 1.0 : (linear ? double(i) / w : std::log(i + 1.0) / std::log(w));
  return lo + (hi - lo) * frac;
}

TEST(LRWarmupLR, LogAndLinearOverTwoThousandSteps) {
  struct Case {
    double min_lr;
    std::optional<double> max_lr;
    int64_t num_steps;
    const char* type;
  };
  const double opt_lr = 0.01;
  for (const Case& c : {Case{0.0, std::nullopt, 1000, "log"}, Case{1e-4, 3e-3, 100, "linear"},
                        Case{2e-5, 1e-3, 1777, "linear"}, Case{0.0, 5e-4, 0, "log"},
                        Case{1e-3, 2e-3, 1, "linear"}}) {
    WarmupLRParams p;
    p.warmup_min_lr = c.min_lr;
    p.warmup_max_lr = c.max_lr;
    p.warmup_num_steps = c.num_steps;
    p.warmup_type = c.type;
    WarmupLR s(p, opt_lr);
    const double hi = c.max_lr.value_or(opt_lr);  // unset: the optimizer's lr
    const int w = std::max<int>(2, c.num_steps);  // DeepSpeed: max(2, warmup_num_steps)
    const bool linear = std::string(c.type) == "linear";
    check_run(s, [&](int k) {
      return k == 1 ? c.min_lr : warmup_expected(k - 2, c.min_lr, hi, w, linear);
    });
  }
}

// ----- WarmupDecayLR --------------------------------------------------------------------------
TEST(LRWarmupDecayLR, WarmsUpThenDecaysLinearlyToZeroAtTotalNumSteps) {
  struct Case {
    int64_t total, warmup;
    const char* type;
    double lo, hi;
  };
  for (const Case& c : {Case{1500, 300, "linear", 1e-5, 1e-3}, Case{1800, 1000, "log", 0.0, 2e-3},
                        Case{500, 700, "linear", 0.0, 1e-3}}) {
    WarmupDecayLRParams p;
    p.total_num_steps = c.total;
    p.warmup_num_steps = c.warmup;
    p.warmup_type = c.type;
    p.warmup_min_lr = c.lo;
    p.warmup_max_lr = c.hi;
    WarmupDecayLR s(p, 0.5);
    const bool linear = std::string(c.type) == "linear";
    auto expected = [&](int k) {
      if (k == 1) return c.lo;
      const int i = k - 2;
      if (i < c.warmup) return warmup_expected(i, c.lo, c.hi, c.warmup, linear);
      // Linear decay from max at the end of warmup to min at total_num_steps, then flat.
      const double remaining =
          double(c.total - i) / double(std::max<int64_t>(1, c.total - c.warmup));
      return c.lo + (c.hi - c.lo) * std::max(0.0, remaining);
    };
    check_run(s, expected);
    if (c.total >= c.warmup) {  // otherwise total_num_steps falls inside the warmup
      expect_close(s.lr_at(c.total), c.lo, "at total_num_steps");
      expect_close(s.lr_at(c.total + 100), c.lo, "after total_num_steps");
      EXPECT_GT(s.lr_at(c.total - 1), c.lo);
    }
  }
}

// ----- WarmupCosineLR -------------------------------------------------------------------------
TEST(LRWarmupCosineLR, WarmupRatioThenCosineToMinRatioAndHeld) {
  struct Case {
    int64_t total, warmup;
    double warmup_min_ratio, cos_min_ratio;
    const char* type;
  };
  const double opt_lr = 0.02;
  for (const Case& c : {Case{2000, 100, 0.1, 0.01, "linear"}, Case{1000, 50, 0.0, 1e-4, "log"},
                        Case{1500, 1, 0.5, 0.0, "linear"}}) {
    WarmupCosineLRParams p;
    p.total_num_steps = c.total;
    p.warmup_num_steps = c.warmup;
    p.warmup_min_ratio = c.warmup_min_ratio;
    p.cos_min_ratio = c.cos_min_ratio;
    p.warmup_type = c.type;
    WarmupCosineLR s(p, opt_lr);
    const int w = std::max<int>(2, c.warmup);
    const bool linear = std::string(c.type) == "linear";
    auto expected = [&](int k) {
      if (k == 1) return 0.0;  // DeepSpeed's __init__ sets lr 0 before the first step()
      const int i = k - 2;
      double ratio;
      if (i < w) {
        const double frac = linear ? double(i) / w : std::log(i + 1.0) / std::log(double(w));
        ratio = c.warmup_min_ratio + (1 - c.warmup_min_ratio) * frac;
      } else {
        // Cosine over the T - W steps after warmup, clamped at its end.
        const double progress =
            std::min(1.0, double(i - w + 1) / double(std::max<int64_t>(1, c.total - w)));
        ratio = c.cos_min_ratio + (1 - c.cos_min_ratio) * 0.5 * (1 + std::cos(kPi * progress));
      }
      return opt_lr * ratio;
    };
    check_run(s, expected);
    expect_close(s.lr_at(c.total + 500), opt_lr * c.cos_min_ratio, "held after the end");
  }
}

// ----- OneCycle -------------------------------------------------------------------------------
struct CycleShape {
  int first, second, first_stairs, second_stairs;
};

// Fraction of the way from the cycle's low to its high point at iteration i (< first+second):
// t = i + 1 steps into the cycle, rising over `first`, falling over `second`, optionally
// quantised to stairs counted from the start (rising) or the end (falling) of each half.
double cycle_fraction(int i, const CycleShape& c) {
  const int t = i + 1, total = c.first + c.second;
  if (t <= c.first) {
    return c.first_stairs > 0 ? std::floor(double(t) * c.first_stairs / c.first) / c.first_stairs
                              : double(t) / c.first;
  }
  return c.second_stairs > 0
             ? std::floor(double(total - t) * c.second_stairs / c.second) / c.second_stairs
             : double(total - t) / c.second;
}

TEST(LROneCycle, PhasesDecayAndMomentumOverTwoThousandSteps) {
  struct Case {
    CycleShape shape;
    bool second_given, second_stairs_given;
    int decay_step_size;
    double decay_lr_rate, decay_mom_rate;
  };
  const double lo = 1e-4, hi = 1e-3, mom_lo = 0.85, mom_hi = 0.95;
  for (const Case& c : {Case{{500, 700, 0, 0}, true, false, 100, 0.5, 0.01},
                        Case{{400, 400, 4, 4}, false, false, 0, 0.5, 0.0},
                        Case{{300, 900, 3, 9}, true, true, 50, 0.0, 0.02},
                        Case{{2500, 2500, 0, 0}, false, false, 0, 0.0, 0.0}}) {
    OneCycleParams p;
    p.cycle_min_lr = lo;
    p.cycle_max_lr = hi;
    p.cycle_first_step_size = c.shape.first;
    if (c.second_given) p.cycle_second_step_size = c.shape.second;
    p.cycle_first_stair_count = c.shape.first_stairs;
    if (c.second_stairs_given) p.cycle_second_stair_count = c.shape.second_stairs;
    p.decay_step_size = c.decay_step_size;
    p.decay_lr_rate = c.decay_lr_rate;
    p.decay_mom_rate = c.decay_mom_rate;
    p.cycle_momentum = true;
    p.cycle_min_mom = mom_lo;
    p.cycle_max_mom = mom_hi;
    OneCycle s(p, 0.3, /*optimizer_has_betas=*/true);
    const int total = c.shape.first + c.shape.second;
    auto lr = [&](int k) {
      if (k == 1) return lo;
      const int i = k - 2;
      if (i < total) return lo + (hi - lo) * cycle_fraction(i, c.shape);
      if (c.decay_step_size == 0 || c.decay_lr_rate == 0) return lo;
      return lo / (1 + c.decay_lr_rate * double(i - total + 1) / c.decay_step_size);
    };
    auto betas = [&](int k) -> std::optional<std::pair<double, double>> {
      if (k == 1) return std::make_pair(mom_lo, 0.99);  // DeepSpeed's __init__: min momentum
      const int i = k - 2;
      if (i < total)
        return std::make_pair(mom_hi - (mom_hi - mom_lo) * cycle_fraction(i, c.shape), 0.99);
      if (c.decay_step_size == 0 || c.decay_mom_rate == 0) return std::make_pair(mom_hi, 0.99);
      return std::make_pair(
          mom_hi * (1 + c.decay_mom_rate * double(i - total + 1) / c.decay_step_size), 0.99);
    };
    check_run(s, lr, betas);
  }
}

TEST(LROneCycle, NoMomentumCyclingWithoutBetasOrWhenDisabled) {
  OneCycleParams p;
  p.cycle_min_lr = 0.01;
  p.cycle_max_lr = 0.1;
  p.cycle_first_step_size = 10;
  OneCycle sgd_like(p, 0.05, /*optimizer_has_betas=*/false);
  EXPECT_FALSE(sgd_like.get_betas().has_value());
  sgd_like.step();
  EXPECT_FALSE(sgd_like.get_betas().has_value());
  p.cycle_momentum = false;
  OneCycle disabled(p, 0.05, true);
  EXPECT_FALSE(disabled.get_betas().has_value());
  expect_close(disabled.get_lr(), 0.01, "initial");
}

// ----- LRRangeTest ----------------------------------------------------------------------------
TEST(LRRangeTestSchedule, ContinuousAndStaircaseOverTwoThousandSteps) {
  for (bool staircase : {false, true}) {
    LRRangeTestParams p;
    p.lr_range_test_min_lr = 1e-4;
    p.lr_range_test_step_size = 100;
    p.lr_range_test_step_rate = 2.0;
    p.lr_range_test_staircase = staircase;
    LRRangeTest s(p, 0.7);
    check_run(s, [&](int k) {
      if (k == 1) return 1e-4;
      const int n = k - 1;  // ticks so far = last_batch_iteration + 1
      const double x = staircase ? double(n / 100) : n / 100.0;
      return 1e-4 * (1 + 2.0 * x);
    });
  }
}

// ----- order of events ------------------------------------------------------------------------
TEST(LRSchedule, ConstantScheduleRunsTheFirstStepAtTheOptimizerLr) {
  auto s = make_lr_schedule(SchedulerConfig{}, 0.003, true);
  EXPECT_STREQ(s->name(), "Constant");
  check_run(*s, [](int) { return 0.003; });
}

// A fp16 run where some steps overflow: the engine skips the optimizer step and does not tick
// the schedule, so the k-th applied step gets the same LR as in a run without overflows.
TEST(LRSchedule, SkippedStepsDoNotTick) {
  WarmupDecayLRParams p;
  p.total_num_steps = 300;
  p.warmup_num_steps = 50;
  p.warmup_type = "linear";
  WarmupDecayLR clean(p, 1.0), skipping(p, 1.0);
  std::vector<double> clean_lrs, skipping_lrs;
  for (int k = 0; k < 200; ++k) {
    clean_lrs.push_back(clean.get_lr());
    clean.step();
  }
  for (int attempt = 0; static_cast<int>(skipping_lrs.size()) < 200; ++attempt) {
    const bool overflow = attempt % 7 == 3 || attempt % 11 == 0;
    if (overflow) continue;  // no optimizer step, no tick
    skipping_lrs.push_back(skipping.get_lr());
    skipping.step();
  }
  EXPECT_EQ(clean_lrs, skipping_lrs);
  EXPECT_EQ(skipping.last_batch_iteration(), 199);
}

TEST(LRSchedule, ResumeRestoresTheLrOfTheCheckpoint) {
  OneCycleParams p;
  p.cycle_min_lr = 1e-4;
  p.cycle_max_lr = 1e-3;
  p.cycle_first_step_size = 30;
  p.decay_step_size = 5;
  p.decay_lr_rate = 0.1;
  OneCycle a(p, 0.1, true), b(p, 0.1, true);
  for (int k = 0; k < 45; ++k) a.step();
  b.set_last_batch_iteration(a.last_batch_iteration());
  for (int k = 0; k < 40; ++k) {
    EXPECT_EQ(a.get_lr(), b.get_lr());
    EXPECT_EQ(a.get_betas(), b.get_betas());
    a.step();
    b.step();
  }
  b.set_last_batch_iteration(-1);  // back to the start: DeepSpeed's initial values
  EXPECT_EQ(b.get_lr(), 1e-4);
  EXPECT_EQ(b.get_betas(), std::make_pair(0.8, 0.99));
  EXPECT_THROW(b.set_last_batch_iteration(-2), Error);
}

// DeepSpeed's __init__ leaves the optimizer's lr alone when last_batch_iteration != -1.
TEST(LRSchedule, ConstructedMidScheduleKeepsTheOptimizerLrUntilTheFirstTick) {
  WarmupLRParams p;
  p.warmup_max_lr = 1e-3;
  p.warmup_num_steps = 10;
  p.warmup_type = "linear";
  p.last_batch_iteration = 4;
  WarmupLR s(p, 0.05);
  EXPECT_EQ(s.get_lr(), 0.05);
  s.step();
  EXPECT_EQ(s.last_batch_iteration(), 5);
  expect_close(s.get_lr(), 1e-3 * 5 / 10, "after the first tick");
}

TEST(LRSchedule, FactoryBuildsEachTypeForTheOptimizer) {
  OptimizerConfig oc;
  oc.type = "AdamW";
  oc.adam.lr = 0.004;
  auto adamw = optim::make_optimizer(oc, 4, at::kFloat);
  oc.type = "SGD";
  auto sgd = optim::make_optimizer(oc, 4, at::kFloat);

  SchedulerConfig sc;
  sc.type = "WarmupLR";
  auto w = make_lr_schedule(sc, *adamw);
  EXPECT_STREQ(w->name(), "WarmupLR");
  expect_close(w->lr_at(5000), 0.004, "warmup_max_lr defaults to the optimizer lr");
  sc.type = "WarmupCosineLR";
  sc.warmup_cosine_lr.total_num_steps = 100;
  EXPECT_EQ(make_lr_schedule(sc, *adamw)->get_lr(), 0.0);
  sc.type = "OneCycle";
  sc.one_cycle.cycle_min_lr = 0.001;
  sc.one_cycle.cycle_max_lr = 0.01;
  EXPECT_TRUE(make_lr_schedule(sc, *adamw)->get_betas().has_value());
  EXPECT_FALSE(make_lr_schedule(sc, *sgd)->get_betas().has_value());
  sc.type = "LRRangeTest";
  EXPECT_STREQ(make_lr_schedule(sc, *sgd)->name(), "LRRangeTest");
  sc.type = "WarmupDecayLR";
  sc.warmup_decay_lr.total_num_steps = 10;
  EXPECT_STREQ(make_lr_schedule(sc, *sgd)->name(), "WarmupDecayLR");
  sc.type = "CosineAnnealing";
  EXPECT_THROW(make_lr_schedule(sc, *sgd), ConfigError);
}

}  // namespace
}  // namespace dscpp
