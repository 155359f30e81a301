// Tests of the DeepSpeed config layer: DeepSpeed's own batch-triangle cases, strictness
// (unknown keys with suggestions, types, ranges, "auto", the verdicts on keys dscpp does not act
// on), every section's defaults, parsing from files and strings, and describe().
#include "dscpp/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "config/key_verdicts.h"
#include "config/keys.h"
#include "dscpp/error.h"
#include "support/errors.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"
#include "util/strings.h"

namespace dscpp {
namespace {

using nlohmann::json;

// The message of the ErrorType (default ConfigError) that fn throws; see support/errors.h.
template <typename ErrorType = ConfigError>
std::string error_of(const std::function<void()>& fn) {
  return dscpp::testing::error_of<ErrorType>(fn);
}

std::string parse_error(const std::string& text) {
  return error_of([&] { Config::parse(text); });
}

bool has_warning(const Config& c, const std::string& part) {
  for (const std::string& w : c.warnings)
    if (w.find(part) != std::string::npos) return true;
  return false;
}

// ----- batch triangle: DeepSpeed's tests/unit/runtime/test_ds_config_dict.py cases, world 2 --

struct Triple {
  int train, micro, gas;
};

// Builds a config from the subset of the triple selected by mask (bit 0 train, 1 micro, 2 gas).
Config batch_config(const Triple& t, int mask) {
  json j = json::object();
  if (mask & 1) j["train_batch_size"] = t.train;
  if (mask & 2) j["train_micro_batch_size_per_gpu"] = t.micro;
  if (mask & 4) j["gradient_accumulation_steps"] = t.gas;
  return Config::from_json(j);
}

constexpr int kTrain = 1, kMicro = 2, kGas = 4;

TEST(ConfigBatch, DeepSpeedPassingCasesResolveFromEveryDeterminingSubset) {
  for (const Triple& t : {Triple{32, 16, 1}, Triple{32, 8, 2}}) {
    std::vector<int> subsets = {kTrain | kMicro | kGas, kTrain | kMicro, kTrain | kGas,
                                kMicro | kGas};
    // With gas 1, one of train / micro alone determines the triple (gas defaults to 1).
    if (t.gas == 1) {
      subsets.push_back(kTrain);
      subsets.push_back(kMicro);
    }
    for (int mask : subsets) {
      SCOPED_TRACE("triple " + std::to_string(t.train) + "," + std::to_string(t.micro) + "," +
                   std::to_string(t.gas) + " mask " + std::to_string(mask));
      Config c = batch_config(t, mask);
      c.resolve_batch(2, "test");
      EXPECT_EQ(c.batch.train_batch_size, t.train);
      EXPECT_EQ(c.batch.train_micro_batch_size_per_gpu, t.micro);
      EXPECT_EQ(c.batch.gradient_accumulation_steps, t.gas);
      EXPECT_EQ(c.batch.world_size, 2);
      EXPECT_EQ(c.batch.world_source, "test");
    }
    // gas alone never determines anything.
    std::string msg = error_of([&] { batch_config(t, kGas).resolve_batch(2, "test"); });
    EXPECT_NE(msg.find("Either train_batch_size or train_micro_batch_size_per_gpu needs to be "
                       "provided"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("only gradient_accumulation_steps " + std::to_string(t.gas)),
              std::string::npos)
        << msg;
  }
  // (32, 8, 2): train or micro alone is a valid config too, but for another triple (gas 1).
  Config only_train = batch_config({32, 8, 2}, kTrain);
  only_train.resolve_batch(2, "test");
  EXPECT_EQ(only_train.batch.train_micro_batch_size_per_gpu, 16);
  EXPECT_EQ(only_train.batch.gradient_accumulation_steps, 1);
  Config only_micro = batch_config({32, 8, 2}, kMicro);
  only_micro.resolve_batch(2, "test");
  EXPECT_EQ(only_micro.batch.train_batch_size, 16);
  EXPECT_EQ(only_micro.batch.gradient_accumulation_steps, 1);
}

TEST(ConfigBatch, DeepSpeedFailingCasesNeverResolveToTheGivenTriple) {
  for (const Triple& t : {Triple{33, 17, 2}, Triple{32, 18, 1}}) {
    for (int mask = 1; mask < 8; ++mask) {
      SCOPED_TRACE("triple " + std::to_string(t.train) + "," + std::to_string(t.micro) + "," +
                   std::to_string(t.gas) + " mask " + std::to_string(mask));
      Config c = batch_config(t, mask);
      try {
        c.resolve_batch(2, "WORLD_SIZE set by dscpp launch");
      } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("WORLD_SIZE set by dscpp launch"), std::string::npos)
            << e.what();
        continue;
      }
      // A subset that resolves (micro + gas, micro alone, ...) resolves consistently, to a
      // different triple than the inconsistent one given.
      const BatchSizes& b = c.batch;
      EXPECT_EQ(b.train_batch_size,
                b.train_micro_batch_size_per_gpu * b.gradient_accumulation_steps * 2);
      EXPECT_FALSE(b.train_batch_size == t.train && b.train_micro_batch_size_per_gpu == t.micro &&
                   b.gradient_accumulation_steps == t.gas);
    }
  }
}

TEST(ConfigBatch, DeepSpeedFailingCasesShowTheArithmetic) {
  const std::string src = "WORLD_SIZE set by dscpp launch";
  // All three of (33, 17, 2).
  std::string msg = error_of([&] { batch_config({33, 17, 2}, 7).resolve_batch(2, src); });
  EXPECT_NE(msg.find("train_batch_size 33 != train_micro_batch_size_per_gpu 17 * "
                     "gradient_accumulation_steps 2 * world size 2"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("world size 2 from WORLD_SIZE set by dscpp launch"), std::string::npos);
  EXPECT_NE(msg.find("= 68"), std::string::npos) << msg;  // the consistent train_batch_size
  // train + micro of (33, 17, 2): gas = 33 // 17 // 2 = 0.
  msg = error_of([&] { batch_config({33, 17, 2}, kTrain | kMicro).resolve_batch(2, src); });
  EXPECT_NE(msg.find("gradient_accumulation_steps 0 has to be greater than 0"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("derived: train_batch_size 33 // train_micro_batch_size_per_gpu 17 // "
                     "world size 2"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("= 34"), std::string::npos) << msg;
  // train + gas of (33, 17, 2): micro = 33 // 2 // 2 = 8, and 8 * 2 * 2 = 32 != 33.
  msg = error_of([&] { batch_config({33, 17, 2}, kTrain | kGas).resolve_batch(2, src); });
  EXPECT_NE(msg.find("train_batch_size 33 != train_micro_batch_size_per_gpu 8 * "
                     "gradient_accumulation_steps 2 * world size 2"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("train_micro_batch_size_per_gpu 8 derived: train_batch_size 33 // world "
                     "size 2 // gradient_accumulation_steps 2"),
            std::string::npos)
      << msg;
  // All three of (32, 18, 1): 18 * 1 * 2 = 36.
  msg = error_of([&] { batch_config({32, 18, 1}, 7).resolve_batch(2, src); });
  EXPECT_NE(msg.find("train_batch_size 32 != train_micro_batch_size_per_gpu 18 * "
                     "gradient_accumulation_steps 1 * world size 2"),
            std::string::npos)
      << msg;
  // train + micro of (32, 18, 1): gas = 32 // 18 // 2 = 0.
  msg = error_of([&] { batch_config({32, 18, 1}, kTrain | kMicro).resolve_batch(2, src); });
  EXPECT_NE(msg.find("gradient_accumulation_steps 0 has to be greater than 0"), std::string::npos)
      << msg;
  // train alone of (33, 17, 2): micro = 16, gas = 1, 16 * 1 * 2 = 32 != 33.
  msg = error_of([&] { batch_config({33, 17, 2}, kTrain).resolve_batch(2, src); });
  EXPECT_NE(msg.find("train_batch_size 33 != train_micro_batch_size_per_gpu 16 * "
                     "gradient_accumulation_steps 1 * world size 2"),
            std::string::npos)
      << msg;
}

TEST(ConfigBatch, EverySubsetRuleAtWorldSizeFour) {
  auto resolve = [](const std::string& text) {
    Config c = Config::parse(text);
    c.resolve_batch(4, "test");
    return c.batch;
  };
  BatchSizes b = resolve(R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4})");
  EXPECT_EQ(b.gradient_accumulation_steps, 4);  // 64 // 4 // 4
  b = resolve(R"({"train_batch_size": 64, "gradient_accumulation_steps": 2})");
  EXPECT_EQ(b.train_micro_batch_size_per_gpu, 8);  // 64 // 4 // 2
  b = resolve(R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 3})");
  EXPECT_EQ(b.train_batch_size, 48);  // 4 * 3 * 4
  b = resolve(R"({"train_batch_size": 64})");
  EXPECT_EQ(b.train_micro_batch_size_per_gpu, 16);
  EXPECT_EQ(b.gradient_accumulation_steps, 1);
  b = resolve(R"({"train_micro_batch_size_per_gpu": 4})");
  EXPECT_EQ(b.train_batch_size, 16);
  EXPECT_EQ(b.gradient_accumulation_steps, 1);
  b = resolve(R"({"train_batch_size": 48, "train_micro_batch_size_per_gpu": 4,
                  "gradient_accumulation_steps": 3})");
  EXPECT_EQ(b.train_batch_size, 48);
  // Integer division truncates as in DeepSpeed, then the assertion catches the remainder.
  std::string msg = error_of([] {
    Config c = Config::parse(R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 3})");
    c.resolve_batch(1, "test");
  });
  EXPECT_NE(msg.find("train_batch_size 10 != train_micro_batch_size_per_gpu 3 * "
                     "gradient_accumulation_steps 3 * world size 1"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("must be a multiple of train_micro_batch_size_per_gpu * world size 1 = 3"),
            std::string::npos)
      << msg;
  // Nothing at all.
  msg = error_of([] { Config::parse("{}").resolve_batch(1, "test"); });
  EXPECT_NE(msg.find("none of the three batch keys is given"), std::string::npos) << msg;
}

TEST(ConfigBatch, MismatchNamesWhereTheWorldSizeCameFrom) {
  Config c = Config::parse(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
                               "gradient_accumulation_steps": 2})");
  std::string msg = error_of([&] { c.resolve_batch(3, "WORLD_SIZE set by dscpp launch"); });
  EXPECT_NE(msg.find("train_batch_size 32 != train_micro_batch_size_per_gpu 4 * "
                     "gradient_accumulation_steps 2 * world size 3 (world size 3 from WORLD_SIZE "
                     "set by dscpp launch)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("HINT: give only two of the three keys"), std::string::npos) << msg;
  EXPECT_NE(msg.find("= 24"), std::string::npos) << msg;
  EXPECT_FALSE(c.batch.resolved());
}

TEST(ConfigBatch, AutoMeansNotGiven) {
  Config c = Config::parse(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 8,
                               "gradient_accumulation_steps": 2})");
  EXPECT_FALSE(c.train_batch_size.has_value());
  c.resolve_batch(2, "test");
  EXPECT_EQ(c.batch.train_batch_size, 32);
  EXPECT_EQ(c.origins.at("train_batch_size"),
            "auto -> derived: train_micro_batch_size_per_gpu 8 * gradient_accumulation_steps 2 "
            "* world size 2");
  EXPECT_TRUE(has_warning(c, "train_batch_size is \"auto\""));
}

TEST(ConfigBatch, ResolvesAgainForAnotherWorldSize) {
  Config c = Config::parse(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 8})");
  c.resolve_batch(2, "first");
  EXPECT_EQ(c.batch.gradient_accumulation_steps, 2);
  c.resolve_batch(4, "second");
  EXPECT_EQ(c.batch.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.batch.world_source, "second");
  EXPECT_EQ(c.origins.at("gradient_accumulation_steps"),
            "derived: train_batch_size 32 // train_micro_batch_size_per_gpu 8 // world size 4");
}

TEST(ConfigBatch, GivenValuesMustBePositiveAndWorldSizeAtLeastOne) {
  EXPECT_NE(parse_error(R"({"train_batch_size": 0})")
                .find("train_batch_size: must be an integer > 0, got 0"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"gradient_accumulation_steps": -2})")
                .find("gradient_accumulation_steps: must be an integer > 0, got -2"),
            std::string::npos);
  Config c = Config::parse(R"({"train_batch_size": 8})");
  std::string msg = error_of([&] { c.resolve_batch(0, "nowhere"); });
  EXPECT_NE(msg.find("world size must be >= 1, got 0 (from nowhere)"), std::string::npos) << msg;
  // train 1 at world 2: micro = 1 // 2 = 0.
  msg = error_of([] { Config::parse(R"({"train_batch_size": 1})").resolve_batch(2, "test"); });
  EXPECT_NE(msg.find("train_micro_batch_size_per_gpu 0 has to be greater than 0"),
            std::string::npos)
      << msg;
}

