// The `elasticity` section (src/config/elasticity.h, NOTE [elastic batch]): the batch size and
// the valid world sizes DeepSpeed 0.19's deepspeed/elasticity/elasticity.py computes for the
// same settings (each case's expected values were produced by that file's own functions), one
// train_batch_size across the valid world sizes, and the section's refusals.
#include "config/elasticity.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dscpp/config.h"
#include "dscpp/error.h"
#include "support/errors.h"
#include "support/scoped_env.h"

namespace dscpp {
namespace {

using testing::error_of;

struct Case {
  std::vector<int64_t> micro;
  int64_t max_batch, min_gpus, max_gpus;
  bool prefer_larger;
  int64_t per_node, world;
  double version;
  // DeepSpeed's answers.
  int64_t batch;
  std::vector<int64_t> valid;
  int64_t micro_batch;
};

const std::vector<int64_t> k1680Valid = {1,  2,  3,   4,   5,   6,   7,   8,   10,  12, 14,
                                         15, 20, 21,  24,  28,  30,  35,  40,  42,  56, 60,
                                         70, 84, 105, 120, 140, 168, 210, 280, 420, 840};

TEST(Elasticity, MatchesDeepSpeedsBatchAndWorldSizes) {
  const std::vector<Case> cases = {
      {{2, 4, 6}, 2000, 1, 10000, true, 1, 2, 0.1, 1680, k1680Valid, 6},
      {{2, 4, 6}, 2000, 1, 10000, true, 1, 3, 0.2, 1680, k1680Valid, 4},
      {{2, 4, 6}, 2000, 1, 10000, false, 1, 4, 0.1, 1680, k1680Valid, 6},
      {{2, 4, 6}, 2000, 1, 10000, true, 1, 7, 0.2, 1680, k1680Valid, 6},
      {{1}, 32, 1, 4, true, 1, 2, 0.1, 24, {1, 2, 3, 4}, 1},
      {{4, 8}, 64, 1, 8, true, 1, 2, 0.1, 48, {1, 2, 3, 4, 6}, 8},
      {{4, 8}, 64, 2, 8, false, 1, 4, 0.2, 48, {2, 3, 4, 6}, 4},
      {{3, 5}, 1000, 1, 16, true, 1, 5, 0.1, 720, {1, 2, 3, 4, 5, 6, 8, 9, 10, 12, 15, 16}, 3},
      {{8}, 512, 2, 64, true, 2, 4, 0.1, 480, {2, 3, 4, 5, 6, 10, 12, 15, 20, 30, 60}, 8},
      {{8}, 512, 2, 64, true, 2, 4, 0.2, 384, {2, 4, 6, 8, 12, 16, 24, 48}, 8},
      {{1, 2}, 100, 1, 100, true, 1, 3, 0.1, 96, {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96}, 2},
      {{6, 2}, 100, 1, 10, false, 1, 9, 0.2, 72, {1, 2, 3, 4, 6, 9}, 2},
      // Version 0.2 at a world size outside the valid list: a batch of its own.
      {{4, 8}, 64, 1, 8, true, 1, 5, 0.2, 60, {5}, 4},
      {{4, 8}, 64, 1, 8, false, 1, 5, 0.2, 40, {5}, 8},
      {{2, 3}, 30, 1, 4, true, 1, 7, 0.2, 28, {7}, 2},
  };
  for (const Case& c : cases) {
    ElasticityConfig e;
    e.enabled = true;
    e.micro_batch_sizes = c.micro;
    e.max_train_batch_size = c.max_batch;
    e.min_gpus = c.min_gpus;
    e.max_gpus = c.max_gpus;
    e.prefer_larger_batch = c.prefer_larger;
    e.num_gpus_per_node = c.per_node;
    e.version = c.version;
    const config::ElasticBatch b = config::elastic_batch(e, c.world);
    const std::string what = "max " + std::to_string(c.max_batch) + ", world " +
                             std::to_string(c.world) + ", version " + std::to_string(c.version);
    EXPECT_EQ(b.train_batch_size, c.batch) << what;
    EXPECT_EQ(b.valid_world_sizes, c.valid) << what;
    EXPECT_EQ(b.micro_batch, c.micro_batch) << what;
    EXPECT_EQ(b.train_batch_size, b.micro_batch * b.gradient_accumulation_steps * c.world) << what;
  }
}

constexpr const char* kElastic = R"({"elasticity": {"enabled": true,
  "max_train_batch_size": 2000, "micro_batch_sizes": [2, 4, 6], "min_gpus": 1, "max_gpus": 8,
  "version": 0.1}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})";

TEST(Elasticity, OneTrainBatchSizeAtEveryValidWorldSize) {
  // DeepSpeed: 1680 (12 x 140 = 2 x 840 = ...), valid at every world size in [1, 8].
  for (int world : {1, 2, 3, 4, 5, 6, 7, 8}) {
    Config c = Config::parse(kElastic);
    c.resolve_batch(world, "the test");
    EXPECT_EQ(c.batch.train_batch_size, 1680) << world;
    EXPECT_EQ(c.batch.train_batch_size,
              c.batch.train_micro_batch_size_per_gpu * c.batch.gradient_accumulation_steps * world)
        << world;
    EXPECT_NE(c.describe().find("elasticity.micro_batch_sizes = [2, 4, 6]"), std::string::npos);
    EXPECT_NE(c.describe().find("(elasticity: valid at world sizes [1, 2, 3, 4, 5, 6, 7, 8])"),
              std::string::npos)
        << c.describe();
  }
}

