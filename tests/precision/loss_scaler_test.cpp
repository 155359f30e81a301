// The fp16 loss scaler's state machine, driven by overflow patterns: each expected scale
// sequence was worked out by hand from DeepSpeed's DynamicLossScaler.update_scale
// (deepspeed/runtime/fp16/loss_scaler.py). In a pattern 'o' is an overflowed (skipped) step
// and '.' a clean one; run() returns the scale after each update.
#include "precision/loss_scaler.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dscpp/config.h"
#include "dscpp/error.h"
#include "support/errors.h"

namespace dscpp::precision {
namespace {

using dscpp::testing::error_of;

// Whether `text` contains `part`, printing both when it does not.
::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << part << "\" not in: " << text;
}

std::vector<double> run(LossScaler& scaler, const std::string& pattern) {
  std::vector<double> scales;
  for (char c : pattern) {
    scaler.update(c == 'o');
    scales.push_back(scaler.scale());
  }
  return scales;
}

LossScalerOptions dynamic_options(double initial, int window, int hysteresis,
                                  bool consecutive = false, double min_scale = 1) {
  LossScalerOptions o;
  o.initial_scale = initial;
  o.scale_window = window;
  o.hysteresis = hysteresis;
  o.consecutive_hysteresis = consecutive;
  o.min_scale = min_scale;
  return o;
}

TEST(LossScaler, StartsAtInitialScale) {
  LossScaler s(dynamic_options(1024, 10, 2));
  EXPECT_TRUE(s.dynamic());
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.state(), (LossScaler::State{1024, 0, -1, 2, 0}));
}

TEST(LossScaler, DoublesAfterEveryWindowOfCleanSteps) {
  // (iter - (-1)) % 3 == 0 at iters 2 and 5.
  LossScaler s(dynamic_options(8, 3, 1));
  EXPECT_EQ(run(s, "......"), (std::vector<double>{8, 8, 16, 16, 16, 32}));
  // Window 2: iters 1, 3, 5.
  LossScaler t(dynamic_options(8, 2, 1));
  EXPECT_EQ(run(t, "......"), (std::vector<double>{8, 16, 16, 32, 32, 64}));
}

TEST(LossScaler, DeepSpeedDefaultWindowDoublesOnThe1000thCleanStep) {
  LossScaler s(LossScalerOptions{});
  for (int i = 0; i < 999; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 65536);
  s.update(false);
  EXPECT_EQ(s.scale(), 131072);
  for (int i = 0; i < 999; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 131072);
  s.update(false);
  EXPECT_EQ(s.scale(), 262144);
}

TEST(LossScaler, OverflowHalvesAndRestartsTheWindow) {
  // Hysteresis 1: the overflow at iter 2 halves at once; the doubling then waits for iter 5
  // ((5 - 2) % 3 == 0): clean steps before the overflow do not count.
  LossScaler s(dynamic_options(8, 3, 1));
  EXPECT_EQ(run(s, "..o...."), (std::vector<double>{8, 8, 4, 4, 4, 8, 8}));
  EXPECT_EQ(s.overflows(), 1);
  EXPECT_EQ(s.state(), (LossScaler::State{8, 7, 2, 1, 1}));
}

TEST(LossScaler, HysteresisTwoNeedsTwoOverflowsThenHalvesUntilAWindowPasses) {
  // Not consecutive: iter 0 spends the counter (2 -> 1), iter 1 halves. The clean step at
  // iter 2 does not refill it, so iter 3 halves at once. The window completes at iter 7
  // ((7 - 3) % 4 == 0): the scale doubles and the counter refills, so iter 8 only spends it
  // and iter 9 halves.
  LossScaler s(dynamic_options(64, 4, 2));
  std::vector<int> hysteresis;
  std::vector<double> scales;
  for (char c : std::string("oo.o....oo")) {
    s.update(c == 'o');
    scales.push_back(s.scale());
    hysteresis.push_back(s.state().hysteresis);
  }
  EXPECT_EQ(scales, (std::vector<double>{64, 32, 32, 16, 16, 16, 16, 32, 32, 16}));
  EXPECT_EQ(hysteresis, (std::vector<int>{1, 1, 1, 1, 1, 1, 1, 2, 1, 1}));
  EXPECT_EQ(s.overflows(), 5);
}