// ----- unknown keys: error with the nearest known key, at every depth --------------------------

TEST(ConfigUnknownKey, RootSuggestsNearest) {
  EXPECT_EQ(parse_error(R"({"gradient_accumulation_step": 2})"),
            "unknown key 'gradient_accumulation_step' at config root; did you mean "
            "'gradient_accumulation_steps'?");
  EXPECT_EQ(parse_error(R"({"steps_per_prnt": 5})"),
            "unknown key 'steps_per_prnt' at config root; did you mean 'steps_per_print'?");
  // A misspelt unimplemented DeepSpeed key is suggested too.
  EXPECT_EQ(parse_error(R"({"pipline": {}})"),
            "unknown key 'pipline' at config root; did you mean 'pipeline'?");
}

TEST(ConfigUnknownKey, ZeroOptimization) {
  EXPECT_EQ(parse_error(R"({"zero_optimization": {"stage": 2, "reduce_bucket_sise": 1000}})"),
            "unknown key 'reduce_bucket_sise' at zero_optimization; did you mean "
            "'reduce_bucket_size'?");
  EXPECT_EQ(parse_error(R"({"zero_optimization": {"stag": 2}})"),
            "unknown key 'stag' at zero_optimization; did you mean 'stage'?");
}

TEST(ConfigUnknownKey, OffloadOptimizer) {
  EXPECT_EQ(parse_error(R"({"zero_optimization": {"stage": 2,
                            "offload_optimizer": {"device": "cpu", "pin_memroy": true}}})"),
            "unknown key 'pin_memroy' at zero_optimization.offload_optimizer; did you mean "
            "'pin_memory'?");
  EXPECT_EQ(parse_error(R"({"zero_optimization": {"stage": 3,
                            "offload_param": {"device": "cpu", "max_in_cpus": 5}}})"),
            "unknown key 'max_in_cpus' at zero_optimization.offload_param; did you mean "
            "'max_in_cpu'?");
}

TEST(ConfigUnknownKey, OptimizerAndSchedulerParams) {
  EXPECT_EQ(parse_error(R"({"optimizer": {"type": "AdamW", "params": {"weight_decy": 0.1}}})"),
            "unknown key 'weight_decy' at optimizer.params; did you mean 'weight_decay'?");
  // A real parameter of another optimizer type is unknown for this one.
  std::string msg = parse_error(R"({"optimizer": {"type": "Adam", "params": {"momentum": 0.9}}})");
  EXPECT_NE(msg.find("unknown key 'momentum' at optimizer.params"), std::string::npos) << msg;
  EXPECT_NE(msg.find("HINT: the keys known here are: adam_w_mode, amsgrad, betas, "
                     "bias_correction, eps, lr, torch_adam, weight_decay"),
            std::string::npos)
      << msg;
  EXPECT_EQ(parse_error(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_max_l": 1}}})"),
            "unknown key 'warmup_max_l' at scheduler.params; did you mean 'warmup_max_lr'?");
  EXPECT_EQ(parse_error(R"({"optimizer": {"type": "SGD", "parms": {}}})"),
            "unknown key 'parms' at optimizer; did you mean 'params'?");
}

TEST(ConfigUnknownKey, OtherSectionsAndSeveralAtOnce) {
  EXPECT_EQ(parse_error(R"({"fp16": {"enabled": true, "loss_scale_windows": 100}})"),
            "unknown key 'loss_scale_windows' at fp16; did you mean 'loss_scale_window'?");
  EXPECT_EQ(parse_error(R"({"checkpoint": {"parallel_write": {"pipeline_stages": true}}})"),
            "unknown key 'pipeline_stages' at checkpoint.parallel_write; did you mean "
            "'pipeline_stage'?");
  EXPECT_EQ(parse_error(R"({"comms_logger": {"enable": true}})"),
            "unknown key 'enable' at comms_logger; did you mean 'enabled'?");
  std::string msg = parse_error(R"({"aio": {"blok_size": 1, "queue_deph": 2}})");
  EXPECT_NE(msg.find("unknown key 'blok_size' at aio; did you mean 'block_size'?"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("unknown key 'queue_deph' at aio; did you mean 'queue_depth'?"),
            std::string::npos)
      << msg;
  msg = parse_error(R"({"completely_unrelated_thing": 1})");
  EXPECT_NE(msg.find("unknown key 'completely_unrelated_thing' at config root. HINT: the keys "
                     "known here are: "),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("train_micro_batch_size_per_gpu"), std::string::npos);
}

// ----- types ----------------------------------------------------------------------------------

TEST(ConfigTypes, WrongTypeNamesPathExpectedAndFound) {
  // Outside the sections DeepSpeed validates with pydantic (NOTE [lax values]).
  std::string msg = parse_error(R"({"steps_per_print": "2"})");
  EXPECT_EQ(msg.rfind("steps_per_print: expected an integer, got string \"2\"", 0), 0u) << msg;
  EXPECT_NE(msg.find("HINT: write 2 without quotes"), std::string::npos) << msg;
  EXPECT_EQ(parse_error(R"({"aio": {"single_submit": 1}})"),
            "aio.single_submit: expected true or false, got number 1");
  msg = parse_error(R"({"prescale_gradients": "false"})");
  EXPECT_NE(msg.find("HINT: write false without quotes (DeepSpeed reads this key without "
                     "validation, where any non-empty string, \"false\" too, is true)"),
            std::string::npos)
      << msg;
  EXPECT_EQ(parse_error(R"({"fp16": {"enabled": 2}})"),
            "fp16.enabled: expected true or false, got number 2");
  EXPECT_EQ(parse_error(R"({"zero_optimization": {"reduce_bucket_size": 1.5}})"),
            "zero_optimization.reduce_bucket_size: expected an integer, got number 1.5");
  EXPECT_EQ(parse_error(R"({"optimizer": {"type": "Adam", "params": {"betas": 0.9}}})"),
            "optimizer.params.betas: expected an array of two numbers, got number 0.9");
  EXPECT_EQ(parse_error(R"({"comms_logger": {"prof_ops": "all_reduce"}})"),
            "comms_logger.prof_ops: expected an array of strings, got string \"all_reduce\"");
  EXPECT_EQ(parse_error(R"({"zero_optimization": [1]})"),
            "zero_optimization: expected an object, got array [1]");
  EXPECT_EQ(parse_error(R"({"optimizer": {"type": 3}})"),
            "optimizer.type: expected a string, got number 3");
  EXPECT_EQ(parse_error(R"({"wall_clock_breakdown": null})"),
            "wall_clock_breakdown: expected true or false, got null");
  EXPECT_NE(parse_error(R"({"zero_optimization": true})")
                .find("the boolean form is DeepSpeed's deprecated ZeRO format"),
            std::string::npos);
  EXPECT_EQ(error_of([] { Config::from_json(json::array()); }),
            "config root: expected an object, got array []");
}

TEST(ConfigTypes, IntegralFloatsAreIntegers) {
  Config c = Config::parse(R"({"zero_optimization": {"stage": 2.0, "reduce_bucket_size": 5e8,
      "allgather_bucket_size": 2e8, "sub_group_size": 1e12}, "train_batch_size": 3.2e1})");
  EXPECT_EQ(c.zero_optimization.stage, 2);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 500000000);
  EXPECT_EQ(c.zero_optimization.allgather_bucket_size, 200000000);
  EXPECT_EQ(c.zero_optimization.sub_group_size, 1000000000000);
  EXPECT_EQ(c.train_batch_size, 32);
  // Integers are fine where a number is expected.
  c = Config::parse(R"({"gradient_clipping": 1, "optimizer": {"type": "SGD",
                        "params": {"lr": 1}}})");
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.0);
  EXPECT_DOUBLE_EQ(c.optimizer.sgd.lr, 1.0);
  EXPECT_NE(parse_error(R"({"zero_optimization": {"stage": 1e30}})")
                .find("zero_optimization.stage: expected an integer, got number 1e+30"),
            std::string::npos);
}