TEST(Elasticity, RefusesWhatItCannotHonour) {
  auto resolve = [](const std::string& json, int world) {
    return error_of<ConfigError>([&] { Config::parse(json).resolve_batch(world, "the test"); });
  };
  // Batch keys beside an enabled section, unless told to ignore them.
  std::string msg = resolve(
      R"({"train_batch_size": 16, "elasticity": {"enabled": true, "max_train_batch_size": 64,
          "micro_batch_sizes": [4]}})",
      2);
  EXPECT_NE(msg.find("ignore_non_elastic_batch_info"), std::string::npos) << msg;
  Config ignored = Config::parse(
      R"({"train_batch_size": 16, "elasticity": {"enabled": true, "max_train_batch_size": 64,
          "micro_batch_sizes": [4], "ignore_non_elastic_batch_info": true}})");
  ignored.resolve_batch(2, "the test");
  Config hinted = Config::parse(R"({"elasticity": {"enabled": true, "max_train_batch_size": 64,
                                   "micro_batch_sizes": [4], "min_time": 20}})");
  ASSERT_FALSE(hinted.warnings.empty());
  EXPECT_NE(hinted.warnings.back().find("elasticity.min_time is a hint"), std::string::npos);
  EXPECT_EQ(ignored.batch.train_batch_size, 48);
  ASSERT_FALSE(ignored.warnings.empty());
  EXPECT_NE(ignored.warnings.back().find("train_batch_size 16 ignored"), std::string::npos);
  // Version 0.1 at a world size its batch does not split into.
  msg = resolve(R"({"elasticity": {"enabled": true, "max_train_batch_size": 64,
                   "micro_batch_sizes": [4, 8], "max_gpus": 8, "version": 0.1}})",
                5);
  EXPECT_NE(msg.find("world size 5 is not one of"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[1, 2, 3, 4, 6]"), std::string::npos) << msg;
  // The section's own checks.
  auto parse = [](const std::string& json) {
    return error_of<ConfigError>([&] { Config::parse(json); });
  };
  EXPECT_NE(parse(R"({"elasticity": {"enabled": true, "micro_batch_sizes": [2]}})")
                .find("max_train_batch_size: is required"),
            std::string::npos);
  EXPECT_NE(parse(R"({"elasticity": {"enabled": true, "max_train_batch_size": 8,
                      "micro_batch_sizes": [2], "version": 0.3}})")
                .find("must be 0.1 or 0.2"),
            std::string::npos);
  EXPECT_NE(parse(R"({"elasticity": {"enabled": true, "max_train_batch_size": 8,
                      "micro_batch_sizes": [2], "model_parallel_size": 2}})")
                .find("no model parallelism"),
            std::string::npos);
  EXPECT_NE(parse(R"({"elasticity": {"enabled": true, "max_train_batch_size": 8,
                      "micro_batch_sizes": [0]}})")
                .find("positive integers"),
            std::string::npos);
  EXPECT_NE(parse(R"({"elasticity": {"enabled": true, "max_train_batch_size": 8,
                      "micro_batch_sizes": [2], "min_gpus": 4, "max_gpus": 2}})")
                .find("must be >= min_gpus 4"),
            std::string::npos);
  // Version 0.2 at a world size outside the list, with no batch of its own: DeepSpeed asserts.
  msg = resolve(R"({"elasticity": {"enabled": true, "max_train_batch_size": 8,
                   "micro_batch_sizes": [4], "max_gpus": 2}})",
                3);
  EXPECT_NE(msg.find("raise max_train_batch_size to at least 12"), std::string::npos) << msg;
  msg = resolve(R"({"elasticity": {"enabled": true, "max_train_batch_size": 8,
                   "micro_batch_sizes": [16]}})",
                1);
  EXPECT_NE(msg.find("at most max_train_batch_size 8"), std::string::npos) << msg;
  // A resource scheduler that saw another section.
  {
    testing::ScopedEnv env("DEEPSPEED_ELASTICITY_CONFIG",
                           R"({"max_train_batch_size": 2000, "micro_batch_sizes": [2, 4]})");
    msg = resolve(kElastic, 2);
    EXPECT_NE(msg.find("elasticity.micro_batch_sizes differs"), std::string::npos) << msg;
  }
  {
    testing::ScopedEnv env("DEEPSPEED_ELASTICITY_CONFIG",
                           R"({"max_train_batch_size": 2000, "micro_batch_sizes": [2, 4, 6],
                               "version": 0.1})");
    Config c = Config::parse(kElastic);
    c.resolve_batch(2, "the test");
    EXPECT_EQ(c.batch.train_batch_size, 1680);
  }
}

}  // namespace
}  // namespace dscpp