TEST(LossScaler, HysteresisThreeCountsDown) {
  LossScaler s(dynamic_options(64, 100, 3));
  EXPECT_EQ(run(s, "oooo"), (std::vector<double>{64, 64, 32, 16}));
  EXPECT_EQ(s.state().hysteresis, 1);
}

TEST(LossScaler, HysteresisOverflowAlsoRestartsTheWindow) {
  // The overflow at iter 2 lowers nothing (counter 2 -> 1) but still sets last_overflow_iter,
  // so the doubling comes at iter 6 ((6 - 2) % 4 == 0), not at iter 3 ((3 + 1) % 4 == 0).
  LossScaler s(dynamic_options(64, 4, 2));
  EXPECT_EQ(run(s, "..o...."), (std::vector<double>{64, 64, 64, 64, 64, 64, 128}));
  EXPECT_EQ(s.state().hysteresis, 2);  // refilled with the doubling
}

TEST(LossScaler, ConsecutiveHysteresisRefillsAfterAnyCleanStep) {
  // Alternating overflows never get past the counter; two in a row do.
  LossScaler consecutive(dynamic_options(64, 4, 2, /*consecutive=*/true));
  EXPECT_EQ(run(consecutive, "o.o.oo"), (std::vector<double>{64, 64, 64, 64, 64, 32}));
  EXPECT_EQ(consecutive.state().hysteresis, 1);
  consecutive.update(false);
  EXPECT_EQ(consecutive.state().hysteresis, 2);
  EXPECT_EQ(consecutive.scale(), 32);

  // The same pattern without consecutive hysteresis: after the first overflow the counter
  // stays at 1, and every later overflow halves.
  LossScaler plain(dynamic_options(64, 4, 2, /*consecutive=*/false));
  EXPECT_EQ(run(plain, "o.o.oo"), (std::vector<double>{64, 64, 32, 32, 16, 8}));
  plain.update(false);
  EXPECT_EQ(plain.state().hysteresis, 1);
}

TEST(LossScaler, ConsecutiveHysteresisStillDoublesOnlyAtTheWindow) {
  LossScaler s(dynamic_options(16, 3, 2, /*consecutive=*/true));
  // Overflow at iter 1 spends the counter; iter 2 refills it; doubling at iter 4.
  EXPECT_EQ(run(s, ".o...."), (std::vector<double>{16, 16, 16, 16, 32, 32}));
}

TEST(LossScaler, ClampsAtMinScaleThenThrowsWithAHint) {
  // 8 -> 4 -> max(2, 3) = 3; the next overflow finds the scale at its minimum.
  LossScaler s(dynamic_options(8, 100, 1, false, /*min_scale=*/3));
  EXPECT_EQ(run(s, "o.o"), (std::vector<double>{4, 4, 3}));
  const LossScaler::State before = s.state();
  EXPECT_EQ(before, (LossScaler::State{3, 3, 2, 1, 2}));

  EXPECT_THROW(s.update(true), dscpp::Error);
  std::string msg = error_of([&] { s.update(true); });
  EXPECT_TRUE(contains(msg, "overflowed at optimizer step 4 "));
  EXPECT_TRUE(contains(msg, "fp16.min_loss_scale=3"));
  EXPECT_TRUE(contains(msg, "2 of the 3 earlier steps were skipped"));
  EXPECT_TRUE(contains(msg, "HINT:"));
  EXPECT_TRUE(contains(msg, "bf16"));
  // The failed update changed nothing; a clean step still works.
  EXPECT_EQ(s.state(), before);
  s.update(false);
  EXPECT_EQ(s.scale(), 3);
  EXPECT_EQ(s.state().iter, 4);
}