// NOTE [lax values]: in the sections DeepSpeed validates with pydantic, what pydantic 2's lax
// mode coerces (each case below was run through DeepSpeed 0.19.8's models), noted; outside them
// and beyond those coercions, an error.
TEST(ConfigTypes, PydanticSectionsCoerceAsDeepSpeedDoes) {
  Config c = Config::parse(R"({"zero_optimization": {"stage": "2", "contiguous_gradients": "no",
      "reduce_scatter": 0, "overlap_comm": "On", "reduce_bucket_size": " 1_000 ",
      "allgather_bucket_size": "2.0", "sub_group_size": true,
      "offload_optimizer": {"device": "cpu", "pin_memory": "Y", "ratio": "1"}},
      "fp16": {"enabled": "TRUE", "loss_scale": "128", "initial_scale_power": "12"},
      "tensorboard": {"enabled": 1.0}})");
  EXPECT_EQ(c.zero_optimization.stage, 2);
  EXPECT_FALSE(c.zero_optimization.contiguous_gradients);
  EXPECT_FALSE(c.zero_optimization.reduce_scatter);
  EXPECT_TRUE(c.zero_optimization.overlap_comm);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 1000);
  EXPECT_EQ(c.zero_optimization.allgather_bucket_size, 2);
  EXPECT_EQ(c.zero_optimization.sub_group_size, 1);
  EXPECT_TRUE(c.zero_optimization.offload_optimizer.pin_memory);
  EXPECT_DOUBLE_EQ(c.zero_optimization.offload_optimizer.ratio, 1.0);
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_DOUBLE_EQ(c.fp16.loss_scale, 128.0);
  EXPECT_EQ(c.fp16.initial_scale_power, 12);
  EXPECT_TRUE(c.tensorboard.enabled);
  EXPECT_TRUE(has_warning(c,
                          "zero_optimization.stage: string \"2\" read as 2, as DeepSpeed's "
                          "validation (pydantic, lax) reads it"));
  EXPECT_EQ(c.origins.at("zero_optimization.contiguous_gradients"), "string \"no\" -> false");
  // null: an optional sub-section is absent, overlap_comm the stage's default; bf16 and aio as
  // DeepSpeed reads them at the top level.
  c = Config::parse(R"({"zero_optimization": {"stage": 3, "overlap_comm": null,
      "offload_param": null, "offload_optimizer": null}, "bf16": null, "aio": null})");
  EXPECT_EQ(c.zero_optimization.offload_param.device, "none");
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, "none");
  EXPECT_TRUE(c.zero_optimization.overlap_comm);
  EXPECT_FALSE(c.bf16.enabled);
  EXPECT_TRUE(has_warning(c, "zero_optimization.offload_param is null: read as absent"));
  // What pydantic refuses too.
  for (const char* bad :
       {R"({"zero_optimization": {"contiguous_gradients": 2}})",
        R"({"zero_optimization": {"contiguous_gradients": ""}})",
        R"({"zero_optimization": {"contiguous_gradients": 1.5}})",
        R"({"zero_optimization": {"contiguous_gradients": null}})",
        R"({"zero_optimization": {"stage": 2.5}})",
        R"({"zero_optimization": {"reduce_bucket_size": "5e8"}})",
        R"({"zero_optimization": {"reduce_bucket_size": "0x10"}})",
        R"({"zero_optimization": {"reduce_bucket_size": "2.5"}})",
        R"({"zero_optimization": {"reduce_bucket_size": null}})",
        R"({"zero_optimization": {"offload_optimizer": {"device": "CPU"}}})",
        R"({"fp16": {"enabled": true, "loss_scale_window": true}})",
        R"({"fp16": {"enabled": true, "loss_scale": false}})", R"({"zero_optimization": null})"})
    EXPECT_FALSE(parse_error(bad).empty()) << bad;
  EXPECT_EQ(parse_error(R"({"zero_optimization": {"stage": "4"}})"),
            "zero_optimization.stage: must be 0, 1, 2 or 3, got 4");
  // Outside them DeepSpeed reads the raw value: no coercion.
  for (const char* bad : {R"({"gradient_clipping": "1.0"})", R"({"prescale_gradients": 1})",
                          R"({"aio": {"block_size": "1048576"}})",
                          R"({"activation_checkpointing": {"cpu_checkpointing": "false"}})"})
    EXPECT_FALSE(parse_error(bad).empty()) << bad;
}

// ----- ranges ---------------------------------------------------------------------------------

TEST(ConfigRanges, OutOfRangeValuesAreErrors) {
  EXPECT_EQ(parse_error(R"({"zero_optimization": {"stage": 4}})"),
            "zero_optimization.stage: must be 0, 1, 2 or 3, got 4");
  EXPECT_EQ(parse_error(R"({"zero_optimization": {"reduce_bucket_size": -1}})"),
            "zero_optimization.reduce_bucket_size: must be > 0, got -1");
  EXPECT_EQ(parse_error(R"({"zero_optimization": {"allgather_bucket_size": 333}})"),
            "zero_optimization.allgather_bucket_size: must be a multiple of 2 (DeepSpeed asserts "
            "this), got 333");
  EXPECT_EQ(parse_error(R"({"zero_optimization": {"stage3_max_live_parameters": -5}})"),
            "zero_optimization.stage3_max_live_parameters: must be >= 0, got -5");
  EXPECT_EQ(parse_error(R"({"gradient_clipping": -1})"), "gradient_clipping: must be >= 0, got -1");
  EXPECT_EQ(parse_error(R"({"steps_per_print": 0})"), "steps_per_print: must be > 0, got 0");
  EXPECT_EQ(parse_error(R"({"zero_optimization": {"offload_optimizer": {"device": "disk"}}})"),
            "zero_optimization.offload_optimizer.device: must be one of none, cpu, nvme, got "
            "\"disk\"");
  EXPECT_EQ(parse_error(R"({"zero_optimization": {"offload_param": {"device": "CPU"}}})"),
            "zero_optimization.offload_param.device: must be one of none, cpu, nvme, got \"CPU\"; "
            "did you mean 'cpu'?");
  std::string msg = parse_error(
      R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}})");
  EXPECT_EQ(msg.rfind("zero_optimization.offload_optimizer.nvme_path: is required when device is "
                      "\"nvme\"",
                      0),
            0u)
      << msg;
  EXPECT_EQ(parse_error(R"({"zero_optimization": {"stage": 2,
                            "offload_optimizer": {"device": "cpu", "ratio": 0.5}}})"),
            "zero_optimization.offload_optimizer.ratio 0.5 < 1 (partial offload) needs stage 3, "
            "got stage 2 (DeepSpeed asserts this too)");
  EXPECT_EQ(parse_error(R"({"zero_optimization": {"offload_optimizer": {"ratio": 1.5}}})"),
            "zero_optimization.offload_optimizer.ratio: must be in [0, 1], got 1.5");
  EXPECT_EQ(parse_error(R"({"checkpoint": {"tag_validation": "Sometimes"}})"),
            "checkpoint.tag_validation: must be one of Ignore, Warn, Fail (any case), got "
            "\"Sometimes\"");
  EXPECT_EQ(parse_error(R"({"optimizer": {"type": "Adam", "params": {"betas": [0.9, 1.0]}}})"),
            "optimizer.params.betas: each beta must be in [0, 1), got [0.9, 1]");
  EXPECT_EQ(parse_error(R"({"optimizer": {"type": "Adam", "params": {"lr": -0.1}}})"),
            "optimizer.params.lr: must be >= 0, got -0.1");
  EXPECT_EQ(parse_error(R"({"fp16": {"enabled": true, "hysteresis": 0}})"),
            "fp16.hysteresis: must be >= 1, got 0");
  EXPECT_EQ(parse_error(R"({"communication_data_type": "int8"})"),
            "communication_data_type: must be one of fp16, bf16, fp32, got \"int8\"");
  EXPECT_NE(parse_error(R"({"optimizer": {"type": "Adam", "params": {"amsgrad": true}}})")
                .find("optimizer.params.amsgrad: true is not supported"),
            std::string::npos);
}

// ----- "auto" ---------------------------------------------------------------------------------

TEST(ConfigAuto, KeyWithDefaultTakesTheDefaultAndSaysSo) {
  Config c = Config::parse(R"({
    "gradient_clipping": "auto",
    "fp16": {"enabled": "auto", "loss_scale_window": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                              "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": "auto",
                                                  "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
                          "stage3_prefetch_bucket_size": "auto", "overlap_comm": "auto"}
  })");
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.0);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_DOUBLE_EQ(c.optimizer.adam.lr, 1e-3);
  EXPECT_DOUBLE_EQ(c.optimizer.adam.betas[1], 0.999);
  EXPECT_DOUBLE_EQ(c.optimizer.adam.eps, 1e-8);
  EXPECT_FALSE(c.scheduler.warmup_lr.warmup_max_lr.has_value());
  EXPECT_EQ(c.scheduler.warmup_lr.warmup_num_steps, 1000);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 500000000);
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 50000000);
  EXPECT_TRUE(c.zero_optimization.overlap_comm);  // DeepSpeed's default at stage 3
  EXPECT_TRUE(has_warning(c,
                          "zero_optimization.reduce_bucket_size is \"auto\": using the "
                          "default 500000000"));
  EXPECT_TRUE(has_warning(c, "optimizer.params.lr is \"auto\": using the default 0.001"));
  EXPECT_TRUE(has_warning(c, "fp16.enabled is \"auto\": using the default false"));
  EXPECT_EQ(c.origins.at("zero_optimization.reduce_bucket_size"), "auto -> default");
  EXPECT_EQ(c.origins.at("optimizer.params.weight_decay"), "auto -> default");
  EXPECT_EQ(c.origins.at("zero_optimization.overlap_comm"), "auto -> default for stage 3");
  const std::string d = c.describe();
  EXPECT_NE(d.find("zero_optimization.reduce_bucket_size = 500000000  (auto -> default)"),
            std::string::npos)
      << d;
  EXPECT_NE(d.find("optimizer.params.lr = 0.001  (auto -> default)"), std::string::npos) << d;
}

TEST(ConfigAuto, KeyWithoutDefaultIsAnError) {
  std::string msg = parse_error(R"({"optimizer": {"type": "auto"}})");
  EXPECT_EQ(msg.rfind("optimizer.type: \"auto\" is not allowed: the key has no default", 0), 0u)
      << msg;
  msg = parse_error(
      R"({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto"}}})");
  EXPECT_EQ(msg.rfind("scheduler.params.total_num_steps: \"auto\" is not allowed", 0), 0u) << msg;
}

TEST(ConfigAuto, OtherStringsAreTypeErrors) {
  EXPECT_EQ(parse_error(R"({"zero_optimization": {"overlap_comm": "maybe"}})"),
            "zero_optimization.overlap_comm: expected true or false, got string \"maybe\"");
  EXPECT_EQ(parse_error(R"({"wall_clock_breakdown": "true"})"),
            "wall_clock_breakdown: expected true or false, got string \"true\". HINT: write true "
            "without quotes (DeepSpeed reads this key without validation, where any non-empty "
            "string, \"false\" too, is true)");
  EXPECT_EQ(parse_error(R"({"train_batch_size": "32"})"),
            "train_batch_size: expected an integer, got string \"32\". HINT: write 32 without "
            "quotes (DeepSpeed reads this key without validation and would keep the string)");
  EXPECT_EQ(parse_error(R"({"gradient_clipping": "AUTO"})"),
            "gradient_clipping: expected a number, got string \"AUTO\"");
}

// ----- precision ------------------------------------------------------------------------------

TEST(ConfigPrecision, Fp16AndBf16TogetherIsAnError) {
  EXPECT_EQ(parse_error(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})"),
            "fp16.enabled and bf16.enabled are both true: one mixed-precision mode at a time "
            "(DeepSpeed asserts this too). HINT: set one of them to false");
  EXPECT_NE(parse_error(R"({"fp16": {"enabled": true}, "bfloat16": {"enabled": true}})")
                .find("fp16.enabled and bf16.enabled are both true"),
            std::string::npos);
}

TEST(ConfigPrecision, Bfloat16IsAnAliasOfBf16) {
  Config c = Config::parse(R"({"bfloat16": {"enabled": true}})");
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_EQ(parse_error(R"({"bfloat16": {"enabled": true}, "bf16": {"enabled": true}})"),
            "bfloat16: both 'bf16' and its old name 'bfloat16' are given. HINT: keep 'bf16'");
  EXPECT_EQ(parse_error(R"({"bfloat16": {"enable": true}})"),
            "unknown key 'enable' at bfloat16; did you mean 'enabled'?");
}

