// What the offload tests share: the zero_optimization section with an offload_optimizer, and
// the bit-for-bit comparison of trajectories.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/test_net.h"

namespace dscpp::offloadtest {

// Stage `stage` (at stage 3 every parameter sharded) with `offload` as offload_optimizer (none
// when empty) in sub-groups of `sub_group` elements.
inline std::string zero_cfg(int stage, const std::string& offload = "", int sub_group = 32) {
  return ", \"zero_optimization\": {\"stage\": " + std::to_string(stage) +
         (stage == 3 ? ", \"stage3_param_persistence_threshold\": 0" : "") +
         (offload.empty() ? ""
                          : ", \"sub_group_size\": " + std::to_string(sub_group) +
                                ", \"offload_optimizer\": " + offload) +
         "}";
}

// Bit for bit: every loss and grad norm (a skipped step's norm is not finite in both), and the
// final parameters.
inline void expect_identical(const std::vector<enginetest::Trajectory>& got,
                             const std::vector<enginetest::Trajectory>& ref,
                             const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (size_t r = 0; r < got.size(); ++r) {
    ASSERT_EQ(got[r].losses.size(), ref[r].losses.size()) << what;
    for (size_t i = 0; i < ref[r].losses.size(); ++i) {
      EXPECT_EQ(got[r].losses[i], ref[r].losses[i]) << what << " rank " << r << " step " << i;
      const double a = got[r].grad_norms[i], b = ref[r].grad_norms[i];
      EXPECT_TRUE(a == b || (!std::isfinite(a) && !std::isfinite(b)))
          << what << " rank " << r << " step " << i << ": " << a << " vs " << b;
    }
    EXPECT_TRUE(at::equal(got[r].params, ref[r].params)) << what << " rank " << r;
  }
}

}  // namespace dscpp::offloadtest