TEST(LossScaler, AtTheMinimumHysteresisStillAbsorbsOverflows) {
  // The minimum check sits in the halving branch only: an overflow that just spends the
  // hysteresis counter does not throw, even at min_scale.
  LossScaler s(dynamic_options(1, 100, 2, /*consecutive=*/true, /*min_scale=*/1));
  EXPECT_EQ(run(s, "o.o."), (std::vector<double>{1, 1, 1, 1}));
  s.update(true);  // counter 2 -> 1
  EXPECT_THROW(s.update(true), dscpp::Error);
}

TEST(LossScaler, WithoutRaiseErrorStaysAtMinimum) {
  LossScalerOptions o = dynamic_options(4, 3, 1, false, /*min_scale=*/2);
  o.raise_error_at_min_scale = false;
  LossScaler s(o);
  EXPECT_EQ(run(s, "ooooo..."), (std::vector<double>{2, 2, 2, 2, 2, 2, 2, 4}));
  EXPECT_EQ(s.overflows(), 5);
}

TEST(LossScaler, StaticScaleNeverChanges) {
  LossScalerOptions o;
  o.static_scale = 128;
  LossScaler s(o);
  EXPECT_FALSE(s.dynamic());
  EXPECT_EQ(s.scale(), 128);
  EXPECT_EQ(run(s, "o.o..."), (std::vector<double>(6, 128)));
  EXPECT_EQ(s.overflows(), 2);
  // Even at scale 1 with min_scale 1 (unused), overflows never throw.
  o.static_scale = 1;
  LossScaler one(o);
  for (int i = 0; i < 50; ++i) one.update(true);
  EXPECT_EQ(one.scale(), 1);
  EXPECT_EQ(one.overflows(), 50);
  EXPECT_EQ(s.describe(), "loss scale 128 (static; 2 of 6 steps skipped)");
}

TEST(LossScaler, FromConfigMapsTheFp16Block) {
  Fp16Config cfg;
  cfg.enabled = true;
  cfg.initial_scale_power = 10;
  cfg.loss_scale_window = 500;
  cfg.hysteresis = 3;
  cfg.consecutive_hysteresis = true;
  cfg.min_loss_scale = 0.25;
  LossScalerOptions o = LossScalerOptions::from_config(cfg);
  EXPECT_EQ(o.static_scale, 0);
  EXPECT_EQ(o.initial_scale, 1024);
  EXPECT_EQ(o.scale_window, 500);
  EXPECT_EQ(o.hysteresis, 3);
  EXPECT_TRUE(o.consecutive_hysteresis);
  EXPECT_EQ(o.min_scale, 0.25);
  EXPECT_EQ(o.scale_factor, 2);
  EXPECT_TRUE(o.raise_error_at_min_scale);
  LossScaler s(o);
  EXPECT_TRUE(s.dynamic());
  EXPECT_EQ(s.scale(), 1024);

  // Config defaults: 2^16, window 1000, hysteresis 2, min 1.
  Fp16Config defaults;
  defaults.enabled = true;
  LossScaler d(LossScalerOptions::from_config(defaults));
  EXPECT_EQ(d.describe(),
            "loss scale 65536 (dynamic: hysteresis 2/2, window 1000, min 1; 0 of 0 steps skipped)");

  // A static loss_scale.
  cfg.loss_scale = 64;
  LossScaler st(LossScalerOptions::from_config(cfg));
  EXPECT_FALSE(st.dynamic());
  EXPECT_EQ(st.scale(), 64);

  // fp16 off (bf16 / fp32): a static scale of 1, as DeepSpeed's CreateLossScaler.
  Fp16Config off;
  LossScaler none(LossScalerOptions::from_config(off));
  EXPECT_FALSE(none.dynamic());
  EXPECT_EQ(none.scale(), 1);

  // Large powers are exact: 2^32.
  defaults.initial_scale_power = 32;
  EXPECT_EQ(LossScaler(LossScalerOptions::from_config(defaults)).describe(),
            "loss scale 4294967296 (dynamic: hysteresis 2/2, window 1000, min 1; 0 of 0 steps "
            "skipped)");
}