// DeepSpeed's bf16 master weights (0.18.3+): read as a boolean in the bf16 section's lax way;
// check_supported judges it with the stage and offload (CheckSupported.Bf16MasterWeights
// FollowDeepSpeedsRules), and so are bf16 optimizer states (0.19.1).
TEST(ConfigPrecision, Bf16MasterWeightsAndStatesAreRead) {
  Config c = Config::parse(R"({"bf16": {"enabled": true, "bf16_optimizer_states": false,
      "bf16_master_weights_and_grads": 1}})");
  EXPECT_TRUE(c.bf16.bf16_master_weights_and_grads);
  EXPECT_FALSE(c.bf16.bf16_optimizer_states);
  const Config plain = Config::parse(R"({"bf16": {"enabled": true}})");
  EXPECT_FALSE(plain.bf16.bf16_master_weights_and_grads);
  EXPECT_FALSE(plain.bf16.bf16_optimizer_states);
  EXPECT_TRUE(Config::parse(R"({"bf16": {"enabled": true, "bf16_master_weights_and_grads": true,
      "bf16_optimizer_states": "true"}})")
                  .bf16.bf16_optimizer_states);
}

TEST(ConfigPrecision, Fp16Fields) {
  Config c = Config::parse(R"({"fp16": {"enabled": true, "auto_cast": true, "loss_scale": 128,
      "initial_scale_power": 12, "loss_scale_window": 500, "hysteresis": 3,
      "consecutive_hysteresis": true, "min_loss_scale": 0.5}})");
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_TRUE(c.fp16.auto_cast);
  EXPECT_DOUBLE_EQ(c.fp16.loss_scale, 128.0);
  EXPECT_EQ(c.fp16.initial_scale_power, 12);
  EXPECT_EQ(c.fp16.loss_scale_window, 500);
  EXPECT_EQ(c.fp16.hysteresis, 3);
  EXPECT_TRUE(c.fp16.consecutive_hysteresis);
  EXPECT_DOUBLE_EQ(c.fp16.min_loss_scale, 0.5);
}

// ----- DeepSpeed keys dscpp does not act on (NOTE [key verdicts]) -------------------------------

TEST(ConfigVerdicts, EachClassActsAsItSays) {
  // At their inert values (a default, disabled, "auto", lax spellings in a pydantic section):
  // accepted without a word.
  Config c = Config::parse(R"({
    "train_batch_size": 8, "sequence_parallel_size": 1, "gradient_allreduce_op": "mean",
    "hybrid_engine": {"enabled": false, "max_out_tokens": 5},
    "compile": {"deepcompile": false, "free_activation": true},
    "tensor_parallel": {"autotp_size": 0, "tp": {"tp_size": 1}},
    "data_types": {"grad_accum_dtype": null}, "torch_autocast": {"enabled": false},
    "fp16": {"enabled": true, "fp16_master_weights_and_grads": false},
    "zero_optimization": {"stage": 3, "zenflow": null, "use_all_reduce_for_fetch_params": "off",
      "offload_optimizer": {"device": "cpu", "super_offload": 0}},
    "optimizer": {"type": "Adam", "legacy_fusion": false},
    "disable_allgather": true
  })");
  EXPECT_TRUE(c.warnings.empty()) << join(c.warnings, "\n");
  EXPECT_TRUE(c.fp16.enabled);
  // Refused: a value that asks for what dscpp does not do, with why and what to do.
  EXPECT_EQ(parse_error(R"({"sequence_parallel_size": 2})"),
            "sequence_parallel_size: number 2 is not accepted: sequence parallelism splits each "
            "sequence over ranks and divides the data-parallel world by it; dscpp has none, so "
            "every rank would train another micro-batch than in DeepSpeed. HINT: remove it (1)");
  EXPECT_NE(parse_error(R"({"hybrid_engine": {"enabled": true}})")
                .find("hybrid_engine: object {\"enabled\":true} is not accepted"),
            std::string::npos);
  EXPECT_NE(
      parse_error(R"({"tensor_parallel": {"tp": {"tp_size": 2}}})").find("tensor_parallel: object"),
      std::string::npos);
  EXPECT_NE(parse_error(R"({"bfloat16": {"enabled": true, "check_grad_overflow": "no"}})")
                .find("bfloat16.check_grad_overflow: string \"no\" is not accepted"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"zero_optimization": {"stage": 2, "load_from_fp32_weights": false}})")
                .find("HINT: remove it or set true"),
            std::string::npos);
  // DeepSpeed 0.19.8's removed features: refused whatever the value, as DeepSpeed refuses them.
  for (const char* removed : {R"({"amp": {"enabled": false}})", R"({"nebula": {}})",
                              R"({"curriculum_learning": {"enabled": false}})",
                              R"({"zero_optimization": {"mics_shard_size": -1}})",
                              R"({"zero_optimization": {"zeropp_loco_param": null}})"})
    EXPECT_NE(
        parse_error(removed).find("DeepSpeed 0.19.8 removed this feature and refuses the key"),
        std::string::npos)
        << removed;
  // Observes / no effect: a warning that says so; unused: nothing.
  c = Config::parse(R"({"memory_breakdown": true, "disable_python_gc": true,
      "pipeline": {"stages": 2}, "zero_optimization": {"parameter_alignment": true}})");
  EXPECT_TRUE(has_warning(c, "memory_breakdown boolean true: it prints memory use"));
  EXPECT_TRUE(has_warning(c, "nothing more is observed, training is unchanged"));
  EXPECT_TRUE(has_warning(c,
                          "disable_python_gc boolean true has no effect in dscpp: it turns off "
                          "Python's garbage collector; a C++ program has none; training is "
                          "unchanged"));
  EXPECT_TRUE(has_warning(c, "pipeline object {\"stages\":2} has no effect in dscpp"));
  EXPECT_TRUE(has_warning(c,
                          "zero_optimization.parameter_alignment boolean true has no "
                          "effect"));
  EXPECT_EQ(c.warnings.size(), 4u) << join(c.warnings, "\n");
  // data_types.grad_accum_dtype in DeepSpeed's DtypeEnum spellings (check_supported judges it).
  for (const auto& [given, read] : std::vector<std::pair<std::string, std::string>>{
           {"float32", "fp32"}, {"torch.float32", "fp32"}, {"float", "fp32"}, {"half", "fp16"},
           {"bfloat16", "bf16"}, {"bf16", "bf16"}}) {
    c = Config::parse(R"({"data_types": {"grad_accum_dtype": ")" + given + R"("}})");
    EXPECT_EQ(c.data_types.grad_accum_dtype, read) << given;
  }
  for (const char* bad : {"FP32", "int8", "double"}) {
    EXPECT_NE(parse_error(std::string(R"({"data_types": {"grad_accum_dtype": ")") + bad + "\"}}")
                  .find("data_types.grad_accum_dtype: must be fp32, fp16 or bf16"),
              std::string::npos)
        << bad;
  }
  EXPECT_FALSE(Config::parse(R"({"data_types": {"grad_accum_dtype": null}})")
                   .data_types.grad_accum_dtype.has_value());
  // A section only verdicts name is still checked for unknown keys.
  EXPECT_NE(parse_error(R"({"data_types": {"grad_acum_dtype": "fp32"}})")
                .find("unknown key 'grad_acum_dtype' at data_types; did you mean "
                      "'grad_accum_dtype'?"),
            std::string::npos);
  // Keys of older DeepSpeed releases that 0.19.8 no longer knows are unknown here too.
  EXPECT_NE(parse_error(R"({"fp16": {"fused_mode": true}})").find("unknown key 'fused_mode'"),
            std::string::npos);
  // elasticity: removed from DeepSpeed 0.19.8, honoured by dscpp, and said so.
  c = Config::parse(R"({"elasticity": {"enabled": false}})");
  EXPECT_TRUE(has_warning(c, "elasticity: DeepSpeed 0.19.8 removed elastic training"));
}

// log_level: initialize() sets it, as DeepSpeed's engine sets its logger's.
// Direct I/O's alignment is a config error before the job, not an I/O error at the first swap.
TEST(ConfigAio, BlockSizeIsAMultipleOf4096WithOffloadToNvme) {
  const std::string nvme =
      R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme",
      "nvme_path": "/tmp"}})";
  EXPECT_EQ(parse_error("{" + nvme + R"(, "aio": {"block_size": 1000000}})"),
            "aio.block_size 1000000 must be a multiple of 4096 bytes with offload to nvme: the "
            "swap files are read and written with direct I/O. HINT: remove it (1048576, "
            "DeepSpeed's default) or use another multiple of 4096");
  EXPECT_EQ(Config::parse("{" + nvme + R"(, "aio": {"block_size": 65536}})").aio.block_size, 65536);
  // Without nvme offload nothing reads aio.
  EXPECT_EQ(Config::parse(R"({"aio": {"block_size": 1000000}})").aio.block_size, 1000000);
}

TEST(ConfigRoot, LogLevelIsReadInAnyCase) {
  EXPECT_EQ(*Config::parse(R"({"log_level": "WARNING"})").log_level, "warning");
  EXPECT_EQ(*Config::parse(R"({"log_level": "critical"})").log_level, "critical");
  EXPECT_FALSE(Config::parse(R"({"log_level": null})").log_level);
  EXPECT_NE(parse_error(R"({"log_level": "verbose"})")
                .find("log_level: must be one of debug, info, warning, error, critical"),
            std::string::npos);
  // null batch keys are DeepSpeed's default (None): not given.
  EXPECT_FALSE(Config::parse(R"({"train_batch_size": null})").train_batch_size);
  // gradient_allreduce_op, lower-cased as DeepSpeed does.
  EXPECT_EQ(Config::parse("{}").gradient_allreduce_op, "mean");
  EXPECT_EQ(Config::parse(R"({"gradient_allreduce_op": "Sum"})").gradient_allreduce_op, "sum");
  EXPECT_NE(parse_error(R"({"gradient_allreduce_op": "max"})")
                .find("gradient_allreduce_op: must be one of mean, sum"),
            std::string::npos);
}

// ZeRO++: zero_quantized_weights, zero_quantized_gradients and zero_hpz_partition_size are
// honoured at stage 3 (no effect below, as in DeepSpeed; hpZ's size is checked against the hosts
// when the engine starts); the other keys' defaults (off) are accepted and asking for them is
// refused with the reason.
TEST(ConfigZeroPlusPlus, QuantizedWeightsAreReadTheRestRefusedWhenAskedFor) {
  Config c = Config::parse(R"({"zero_optimization": {"stage": 3, "zero_quantized_weights": true,
      "zero_hpz_partition_size": 8, "zero_quantized_gradients": true,
      "zero_quantized_nontrainable_weights": false}})");
  EXPECT_TRUE(c.zero_optimization.zero_quantized_weights);
  EXPECT_TRUE(c.zero_optimization.zero_quantized_gradients);
  EXPECT_EQ(c.zero_optimization.zero_hpz_partition_size, 8);
  EXPECT_TRUE(c.warnings.empty());
  EXPECT_NE(c.describe().find("zero_optimization.zero_quantized_weights = true"),
            std::string::npos)
      << c.describe();
  c = Config::parse(R"({"zero_optimization": {"stage": 2, "zero_quantized_weights": true}})");
  EXPECT_TRUE(has_warning(c, "zero_optimization.zero_quantized_weights: stage 3 settings have no "
                             "effect at stage 2; ignored"));
  EXPECT_NE(parse_error(R"({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": -2}})")
                .find("zero_hpz_partition_size"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"zero_optimization": {"zero_quantized_nontrainable_weights": true}})")
                .find("(frozen weights stored as int8) is not implemented yet"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"zero_optimization": {"zeropp_loco_param": {"err_beta": 0.8}}})")
                .find("runs without LoCo's error feedback"),
            std::string::npos);
}

