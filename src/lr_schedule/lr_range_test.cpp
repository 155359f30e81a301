// LRRangeTest: DeepSpeed's learning-rate range test (deepspeed/runtime/lr_schedules.py), an LR
// rising linearly with the step count, continuously or in stairs.
#include <cmath>

#include "dscpp/error.h"
#include "dscpp/lr_schedule.h"

namespace dscpp {

LRRangeTest::LRRangeTest(const LRRangeTestParams& params, double optimizer_lr) : p_(params) {
  DSCPP_CHECK(params.lr_range_test_step_size > 0, ConfigError,
              "scheduler.params.lr_range_test_step_size must be > 0, got ",
              params.lr_range_test_step_size);
  start(params.last_batch_iteration, params.lr_range_test_min_lr, std::nullopt, optimizer_lr);
}

double LRRangeTest::lr_at(int64_t it) const {
  double interval = static_cast<double>(it + 1) / static_cast<double>(p_.lr_range_test_step_size);
  if (p_.lr_range_test_staircase) interval = std::floor(interval);
  return p_.lr_range_test_min_lr * (1.0 + p_.lr_range_test_step_rate * interval);
}

}  // namespace dscpp