TEST(LossScaler, StateRoundTripContinuesIdentically) {
  // After "o.o." the scaler is mid-window (last overflow at iter 2) with its counter spent.
  const LossScalerOptions o = dynamic_options(64, 4, 2);
  LossScaler a(o);
  EXPECT_EQ(run(a, "o.o."), (std::vector<double>{64, 64, 32, 32}));
  const LossScaler::State saved = a.state();
  EXPECT_EQ(saved, (LossScaler::State{32, 4, 2, 1, 2}));

  LossScaler b(o);
  b.load_state(saved);
  EXPECT_EQ(b.state(), saved);
  EXPECT_EQ(b.describe(), a.describe());

  // iter 6 halves at once (counter still 1); the window completes at iter 10.
  const std::vector<double> expected{32, 32, 16, 16, 16, 16, 32};
  EXPECT_EQ(run(a, "..o...."), expected);
  EXPECT_EQ(run(b, "..o...."), expected);
  EXPECT_EQ(a.state(), b.state());
  EXPECT_EQ(b.state(), (LossScaler::State{32, 11, 6, 2, 3}));

  // A fresh scaler given the same tail behaves differently: the state carried something.
  LossScaler fresh(o);
  EXPECT_NE(run(fresh, "..o...."), expected);
}

TEST(LossScaler, StaticScalerRestoresOnlyCounters) {
  LossScalerOptions o;
  o.static_scale = 128;
  LossScaler s(o);
  s.load_state(LossScaler::State{4096, 10, 7, 1, 3});
  EXPECT_EQ(s.scale(), 128);
  EXPECT_EQ(s.overflows(), 3);
  EXPECT_EQ(s.state().iter, 10);
}

TEST(LossScaler, LoadStateRejectsInconsistentStates) {
  LossScaler s(dynamic_options(64, 4, 2));
  const LossScaler::State good{32, 10, 5, 1, 2};
  s.load_state(good);
  auto bad = [&](LossScaler::State st) {
    return error_of<CheckpointError>([&] { s.load_state(st); });
  };
  LossScaler::State st = good;
  st.scale = 0;
  EXPECT_TRUE(contains(bad(st), "positive finite"));
  st = good;
  st.hysteresis = 0;
  EXPECT_TRUE(contains(bad(st), "hysteresis=0"));
  st = good;
  st.last_overflow_iter = 10;
  EXPECT_TRUE(contains(bad(st), "last_overflow_iter=10"));
  st = good;
  st.overflows = 7;
  EXPECT_TRUE(contains(bad(st), "overflows=7"));
  st = good;
  st.last_overflow_iter = -1;  // overflows recorded but never an overflow
  EXPECT_TRUE(contains(bad(st), "HINT:"));
  // A failed load leaves the scaler as it was.
  EXPECT_EQ(s.state(), good);
}

TEST(LossScaler, RejectsOutOfRangeOptions) {
  auto msg = [](LossScalerOptions o) { return error_of<ConfigError>([&] { LossScaler s(o); }); };
  LossScalerOptions o;
  o.scale_window = 0;
  EXPECT_TRUE(contains(msg(o), "fp16.loss_scale_window"));
  o = {};
  o.hysteresis = 0;
  EXPECT_TRUE(contains(msg(o), "fp16.hysteresis"));
  o = {};
  o.min_scale = 0;
  EXPECT_TRUE(contains(msg(o), "fp16.min_loss_scale"));
  o = {};
  o.static_scale = -1;
  EXPECT_TRUE(contains(msg(o), "fp16.loss_scale"));
  o = {};
  o.initial_scale = 1;
  o.min_scale = 4;
  std::string m = msg(o);
  EXPECT_TRUE(contains(m, "below fp16.min_loss_scale=4"));
  EXPECT_TRUE(contains(m, "HINT:"));
  // A static scale ignores the dynamic options entirely.
  o.static_scale = 8;
  EXPECT_EQ(LossScaler(o).scale(), 8);
}

}  // namespace
}  // namespace dscpp::precision