TEST(ConfigUnimplemented, SettingsWithoutEffectWarn) {
  Config c = Config::parse(R"({"zero_optimization": {"stage": 1,
      "offload_param": {"device": "cpu"}}})");
  EXPECT_TRUE(has_warning(c,
                          "zero_optimization.offload_param.device \"cpu\" has no effect at "
                          "stage 1"));
  c = Config::parse(R"({"zero_optimization": {"offload_optimizer": {"device": "cpu"}}})");
  EXPECT_TRUE(has_warning(c, "has no effect at stage 0"));
}

// ----- defaults -------------------------------------------------------------------------------

TEST(ConfigDefaults, EmptyConfigHasDeepSpeedDefaults) {
  Config c = Config::parse("{}");
  EXPECT_TRUE(c.warnings.empty());
  EXPECT_FALSE(c.train_batch_size || c.train_micro_batch_size_per_gpu ||
               c.gradient_accumulation_steps);
  EXPECT_FALSE(c.steps_per_print);  // DeepSpeed 0.19.8: None, no step line
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.0);  // DeepSpeed 0.19.8 (its PR 8068)
  EXPECT_FALSE(c.wall_clock_breakdown);
  EXPECT_FALSE(c.prescale_gradients);
  EXPECT_DOUBLE_EQ(c.gradient_predivide_factor, 1.0);
  EXPECT_FALSE(c.zero_allow_untested_optimizer);
  EXPECT_FALSE(c.communication_data_type.has_value());
  EXPECT_FALSE(c.dump_state);
  EXPECT_FALSE(c.seed.has_value());
  EXPECT_TRUE(c.optimizer.type.empty());
  EXPECT_TRUE(c.scheduler.type.empty());
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_DOUBLE_EQ(c.fp16.loss_scale, 0.0);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_DOUBLE_EQ(c.fp16.min_loss_scale, 1.0);
  EXPECT_FALSE(c.bf16.enabled);
  const ZeroConfig& z = c.zero_optimization;
  EXPECT_EQ(z.stage, 0);
  EXPECT_TRUE(z.contiguous_gradients);
  EXPECT_FALSE(z.overlap_comm);
  EXPECT_TRUE(z.reduce_scatter);
  EXPECT_EQ(z.reduce_bucket_size, 500000000);
  EXPECT_TRUE(z.allgather_partitions);
  EXPECT_EQ(z.allgather_bucket_size, 500000000);
  EXPECT_FALSE(z.round_robin_gradients);
  EXPECT_EQ(z.sub_group_size, 1000000000);
  EXPECT_EQ(z.stage3_prefetch_bucket_size, 50000000);
  EXPECT_EQ(z.stage3_param_persistence_threshold, 100000);
  EXPECT_EQ(z.stage3_max_live_parameters, 1000000000);
  EXPECT_EQ(z.stage3_max_reuse_distance, 1000000000);
  EXPECT_FALSE(z.stage3_gather_16bit_weights_on_model_save);
  EXPECT_TRUE(z.ignore_unused_parameters);
  EXPECT_EQ(z.offload_optimizer.device, "none");
  EXPECT_EQ(z.offload_optimizer.buffer_count, 4);
  EXPECT_DOUBLE_EQ(z.offload_optimizer.ratio, 1.0);
  EXPECT_EQ(z.offload_param.device, "none");
  EXPECT_EQ(z.offload_param.buffer_count, 5);
  EXPECT_EQ(z.offload_param.buffer_size, 100000000);
  EXPECT_EQ(z.offload_param.max_in_cpu, 1000000000);
  EXPECT_EQ(c.aio.block_size, 1048576);
  EXPECT_EQ(c.aio.queue_depth, 8);
  EXPECT_EQ(c.aio.thread_count, 1);
  EXPECT_FALSE(c.aio.single_submit);
  EXPECT_TRUE(c.aio.overlap_events);
  EXPECT_EQ(c.checkpoint.tag_validation, "Warn");
  EXPECT_FALSE(c.checkpoint.writer.given);
  EXPECT_FALSE(c.checkpoint.writer.decoupled);
  EXPECT_EQ(c.checkpoint.writer.type, "FAST");
  EXPECT_EQ(c.checkpoint.writer.io_buffer_size, 64 << 20);
  EXPECT_FALSE(c.checkpoint.writer.io_buffer_double.has_value());
  EXPECT_FALSE(c.comms_logger.enabled);
  EXPECT_TRUE(c.comms_logger.prof_all);
  EXPECT_TRUE(c.comms_logger.prof_ops.empty());
  EXPECT_FALSE(c.flops_profiler.enabled);
  EXPECT_EQ(c.flops_profiler.profile_step, 1);
  EXPECT_EQ(c.flops_profiler.module_depth, -1);
  EXPECT_EQ(c.flops_profiler.top_modules, 1);
  EXPECT_TRUE(c.flops_profiler.detailed);
  EXPECT_EQ(c.csv_monitor.job_name, "DeepSpeedJobName");
  EXPECT_EQ(c.tensorboard.output_path, "");
  EXPECT_EQ(c.origins.at("zero_optimization.overlap_comm"), "default for stage 0");
}

TEST(ConfigSections, SmallSectionsParse) {
  Config c = Config::parse(R"({
    "comms_logger": {"enabled": true, "verbose": true, "prof_all": false, "debug": true,
                     "prof_ops": ["all_reduce", "all_gather"]},
    "flops_profiler": {"enabled": true, "profile_step": 5, "module_depth": 2, "top_modules": 3,
                       "detailed": false, "output_file": "/tmp/flops.txt"},
    "activation_checkpointing": {"partition_activations": false, "cpu_checkpointing": false,
        "contiguous_memory_optimization": false, "number_checkpoints": null,
        "synchronize_checkpoint_boundary": false, "profile": false},
    "checkpoint": {"tag_validation": "fail", "load_universal": false,
                   "use_node_local_storage": false, "parallel_write": {"pipeline_stage": false},
                   "writer": {"type": "mock", "decoupled": true, "io_buffer_size": 2e6,
                              "io_buffer_double": false, "show_statistics": true,
                              "data_parallel": "machine", "io_multiplier": 2}},
    "aio": {"block_size": 262144, "queue_depth": 32, "thread_count": 2, "single_submit": true,
            "overlap_events": false},
    "csv_monitor": {"enabled": true, "output_path": "logs/", "job_name": "run1"},
    "tensorboard": {"enabled": true, "output_path": "tb/"},
    "wandb": {"enabled": false, "group": "g", "team": null, "project": "p"},
    "communication_data_type": "BFP16", "seed": 1234, "wall_clock_breakdown": true,
    "prescale_gradients": true, "gradient_predivide_factor": 2.0, "dump_state": true,
    "zero_allow_untested_optimizer": true
  })");
  EXPECT_TRUE(c.comms_logger.verbose);
  EXPECT_FALSE(c.comms_logger.prof_all);
  EXPECT_TRUE(c.comms_logger.debug);
  EXPECT_EQ(c.comms_logger.prof_ops, (std::vector<std::string>{"all_reduce", "all_gather"}));
  EXPECT_EQ(c.flops_profiler.profile_step, 5);
  EXPECT_EQ(c.flops_profiler.module_depth, 2);
  EXPECT_EQ(c.flops_profiler.top_modules, 3);
  EXPECT_FALSE(c.flops_profiler.detailed);
  EXPECT_EQ(c.flops_profiler.output_file, "/tmp/flops.txt");
  EXPECT_EQ(c.checkpoint.tag_validation, "Fail");
  EXPECT_TRUE(c.checkpoint.writer.given);
  EXPECT_TRUE(c.checkpoint.writer.decoupled);
  EXPECT_EQ(c.checkpoint.writer.type, "MOCK");  // upper-cased, as DeepSpeed does
  EXPECT_EQ(c.checkpoint.writer.io_buffer_size, 2000000);
  EXPECT_EQ(c.checkpoint.writer.io_buffer_double, false);
  EXPECT_TRUE(c.checkpoint.writer.show_statistics);
  EXPECT_EQ(c.checkpoint.writer.data_parallel, "MACHINE");
  EXPECT_EQ(c.checkpoint.writer.io_multiplier, 2);
  EXPECT_EQ(parse_error(R"({"checkpoint": {"writer": {"type": "torch"}}})"),
            "checkpoint.writer.type: must be one of mock, python, fast (any case), got \"torch\"");
  EXPECT_EQ(parse_error(R"({"checkpoint": {"writer": {"io_buffer_size": 1000}}})"),
            "checkpoint.writer.io_buffer_size: must be at least 1048576 (1 MiB), got 1000");
  EXPECT_EQ(parse_error(R"({"checkpoint": {"writer": {"data_parallel": "host"}}})"),
            "checkpoint.writer.data_parallel: must be one of replica, socket, machine (any case), "
            "got \"host\"");
  EXPECT_EQ(c.aio.block_size, 262144);
  EXPECT_EQ(c.aio.thread_count, 2);
  EXPECT_FALSE(c.aio.overlap_events);
  EXPECT_EQ(c.csv_monitor.output_path, "logs/");
  EXPECT_EQ(c.csv_monitor.job_name, "run1");
  EXPECT_EQ(c.tensorboard.job_name, "DeepSpeedJobName");
  EXPECT_EQ(c.communication_data_type, "bf16");
  EXPECT_EQ(c.seed, 1234);
  EXPECT_TRUE(c.wall_clock_breakdown);
  EXPECT_DOUBLE_EQ(c.gradient_predivide_factor, 2.0);
  EXPECT_TRUE(c.zero_allow_untested_optimizer);
}

// ----- zero_optimization ----------------------------------------------------------------------

TEST(ConfigZero, OverlapCommDefaultFollowsTheStage) {
  EXPECT_TRUE(
      Config::parse(R"({"zero_optimization": {"stage": 3}})").zero_optimization.overlap_comm);
  EXPECT_FALSE(
      Config::parse(R"({"zero_optimization": {"stage": 2}})").zero_optimization.overlap_comm);
  Config c = Config::parse(R"({"zero_optimization": {"stage": 3, "overlap_comm": false}})");
  EXPECT_FALSE(c.zero_optimization.overlap_comm);
  EXPECT_EQ(c.origins.count("zero_optimization.overlap_comm"), 0u);
  c = Config::parse(R"({"zero_optimization": {"stage": 3}})");
  EXPECT_EQ(c.origins.at("zero_optimization.overlap_comm"), "default for stage 3");
  // Stage 0's all-reduces always overlap backward: the resolved config says so, whatever the key.
  for (const char* stage0 : {R"({})", R"({"zero_optimization": {"overlap_comm": false}})"}) {
    const std::string d = Config::parse(stage0).describe();
    EXPECT_NE(d.find("zero_optimization.overlap_comm = true  (stage 0 always overlaps"),
              std::string::npos)
        << d;
  }
}

