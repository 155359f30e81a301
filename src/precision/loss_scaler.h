// LossScaler: DeepSpeed's fp16 loss scale (runtime/fp16/loss_scaler.py), without libtorch.
//
// The engine multiplies the loss by scale() before backward, checks the gradients for inf/NaN,
// skips the optimizer step when they overflowed, and then calls update(overflow) once per step
// attempt. A static scaler (fp16.loss_scale > 0) never changes its scale. A dynamic one runs
// DeepSpeed's DynamicLossScaler state machine; `iter` counts update() calls from 0:
//
//   overflow:  if the hysteresis counter is 1 (or hysteresis is configured as 1), the scale is
//              divided by scale_factor, but not below min_scale; if it was already at
//              min_scale, update() throws instead (raise_error_at_min_scale). Otherwise the
//              counter drops by one and the scale stays. Either way the overflow restarts the
//              window: last_overflow_iter = iter.
//   clean:     with consecutive_hysteresis the counter refills after every clean step. When
//              (iter - last_overflow_iter) % scale_window == 0 (scale_window clean steps since
//              the last overflow, or since the start) the scale is multiplied by scale_factor,
//              and without consecutive_hysteresis that is the only moment the counter refills.
//
// So with the default hysteresis 2 the first overflow only spends the counter, and after the
// first halving every further overflow halves at once until a whole clean window has passed.
// There is no upper bound on the scale.
//
// NOTE [fp16 defaults]: DeepSpeed's ZeRO path hands its optimizer no dynamic-scaling arguments
// when the "fp16" block names none of initial_scale_power / loss_scale_window / hysteresis /
// consecutive_hysteresis / min_loss_scale, and then runs with the scaler's own constructor
// defaults (2^32 and hysteresis 1). dscpp always uses the documented config defaults (2^16,
// hysteresis 2), whichever keys were given.
//
// Not thread-safe; the engine's step owns it.
#pragma once

#include <cstdint>
#include <string>

#include "dscpp/config.h"

namespace dscpp::precision {

struct LossScalerOptions {
  // > 0: a fixed loss scale (fp16.loss_scale); the fields below are then unused.
  // 0 (default): dynamic loss scaling.
  double static_scale = 0;
  // Dynamic scale at the start: 2^fp16.initial_scale_power. Default 2^16. >= min_scale.
  double initial_scale = 65536;
  // Clean steps since the last overflow before the scale is raised (fp16.loss_scale_window).
  // Default 1000. >= 1.
  int scale_window = 1000;
  // Overflows needed to lower the scale while the counter is full (fp16.hysteresis; DeepSpeed's
  // delayed_shift). Default 2. >= 1.
  int hysteresis = 2;
  // Refill the hysteresis counter after every clean step instead of only when the scale is
  // raised (fp16.consecutive_hysteresis). Default false.
  bool consecutive_hysteresis = false;
  // Floor of the dynamic scale (fp16.min_loss_scale). Default 1. > 0.
  double min_scale = 1;
  // Factor by which the scale is lowered and raised. Default 2 (fixed in DeepSpeed). > 1.
  double scale_factor = 2;
  // Whether an overflow that would lower the scale below min_scale throws (DeepSpeed's
  // default, true) or leaves the scale at min_scale and carries on skipping steps.
  bool raise_error_at_min_scale = true;

  // The options DeepSpeed builds from the "fp16" block. With fp16 disabled (bf16 or fp32
  // training) the result is a static scale of 1, a scaler that does nothing, as DeepSpeed's.
  static LossScalerOptions from_config(const Fp16Config& fp16);
};

class LossScaler {
 public:
  // Throws ConfigError, naming the fp16 key, when an option is out of range (see above).
  explicit LossScaler(LossScalerOptions options);

  // The scale to multiply the next loss by.
  double scale() const { return scale_; }
  bool dynamic() const { return options_.static_scale == 0; }
  const LossScalerOptions& options() const { return options_; }
  // Steps whose gradients overflowed (and so were skipped) so far, checkpoints included.
  int64_t overflows() const { return overflows_; }

  // Records the outcome of one optimizer step attempt (overflow: the gradients had an inf or
  // NaN and the step was skipped) and moves the scale as the header comment describes.
  // Throws dscpp::Error, with a HINT, on an overflow with the dynamic scale already at
  // min_scale and no hysteresis left (unless raise_error_at_min_scale is off); the scaler is
  // then left exactly as it was before the call.
  void update(bool overflow);

  // Everything that changes during training, for checkpoints.
  struct State {
    double scale = 0;
    int64_t iter = 0;                 // update() calls so far
    int64_t last_overflow_iter = -1;  // iter of the last overflow; -1: none yet
    int hysteresis = 0;               // overflows left before the scale is lowered
    int64_t overflows = 0;            // steps skipped so far
    bool operator==(const State&) const = default;
  };
  State state() const;
  // Restores a state taken by state(); the scaler then continues exactly as the one it came
  // from (given the same options). A static scaler keeps its configured scale and restores
  // only the counters. Throws CheckpointError when the state is inconsistent (a scale that is
  // not a positive finite number, hysteresis < 1, last_overflow_iter outside [-1, iter),
  // overflows outside [0, last_overflow_iter + 1]). The hysteresis counter may exceed the
  // configured hysteresis (a checkpoint written under another config); it is used as it is.
  void load_state(const State& state);

  // One line for logs, e.g. "loss scale 65536 (dynamic: hysteresis 2/2, window 1000, min 1;
  // 0 of 0 steps skipped)" or "loss scale 128 (static; 3 of 500 steps skipped)".
  std::string describe() const;

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t iter_ = 0;
  int64_t last_overflow_iter_ = -1;
  int hysteresis_;
  int64_t overflows_ = 0;
};

}  // namespace dscpp::precision
