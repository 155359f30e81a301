// LossScaler: the static and dynamic fp16 loss scale (see loss_scaler.h for the state machine).
#include "precision/loss_scaler.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <utility>

#include "dscpp/error.h"

namespace dscpp::precision {
namespace {

// The shortest text that reads back as `x`: 65536, 4294967296, 0.25.
std::string number(double x) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), x);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(x);
}

bool positive_finite(double x) { return std::isfinite(x) && x > 0; }

}  // namespace

LossScalerOptions LossScalerOptions::from_config(const Fp16Config& fp16) {
  LossScalerOptions o;
  if (!fp16.enabled) {
    o.static_scale = 1.0;
    return o;
  }
  o.static_scale = fp16.loss_scale;
  o.initial_scale = std::ldexp(1.0, fp16.initial_scale_power);
  o.scale_window = fp16.loss_scale_window;
  o.hysteresis = fp16.hysteresis;
  o.consecutive_hysteresis = fp16.consecutive_hysteresis;
  o.min_scale = fp16.min_loss_scale;
  return o;
}

LossScaler::LossScaler(LossScalerOptions options) : options_(std::move(options)) {
  const LossScalerOptions& o = options_;
  DSCPP_CHECK(std::isfinite(o.static_scale) && o.static_scale >= 0, ConfigError,
              "fp16.loss_scale must be 0 (dynamic) or a positive number, got ",
              number(o.static_scale));
  if (dynamic()) {
    DSCPP_CHECK(positive_finite(o.initial_scale), ConfigError,
                "the initial fp16 loss scale (2^fp16.initial_scale_power) must be a positive "
                "finite number, got ",
                number(o.initial_scale));
    DSCPP_CHECK(o.scale_window >= 1, ConfigError, "fp16.loss_scale_window must be >= 1, got ",
                o.scale_window);
    DSCPP_CHECK(o.hysteresis >= 1, ConfigError, "fp16.hysteresis must be >= 1, got ", o.hysteresis);
    DSCPP_CHECK(positive_finite(o.min_scale), ConfigError,
                "fp16.min_loss_scale must be a positive number, got ", number(o.min_scale));
    DSCPP_CHECK(std::isfinite(o.scale_factor) && o.scale_factor > 1, ConfigError,
                "the fp16 loss scale factor must be > 1, got ", number(o.scale_factor));
    DSCPP_CHECK(o.initial_scale >= o.min_scale, ConfigError, "the initial fp16 loss scale ",
                number(o.initial_scale),
                " (2^fp16.initial_scale_power) is below fp16.min_loss_scale=", number(o.min_scale),
                ". HINT: raise fp16.initial_scale_power or lower fp16.min_loss_scale.");
  }
  scale_ = dynamic() ? o.initial_scale : o.static_scale;
  hysteresis_ = o.hysteresis;
}

void LossScaler::update(bool overflow) {
  if (!dynamic()) {
    // A static scale never moves; the skipped step is only counted.
    if (overflow) {
      last_overflow_iter_ = iter_;
      ++overflows_;
    }
    ++iter_;
    return;
  }

  const LossScalerOptions& o = options_;
  if (overflow) {
    if (o.hysteresis == 1 || hysteresis_ == 1) {
      // No hysteresis left: lower the scale, or give up when it cannot go lower.
      DSCPP_CHECK(
          !(scale_ == o.min_scale && o.raise_error_at_min_scale), Error,
          "fp16 gradients overflowed at optimizer step ", iter_ + 1,
          " with the loss scale already at its minimum (fp16.min_loss_scale=", number(o.min_scale),
          "), so it cannot be lowered further; ", overflows_, " of the ", iter_,
          " earlier steps were skipped for overflow. HINT: lower the learning rate, "
          "enable gradient_clipping, use bf16 instead of fp16, or lower "
          "fp16.min_loss_scale.");
      scale_ = std::max(scale_ / o.scale_factor, o.min_scale);
    } else {
      --hysteresis_;
    }
    last_overflow_iter_ = iter_;
    ++overflows_;
  } else {
    const bool window_done = (iter_ - last_overflow_iter_) % o.scale_window == 0;
    if (o.consecutive_hysteresis || window_done) hysteresis_ = o.hysteresis;
    if (window_done) scale_ *= o.scale_factor;
  }
  ++iter_;
}

LossScaler::State LossScaler::state() const {
  return State{scale_, iter_, last_overflow_iter_, hysteresis_, overflows_};
}

void LossScaler::load_state(const State& s) {
  DSCPP_CHECK(positive_finite(s.scale), CheckpointError,
              "loss scaler state: the loss scale must be a positive finite number, got ",
              number(s.scale), ". HINT: the checkpoint is damaged or was not written by dscpp.");
  DSCPP_CHECK(s.hysteresis >= 1 && s.iter >= 0 && s.last_overflow_iter >= -1 &&
                  s.last_overflow_iter < s.iter && s.overflows >= 0 &&
                  s.overflows <= s.last_overflow_iter + 1,
              CheckpointError, "loss scaler state is inconsistent: iter=", s.iter,
              " last_overflow_iter=", s.last_overflow_iter, " hysteresis=", s.hysteresis,
              " overflows=", s.overflows,
              " (expected hysteresis >= 1, -1 <= last_overflow_iter < iter, 0 <= overflows <= "
              "last_overflow_iter + 1). HINT: the checkpoint is damaged or was not written by "
              "dscpp.");
  scale_ = dynamic() ? s.scale : options_.static_scale;
  iter_ = s.iter;
  last_overflow_iter_ = s.last_overflow_iter;
  hysteresis_ = s.hysteresis;
  overflows_ = s.overflows;
}

std::string LossScaler::describe() const {
  std::string out = "loss scale " + number(scale_);
  if (dynamic()) {
    out += " (dynamic: hysteresis " + std::to_string(hysteresis_) + "/" +
           std::to_string(options_.hysteresis) + ", window " +
           std::to_string(options_.scale_window) + ", min " + number(options_.min_scale) + "; ";
  } else {
    out += " (static; ";
  }
  out += std::to_string(overflows_) + " of " + std::to_string(iter_) + " steps skipped)";
  return out;
}

}  // namespace dscpp::precision