TEST(ConfigZero, FullStage3WithNvmeOffload) {
  Config c = Config::parse(R"({"zero_optimization": {
    "stage": 3, "contiguous_gradients": false, "reduce_scatter": false,
    "reduce_bucket_size": 1e7, "allgather_partitions": false, "allgather_bucket_size": 2e7,
    "round_robin_gradients": true, "sub_group_size": 1e8,
    "stage3_prefetch_bucket_size": 1e6, "stage3_param_persistence_threshold": 1e4,
    "stage3_max_live_parameters": 3e8, "stage3_max_reuse_distance": 2e8,
    "stage3_gather_16bit_weights_on_model_save": true, "ignore_unused_parameters": false,
    "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme", "buffer_count": 6,
                          "pin_memory": true, "pipeline_read": true, "pipeline_write": true,
                          "fast_init": true, "ratio": 0.3},
    "offload_param": {"device": "cpu", "pin_memory": true, "buffer_count": 3,
                      "buffer_size": 1e7, "max_in_cpu": 1e8}}})");
  const ZeroConfig& z = c.zero_optimization;
  EXPECT_FALSE(z.contiguous_gradients);
  EXPECT_FALSE(z.reduce_scatter);
  EXPECT_EQ(z.reduce_bucket_size, 10000000);
  EXPECT_FALSE(z.allgather_partitions);
  EXPECT_EQ(z.allgather_bucket_size, 20000000);
  EXPECT_TRUE(z.round_robin_gradients);
  EXPECT_EQ(z.sub_group_size, 100000000);
  EXPECT_EQ(z.stage3_prefetch_bucket_size, 1000000);
  EXPECT_EQ(z.stage3_param_persistence_threshold, 10000);
  EXPECT_EQ(z.stage3_max_live_parameters, 300000000);
  EXPECT_EQ(z.stage3_max_reuse_distance, 200000000);
  EXPECT_TRUE(z.stage3_gather_16bit_weights_on_model_save);
  EXPECT_FALSE(z.ignore_unused_parameters);
  EXPECT_EQ(z.offload_optimizer.device, "nvme");
  EXPECT_EQ(z.offload_optimizer.nvme_path, "/local_nvme");
  EXPECT_EQ(z.offload_optimizer.buffer_count, 6);
  EXPECT_TRUE(z.offload_optimizer.pin_memory);
  EXPECT_TRUE(z.offload_optimizer.pipeline_read);
  EXPECT_TRUE(z.offload_optimizer.fast_init);
  EXPECT_DOUBLE_EQ(z.offload_optimizer.ratio, 0.3);
  EXPECT_EQ(z.offload_param.device, "cpu");
  EXPECT_EQ(z.offload_param.buffer_size, 10000000);
  EXPECT_EQ(z.offload_param.max_in_cpu, 100000000);
  EXPECT_TRUE(c.warnings.empty());
  const std::string d = c.describe();
  EXPECT_NE(d.find("zero_optimization.offload_optimizer.nvme_path = \"/local_nvme\""),
            std::string::npos)
      << d;
  EXPECT_NE(d.find("aio.block_size = 1048576"), std::string::npos) << d;
}

TEST(ConfigZero, LeafModulesTakeAStringOrAList) {
  Config c = Config::parse(R"({"zero_optimization": {"stage": 3, "leaf_module": {
      "classes": "BlockImpl", "names": ["wte", "h.0"], "name_suffixes": ["attn"]}}})");
  const ZeroLeafModuleConfig& l = c.zero_optimization.leaf_module;
  EXPECT_EQ(l.classes, std::vector<std::string>{"BlockImpl"});
  EXPECT_EQ(l.names, (std::vector<std::string>{"wte", "h.0"}));
  EXPECT_EQ(l.name_suffixes, std::vector<std::string>{"attn"});
  EXPECT_NE(c.describe().find("zero_optimization.leaf_module.names = [\"wte\", \"h.0\"]"),
            std::string::npos)
      << c.describe();
  EXPECT_TRUE(Config::parse(R"({"zero_optimization": {"stage": 3}})")
                  .zero_optimization.leaf_module.empty());
  // Below stage 3 the stage-3 settings are said to do nothing.
  c = Config::parse(R"({"zero_optimization": {"stage": 2, "leaf_module": {"names": "h.0"},
                        "stage3_max_live_parameters": 10}})");
  EXPECT_TRUE(has_warning(c,
                          "zero_optimization.stage3_max_live_parameters, leaf_module: stage 3 "
                          "settings have no effect at stage 2; ignored"));
  // "auto" means the default: no units.
  c = Config::parse(R"({"zero_optimization": {"stage": 3, "leaf_module": {"classes": "auto"}}})");
  EXPECT_TRUE(c.zero_optimization.leaf_module.classes.empty());
  EXPECT_EQ(parse_error(R"({"zero_optimization": {"leaf_module": {"names": ["h.0", ""]}}})"),
            "zero_optimization.leaf_module.names: has an empty entry, which would match every "
            "module. HINT: remove it");
  EXPECT_NE(parse_error(R"({"zero_optimization": {"leaf_module": {"name": ["h.0"]}}})")
                .find("unknown key 'name' at zero_optimization.leaf_module; did you mean 'names'?"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"zero_optimization": {"leaf_module": {"classes": [3]}}})")
                .find("expected an array of strings"),
            std::string::npos);
}

TEST(ConfigZero, PydanticAliasesAndDeprecatedNames) {
  Config c = Config::parse(R"({"zero_optimization": {"stage": 3, "prefetch_bucket_size": 1000,
      "max_live_parameters": 2000, "gather_16bit_weights_on_model_save": true}})");
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 1000);
  EXPECT_EQ(c.zero_optimization.stage3_max_live_parameters, 2000);
  EXPECT_TRUE(c.zero_optimization.stage3_gather_16bit_weights_on_model_save);
  EXPECT_EQ(parse_error(R"({"zero_optimization": {"prefetch_bucket_size": 1,
                            "stage3_prefetch_bucket_size": 2}})"),
            "zero_optimization.stage3_prefetch_bucket_size: 'stage3_prefetch_bucket_size' and its "
            "alias 'prefetch_bucket_size' are both given. HINT: keep one of them");
  // allgather_sequential: DeepSpeed's stage 3 then prefetches a bucket of one element.
  c = Config::parse(R"({"zero_optimization": {"stage": 3, "allgather_sequential": true}})");
  EXPECT_TRUE(c.zero_optimization.stage3_allgather_sequential);
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 1);
  EXPECT_TRUE(c.warnings.empty()) << join(c.warnings, "\n");
  c = Config::parse(R"({"zero_optimization": {"stage": 3, "stage3_allgather_sequential": true,
      "stage3_prefetch_bucket_size": 1000}})");
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 1);
  EXPECT_TRUE(has_warning(c, "zero_optimization.stage3_prefetch_bucket_size 1000 is replaced by "
                             "1: allgather_sequential sets it (as in DeepSpeed)"));
  c = Config::parse(R"({"zero_optimization": {"stage": 2, "allgather_sequential": true}})");
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 50000000);
  c = Config::parse(R"({"zero_optimization": {"stage": 3,
      "stage3_gather_fp16_weights_on_model_save": true}})");
  EXPECT_TRUE(c.zero_optimization.stage3_gather_16bit_weights_on_model_save);
  EXPECT_TRUE(has_warning(c, "stage3_gather_fp16_weights_on_model_save is deprecated"));
  c = Config::parse(R"({"zero_optimization": {"stage": 2, "cpu_offload": true}})");
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, "cpu");
  EXPECT_TRUE(has_warning(c, "zero_optimization.cpu_offload is deprecated"));
  EXPECT_NE(parse_error(R"({"zero_optimization": {"cpu_offload": true,
                            "offload_optimizer": {"device": "cpu"}}})")
                .find("zero_optimization.cpu_offload: is deprecated and offload_optimizer is also "
                      "given"),
            std::string::npos);
}

// ----- optimizer and scheduler ----------------------------------------------------------------

TEST(ConfigOptimizer, TypeMatchesIgnoringCase) {
  Config c = Config::parse(R"({"optimizer": {"type": "adamw", "params": {"lr": 3e-4,
      "betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.1}}})");
  EXPECT_EQ(c.optimizer.type, "AdamW");
  EXPECT_DOUBLE_EQ(c.optimizer.adam.lr, 3e-4);
  EXPECT_DOUBLE_EQ(c.optimizer.adam.betas[0], 0.8);
  EXPECT_DOUBLE_EQ(c.optimizer.adam.betas[1], 0.95);
  EXPECT_DOUBLE_EQ(c.optimizer.adam.eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.optimizer.adam.weight_decay, 0.1);
  EXPECT_TRUE(c.optimizer.adam.adam_w_mode);
  EXPECT_EQ(Config::parse(R"({"optimizer": {"type": "ADAM"}})").optimizer.type, "Adam");
  EXPECT_EQ(Config::parse(R"({"optimizer": {"type": "sgd"}})").optimizer.type, "SGD");
  // AdamW always decouples weight decay, as in DeepSpeed.
  c = Config::parse(R"({"optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}}})");
  EXPECT_TRUE(c.optimizer.adam.adam_w_mode);
  EXPECT_TRUE(has_warning(c, "optimizer.params.adam_w_mode is false but type AdamW"));
  c = Config::parse(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})");
  EXPECT_FALSE(c.optimizer.adam.adam_w_mode);
}

TEST(ConfigOptimizer, UnknownTypeListsTheSupportedOnes) {
  EXPECT_EQ(parse_error(R"({"optimizer": {"type": "Adamm"}})"),
            "optimizer.type: unknown optimizer type 'Adamm'; did you mean 'Adam'? dscpp supports "
            "Adam, AdamW, SGD, Adagrad, Lamb, Lion, Muon (matched ignoring case)");
  EXPECT_EQ(parse_error(R"({"optimizer": {"type": "RMSprop"}})"),
            "optimizer.type: unknown optimizer type 'RMSprop' dscpp supports Adam, AdamW, SGD, "
            "Adagrad, Lamb, Lion, Muon (matched ignoring case)");
  EXPECT_EQ(parse_error(R"({"optimizer": {"type": "OneBitAdam"}})"),
            "optimizer.type: 'OneBitAdam' is a DeepSpeed optimizer that dscpp does not implement "
            "yet. HINT: dscpp supports Adam, AdamW, SGD, Adagrad, Lamb, Lion, Muon");
  EXPECT_EQ(parse_error(R"({"optimizer": {"params": {"lr": 0.1}}})"),
            "optimizer.type: is required: it names the optimizer, e.g. \"AdamW\"");
}

TEST(ConfigOptimizer, EachTypeHasItsParams) {
  Config c = Config::parse(R"({"optimizer": {"type": "SGD", "params": {"lr": 0.1,
      "momentum": 0.9, "weight_decay": 1e-4, "nesterov": true}}})");
  EXPECT_DOUBLE_EQ(c.optimizer.sgd.lr, 0.1);
  EXPECT_DOUBLE_EQ(c.optimizer.sgd.momentum, 0.9);
  EXPECT_TRUE(c.optimizer.sgd.nesterov);
  EXPECT_NE(parse_error(R"({"optimizer": {"type": "SGD", "params": {"nesterov": true}}})")
                .find("optimizer.params.nesterov: true needs momentum > 0 and dampening 0"),
            std::string::npos);
  c = Config::parse(R"({"optimizer": {"type": "Adagrad"}})");
  EXPECT_DOUBLE_EQ(c.optimizer.adagrad.lr, 1e-2);
  EXPECT_DOUBLE_EQ(c.optimizer.adagrad.eps, 1e-10);
  c = Config::parse(R"({"optimizer": {"type": "Lamb", "params": {"max_coeff": 0.3,
      "min_coeff": 0.01, "max_grad_norm": 1.0}}})");
  EXPECT_DOUBLE_EQ(c.optimizer.lamb.max_coeff, 0.3);
  EXPECT_DOUBLE_EQ(c.optimizer.lamb.max_grad_norm, 1.0);
  EXPECT_DOUBLE_EQ(c.optimizer.lamb.lr, 1e-3);
  c = Config::parse(R"({"optimizer": {"type": "Lion", "params": {"lr": 1e-4,
      "betas": [0.9, 0.99]}}})");
  EXPECT_DOUBLE_EQ(c.optimizer.lion.lr, 1e-4);
  EXPECT_DOUBLE_EQ(c.optimizer.lion.betas[1], 0.99);
  EXPECT_DOUBLE_EQ(c.optimizer.lion.weight_decay, 0.0);
}

// Muon's keys and defaults are DeepSpeed 0.19.8's (engine._muon_param_groups, MuonWithAuxAdam):
// lr shared by both halves unless muon_lr / adam_lr, and without any, 0.02 and 3e-4.
TEST(ConfigOptimizer, MuonHasDeepSpeedsKeysAndDefaults) {
  Config c = Config::parse(R"({"optimizer": {"type": "muon"}})");
  EXPECT_EQ(c.optimizer.type, "Muon");
  const MuonParams& d = c.optimizer.muon;
  EXPECT_DOUBLE_EQ(d.muon_lr_or_default(), 0.02);
  EXPECT_DOUBLE_EQ(d.adam_lr_or_default(), 3e-4);
  EXPECT_DOUBLE_EQ(d.momentum, 0.95);
  EXPECT_DOUBLE_EQ(d.weight_decay, 0.0);
  EXPECT_DOUBLE_EQ(d.betas[0], 0.9);
  EXPECT_DOUBLE_EQ(d.betas[1], 0.95);
  EXPECT_DOUBLE_EQ(d.eps, 1e-10);
  EXPECT_EQ(d.ns_method, "gram");
  EXPECT_TRUE(d.adam_w_mode);
  c = Config::parse(R"({"optimizer": {"type": "Muon", "params": {"lr": 0.01, "adam_lr": 0.001,
      "momentum": 0.9, "ns_method": "standard", "per_head_muon": false}}})");
  EXPECT_DOUBLE_EQ(c.optimizer.muon.muon_lr_or_default(), 0.01);
  EXPECT_DOUBLE_EQ(c.optimizer.muon.adam_lr_or_default(), 0.001);
  EXPECT_EQ(c.optimizer.muon.ns_method, "standard");
  c = Config::parse(R"({"optimizer": {"type": "Muon", "params": {"lr": 0.01, "muon_lr": 0.05}}})");
  EXPECT_DOUBLE_EQ(c.optimizer.muon.muon_lr_or_default(), 0.05);
  EXPECT_DOUBLE_EQ(c.optimizer.muon.adam_lr_or_default(), 0.01);
  EXPECT_NE(parse_error(R"({"optimizer": {"type": "Muon", "params": {"ns_method": "svd"}}})")
                .find("optimizer.params.ns_method"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"optimizer": {"type": "Muon", "params": {"momentum": 1.0}}})")
                .find("optimizer.params.momentum: must be in [0, 1), got 1"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"optimizer": {"type": "Muon", "params": {"per_head_muon": true}}})")
                .find("optimizer.params.per_head_muon: boolean true is not accepted"),
            std::string::npos);
  // A key of another optimizer is unknown here, as in every params section.
  EXPECT_NE(parse_error(R"({"optimizer": {"type": "Muon", "params": {"amsgrad": false}}})")
                .find("unknown key 'amsgrad' at optimizer.params"),
            std::string::npos);
}

TEST(ConfigScheduler, TypesAndParams) {
  Config c = Config::parse(R"({"scheduler": {"type": "WarmupDecayLR", "params": {
      "total_num_steps": 1e4, "warmup_min_lr": 0, "warmup_max_lr": 3e-4,
      "warmup_num_steps": 500, "warmup_type": "linear"}}})");
  EXPECT_EQ(c.scheduler.type, "WarmupDecayLR");
  EXPECT_EQ(c.scheduler.warmup_decay_lr.total_num_steps, 10000);
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_decay_lr.warmup_max_lr, 3e-4);
  EXPECT_EQ(c.scheduler.warmup_decay_lr.warmup_num_steps, 500);
  EXPECT_EQ(c.scheduler.warmup_decay_lr.warmup_type, "linear");
  c = Config::parse(R"({"scheduler": {"type": "WarmupCosineLR", "params": {
      "total_num_steps": 100, "warmup_num_steps": 10}}})");
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_cosine_lr.cos_min_ratio, 0.0001);
  EXPECT_EQ(c.scheduler.warmup_cosine_lr.warmup_type, "log");
  c = Config::parse(R"({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4,
      "cycle_max_lr": 1e-3, "cycle_first_step_size": 100}}})");
  EXPECT_DOUBLE_EQ(c.scheduler.one_cycle.cycle_max_lr, 1e-3);
  EXPECT_FALSE(c.scheduler.one_cycle.cycle_second_step_size.has_value());
  EXPECT_DOUBLE_EQ(c.scheduler.one_cycle.cycle_min_mom, 0.8);
  c = Config::parse(R"({"scheduler": {"type": "LRRangeTest"}})");
  EXPECT_DOUBLE_EQ(c.scheduler.lr_range_test.lr_range_test_min_lr, 1e-3);
  EXPECT_EQ(c.scheduler.lr_range_test.lr_range_test_step_size, 2000);

  EXPECT_EQ(parse_error(R"({"scheduler": {"type": "WarmupDecayLR"}})"),
            "scheduler.params.total_num_steps: is required: the schedule needs the total number "
            "of optimizer steps");
  EXPECT_EQ(parse_error(R"({"scheduler": {"type": "warmuplr"}})"),
            "scheduler.type: unknown scheduler type 'warmuplr'; did you mean 'WarmupLR'? dscpp "
            "supports WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest (exact "
            "spelling)");
  EXPECT_EQ(parse_error(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cos"}}})"),
            "scheduler.params.warmup_type: must be one of log, linear, got \"cos\"");
  EXPECT_EQ(parse_error(R"({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1}}})"),
            "scheduler.params.cycle_max_lr: is required: it is the upper LR of the cycle");
  EXPECT_EQ(parse_error(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.1,
                            "warmup_max_lr": 0.01}}})"),
            "scheduler.params.warmup_max_lr: must be >= 0.1, got 0.01");
}

// ----- parse from file / string, malformed JSON -----------------------------------------------

std::string write_temp(const std::string& name, const std::string& text) {
  const std::filesystem::path p = std::filesystem::temp_directory_path() /
                                  ("dscpp_config_test_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p) << text;
  return p.string();
}

TEST(ConfigParse, FromFilePathAndFromJsonString) {
  const std::string text = R"({
    // comments are allowed, as in DeepSpeed's hjson loader
    "train_micro_batch_size_per_gpu": 4, /* per rank */
    "zero_optimization": {"stage": 1}
  })";
  const std::string path = write_temp("ok.json", text);
  Config from_file = Config::parse(path);
  EXPECT_EQ(from_file.source, path);
  EXPECT_EQ(from_file.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(from_file.zero_optimization.stage, 1);
  Config from_text = Config::parse("  \n" + text);
  EXPECT_EQ(from_text.source, "<json text>");
  EXPECT_EQ(from_text.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(from_text.zero_optimization.stage, 1);
  Config from_json = Config::from_json(json{{"train_micro_batch_size_per_gpu", 4}});
  EXPECT_EQ(from_json.source, "<json object>");
  EXPECT_EQ(from_json.train_micro_batch_size_per_gpu, 4);
  std::filesystem::remove(path);
}

TEST(ConfigParse, MissingFileIsIoErrorNamingThePath) {
  const std::string msg =
      error_of<IoError>([] { Config::parse("/nonexistent/dir/ds_config.json"); });
  EXPECT_NE(msg.find("cannot read DeepSpeed config '/nonexistent/dir/ds_config.json': No such "
                     "file or directory"),
            std::string::npos)
      << msg;
  const std::string dir = std::filesystem::temp_directory_path().string();
  EXPECT_NE(error_of<IoError>([&] { Config::parse(dir); }).find("is a directory"),
            std::string::npos);
}

TEST(ConfigParse, MalformedJsonGivesLineAndColumn) {
  std::string msg = parse_error("{\n  \"train_batch_size\": 32,\n  \"steps_per_print\" 10\n}");
  EXPECT_EQ(msg.rfind("malformed JSON in <json text> at line 3, column 22: syntax error while "
                      "parsing object separator",
                      0),
            0u)
      << msg;
  EXPECT_NE(msg.find("HINT:"), std::string::npos);
  const std::string path = write_temp("bad.json", "{\"zero_optimization\": {\"stage\": 1,}}");
  msg = error_of([&] { Config::parse(path); });
  EXPECT_EQ(msg.rfind("malformed JSON in '" + path + "' at line 1, column 35: syntax error", 0), 0u)
      << msg;
  std::filesystem::remove(path);
  // A number no double holds is malformed JSON too, not a library exception (found by fuzzing).
  msg = parse_error(R"({"zero_optimization": {"stage": 1e999}})");
  EXPECT_EQ(msg.rfind("malformed JSON in <json text>: number overflow parsing '1e999'", 0), 0u)
      << msg;
}

TEST(ConfigParse, DuplicateKeysAreErrors) {
  EXPECT_EQ(parse_error(R"({"zero_optimization": {"stage": 1, "stage": 2}})"),
            "duplicate key 'stage' at zero_optimization in <json text> (DeepSpeed rejects "
            "duplicate keys too). HINT: keep one of them");
  EXPECT_EQ(parse_error(R"({"train_batch_size": 8, "train_batch_size": 8})"),
            "duplicate key 'train_batch_size' at config root in <json text> (DeepSpeed rejects "
            "duplicate keys too). HINT: keep one of them");
  // The same key in sibling objects is fine.
  Config c = Config::parse(R"({"fp16": {"enabled": false}, "bf16": {"enabled": true}})");
  EXPECT_TRUE(c.bf16.enabled);
}

// ----- describe and the shipped example -------------------------------------------------------

TEST(ConfigDescribe, ShowsValuesInForceAndMarksDerivedOnes) {
  Config c = Config::parse(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 8,
      "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}})");
  std::string d = c.describe();
  EXPECT_NE(d.find("gradient_accumulation_steps = (not given)"), std::string::npos) << d;
  EXPECT_NE(d.find("batch sizes not resolved yet"), std::string::npos) << d;
  c.resolve_batch(2, "WORLD_SIZE set by dscpp launch");
  d = c.describe();
  EXPECT_NE(d.find("DeepSpeed config from <json text>:"), std::string::npos) << d;
  EXPECT_NE(d.find("  train_batch_size = 32\n"), std::string::npos) << d;
  EXPECT_NE(d.find("  train_micro_batch_size_per_gpu = 8\n"), std::string::npos) << d;
  EXPECT_NE(d.find("  gradient_accumulation_steps = 2  (derived: train_batch_size 32 // "
                   "train_micro_batch_size_per_gpu 8 // world size 2)\n"),
            std::string::npos)
      << d;
  EXPECT_NE(d.find("  world size = 2 (WORLD_SIZE set by dscpp launch)\n"), std::string::npos) << d;
  EXPECT_NE(d.find("  steps_per_print = (unset: no step line)\n"), std::string::npos) << d;
  EXPECT_NE(d.find("  optimizer.type = Adam\n"), std::string::npos) << d;
  EXPECT_NE(d.find("  optimizer.params.betas = [0.9, 0.999]\n"), std::string::npos) << d;
  EXPECT_NE(d.find("  zero_optimization.overlap_comm = true  (stage 0 always overlaps its "
                   "all-reduces with backward; the key applies to stages 1-3)\n"),
            std::string::npos)
      << d;
}

TEST(ConfigExample, ShippedExampleResolvesAtWorldSizeTwo) {
  Config c = Config::parse(std::string(DSCPP_SOURCE_DIR) + "/examples/ds_config.json");
  EXPECT_TRUE(c.warnings.empty());
  c.resolve_batch(2, "test");
  EXPECT_EQ(c.batch.train_batch_size, 32);
  EXPECT_EQ(c.batch.train_micro_batch_size_per_gpu, 8);
  EXPECT_EQ(c.batch.gradient_accumulation_steps, 2);
  EXPECT_EQ(c.optimizer.type, "Adam");
  EXPECT_DOUBLE_EQ(c.optimizer.adam.lr, 1e-3);
  EXPECT_EQ(c.scheduler.type, "WarmupLR");
  EXPECT_EQ(c.zero_optimization.stage, 0);
  EXPECT_EQ(c.steps_per_print, 10);  // the example sets it
  EXPECT_FALSE(c.comms_logger.enabled);
}

// ----- string helpers behind the suggestions --------------------------------------------------

TEST(ConfigStrings, EditDistanceAndNearestMatch) {
  EXPECT_EQ(edit_distance("pin_memroy", "pin_memory"), 1u);  // transposition
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("same", "same"), 0u);
  EXPECT_EQ(nearest_match("Stage", {"stage", "stages"}), "stage");  // case is ignored
  EXPECT_EQ(nearest_match("xyz", {"stage", "lr"}), "");
  EXPECT_EQ(split("a,,b", ','), (std::vector<std::string>{"a", "", "b"}));
  EXPECT_EQ(trim("  x y \n"), "x y");
  EXPECT_TRUE(iequals("AdamW", "adamw"));
  EXPECT_EQ(to_lower("AdamW"), "adamw");
  EXPECT_EQ(join({"a", "b"}, ", "), "a, b");
}

}  // namespace
}  // namespace dscpp

namespace dscpp {
namespace {

// aio: DeepSpeed's newer intra_op_parallelism is thread_count; use_gds (GPUDirect Storage) true
// is refused, since dscpp's swap goes through host memory.
TEST(ConfigAio, IntraOpParallelismIsThreadCountAndGdsIsRefused) {
  EXPECT_EQ(Config::parse(R"({"aio": {"intra_op_parallelism": 3}})").aio.thread_count, 3);
  EXPECT_FALSE(Config::parse(R"({"aio": {"use_gds": false}})").aio.single_submit);
  std::string msg;
  try {
    Config::parse(R"({"aio": {"use_gds": true}})");
  } catch (const ConfigError& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("aio.use_gds: true is not implemented"), std::string::npos) << msg;
}

// NOTE [config keys]: every key of the tables is documented in docs/config.md, in backticks, by
// its path or the tail of it its section's table uses.
// dscpp check makes the engine's decisions on a config, with the text initialize() and dscpp
// train give, for a model on --device.
TEST(ConfigCheck, DscppCheckRefusesWhatTrainingWould) {
  testing::TempDir dir;
  auto check = [&](const std::string& config, const std::string& flags = "") {
    const std::string path = dir.path() + "/ds_config.json";
    std::ofstream(path) << config;
    return testing::run_command(std::string(DSCPP_CLI_PATH) + " check --no_collectives --config " +
                                path + flags);
  };
  testing::RunResult r = check(R"({"train_batch_size": 2, "zero_optimization": {"stage": 1},
      "optimizer": {"type": "Lamb", "params": {}}})");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find(": the Lamb optimizer needs per-parameter norms across shards and is "
                          "not supported with ZeRO stage 1. HINT: use stage 0, or Adam/AdamW"),
            std::string::npos)
      << r.output;
  // A warning of the engine's depends on where the model is.
  const std::string pinned = R"({"train_batch_size": 2, "zero_optimization": {"stage": 1,
      "offload_optimizer": {"device": "cpu", "pin_memory": true}}})";
  r = check(pinned);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("warning: zero_optimization.offload_optimizer.pin_memory: pinned"),
            std::string::npos)
      << r.output;
  r = check(pinned, " --device cuda");
  EXPECT_EQ(r.output.find("warning: zero_optimization.offload_optimizer.pin_memory"),
            std::string::npos)
      << r.output;
  // Offload of a model on a GPU needs a build with CUDA (the link that copies), which check
  // knows as set-up does.
  EXPECT_TRUE(r.status == 0 ||
              r.output.find("zero_optimization.offload_optimizer with a model on cuda: this dscpp "
                            "was built without CUDA") != std::string::npos)
      << r.output;
  // What set-up would refuse only once the model is on the GPU.
  r = check(R"({"train_batch_size": 2, "zero_optimization": {"stage": 3,
      "zero_quantized_weights": true}})",
            " --device cuda");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("zero_optimization.zero_quantized_weights with a model on cuda is not "
                          "implemented yet"),
            std::string::npos)
      << r.output;
  // The batch against the world size, worded once.
  r = check(R"({"train_batch_size": 3, "train_micro_batch_size_per_gpu": 1})", " --num_procs 2");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("world size 2 from the hosts and --num_procs that dscpp check was given"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("world size 2 from world size"), std::string::npos) << r.output;
  // hpZ against the ranks of one host, as set-up judges it once its communicator exists.
  const std::string hpz = R"({"train_batch_size": 2, "zero_optimization": {"stage": 3,
      "zero_hpz_partition_size": )";
  r = check(hpz + "4}}", " --num_procs 2");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("zero_optimization.zero_hpz_partition_size 4: all 2 ranks are on one "
                          "host, so a secondary partition would be the primary one"),
            std::string::npos)
      << r.output;
  r = check(hpz + "2}}", " --num_procs 2");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("warning: zero_optimization.zero_hpz_partition_size 2: every rank is on "
                          "one host"),
            std::string::npos)
      << r.output;
  r = check(hpz + "2}}", " --num_procs 2 --device cuda");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("and this job's collectives (NCCL) go over the network"),
            std::string::npos)
      << r.output;
}

// docs/config.md's key list is the parser's own (scripts/config_keys.sh writes it).
TEST(ConfigDocs, KeyListIsTheParsers) {
  std::ifstream f(std::string(DSCPP_SOURCE_DIR) + "/docs/config.md");
  ASSERT_TRUE(f.good());
  const std::string doc((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const std::string begin = "<!-- key list: generated by scripts/config_keys.sh -->\n";
  const auto from = doc.find(begin), to = doc.find("<!-- end of key list -->");
  ASSERT_TRUE(from != std::string::npos && to != std::string::npos);
  EXPECT_TRUE(doc.substr(from + begin.size(), to - from - begin.size()) ==
              config::config_key_reference())
      << "docs/config.md's key list is stale: run scripts/config_keys.sh";
}

// NOTE [key verdicts]: every key DeepSpeed 0.19.8 reads (tests/config/data, from its source) is
// known; given at DeepSpeed's default it is accepted without a word, unless it sits inside a
// section dscpp judges as a whole (giving it turns that section on); DeepSpeed's removed
// features are refused as DeepSpeed refuses them (elasticity excepted: dscpp honours it).
TEST(ConfigAudit, EveryKeyOfDeepSpeed0198IsKnown) {
  std::ifstream f(std::string(DSCPP_SOURCE_DIR) + "/tests/config/data/deepspeed_0.19.8_keys.tsv");
  ASSERT_TRUE(f.good());
  const std::string reference = config::config_key_reference();
  int rows = 0, accepted = 0, refused = 0;
  for (std::string line; std::getline(f, line);) {
    if (line.empty() || line[0] == '#') continue;
    const auto t1 = line.find('\t'), t2 = line.find('\t', t1 + 1);
    const std::string path = line.substr(0, t1), value = line.substr(t1 + 1, t2 - t1 - 1),
                      ds = line.substr(t2 + 1);
    ++rows;
    // The section dscpp judges as a whole that holds it, if any.
    std::string whole;
    for (const auto& v : config::key_verdicts())
      if (path.rfind(std::string(v.path) + ".", 0) == 0) whole = std::string(v.path);
    const std::string listed = whole.empty() ? path : whole;
    EXPECT_TRUE(reference.find("| `" + listed + "` |") != std::string::npos ||
                reference.find("| `" + listed + ".") != std::string::npos)  // a section's keys
        << path << " not listed";
    if (value == "-" && ds == "accept") continue;  // no default a config can spell
    json cfg = json::object();
    json* at = &cfg;
    for (size_t b = 0, e; b != std::string::npos; b = e == std::string::npos ? e : e + 1) {
      e = path.find('.', b);
      at = &(*at)[path.substr(b, e == std::string::npos ? e : e - b)];
    }
    *at = value == "-" ? json::object() : json::parse(value);
    std::string error;
    Config c;
    try {
      c = Config::from_json(cfg);
    } catch (const ConfigError& e) {
      error = e.what();
    }
    EXPECT_EQ(error.find("unknown key"), std::string::npos) << path << ": " << error;
    if (ds == "refuse" && path != "elasticity") {
      EXPECT_NE(error.find("DeepSpeed 0.19.8 removed this feature"), std::string::npos)
          << path << ": " << error;
      ++refused;
    } else if (whole.empty()) {
      EXPECT_EQ(error, "") << path << " at DeepSpeed's default " << value;
      // Silent, but for what is noted about the value itself (a deprecated spelling, null read
      // as absent, the stage 3 keys at stage 0, elasticity's removal from DeepSpeed).
      for (const std::string& w : c.warnings)
        EXPECT_TRUE(w.find("deprecated") != std::string::npos ||
                    w.find("is null: read as absent") != std::string::npos ||
                    w.find("stage 3 settings have no effect") != std::string::npos ||
                    w.find("elasticity") != std::string::npos)
            << path << ": " << w;
      accepted += error.empty();
    }
  }
  EXPECT_GT(rows, 300);
  EXPECT_EQ(refused, 13);
  EXPECT_GT(accepted, 130);  // the rest sit inside sections judged as a whole
}

TEST(ConfigDocs, EveryTableKeyIsInConfigMd) {
  std::ifstream f(std::string(DSCPP_SOURCE_DIR) + "/docs/config.md");
  ASSERT_TRUE(f.good());
  const std::string doc((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::string missing;
  for (const std::string& path : config::table_key_paths()) {
    // The path, or any tail of it from a dot on ("offload_optimizer.ratio", "ratio"), or a
    // table's ".name" shorthand, in backticks.
    bool found = false;
    for (size_t at = 0; !found && at != std::string::npos; at = path.find('.', at + 1)) {
      const std::string tail = path.substr(at == 0 ? 0 : at + 1);
      found = doc.find("`" + tail + "`") != std::string::npos ||
              doc.find("`." + tail + "`") != std::string::npos;
    }
    if (!found) missing += " " + path;
  }
  EXPECT_TRUE(missing.empty()) << "not in docs/config.md:" << missing;
  EXPECT_GT(config::table_key_paths().size(), 100u);
}

}  // namespace
}  // namespace dscpp
