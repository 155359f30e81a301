// The model-state estimates (src/engine/estimate.h) against what the engine really holds
// (Engine::memory_stats()) for a GPT at two sizes, every stage, fp32 and bf16, with and without
// the optimizer on disk (and at stage 3 the parameters too); and the pre-flight check that refuses
// a config whose model states do not fit, on every rank, naming the bytes and the settings that
// would.
#include "engine/estimate.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>

#include "dscpp/engine.h"
#include "dscpp/error.h"
#include "dscpp/models/gpt.h"
#include "engine/test_net.h"
#include "support/errors.h"
#include "support/temp_dir.h"
#include "support/thread_ranks.h"

namespace dscpp::engine {
namespace {

using comm::Communicator;
using testing::error_text;
using testing::run_thread_ranks;

models::GPTConfig gpt(int64_t layers, int64_t width) {
  models::GPTConfig g;
  g.vocab_size = 256;
  g.block_size = 32;
  g.n_layer = layers;
  g.n_head = 4;
  g.n_embd = width;
  return g;
}

void expect_within(int64_t measured, int64_t estimated, const std::string& what) {
  EXPECT_LE(std::abs(static_cast<double>(measured - estimated)), 0.10 * estimated + 4096)
      << what << ": measured " << measured << ", estimated " << estimated;
}

// Every part of the estimate within 10% of the engine's own accounting (stage 3 with every
// parameter sharded: the estimate does not model the persistence threshold).
TEST(Estimate, MatchesTheEngineAtTwoSizesEveryStageDtypeAndOffload) {
  testing::TempDir dir;
  for (const auto& g : {gpt(2, 64), gpt(4, 128)}) {
    for (const char* dtype : {"fp32", "bf16"}) {
      for (int stage : {0, 1, 2, 3}) {
        // "both": the optimizer and (stage 3) the parameters on nvme.
        for (const char* off : {"none", "nvme", "both"}) {
          if (stage == 0 && std::string(off) != "none") continue;
          if (stage != 3 && std::string(off) == "both") continue;
          const bool params_on_disk = std::string(off) == "both";
          const std::string cfg =
              std::string(
                  "{\"train_batch_size\": 4, \"optimizer\": {\"type\": \"AdamW\", "
                  "\"params\": {\"lr\": 0.001}}") +
              (std::string(dtype) == "bf16" ? ", \"bf16\": {\"enabled\": true}" : "") +
              ", \"zero_optimization\": {\"stage\": " + std::to_string(stage) +
              ", \"stage3_param_persistence_threshold\": 0, \"sub_group_size\": 5000" +
              (std::string(off) != "none"
                   ? ", \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"" +
                         dir.path() + "\", \"pipeline_read\": true, \"pipeline_write\": true}"
                   : std::string()) +
              (params_on_disk ? ", \"offload_param\": {\"device\": \"nvme\", \"max_in_cpu\": "
                                "0, \"nvme_path\": \"" +
                                    dir.path() + "\"}"
                              : std::string()) +
              "}}";
          const std::string what =
              g.to_string() + " " + dtype + " stage " + std::to_string(stage) + " offload " + off;
          auto errors = run_thread_ranks(2, [&](Communicator& c) {
            auto model = std::make_shared<models::GPTImpl>(g, 1);
            auto engine = initialize(model, cfg, enginetest::borrowed(c));
            const MemoryStats m = engine->memory_stats();
            EstimateInput in;
            in.params = g.num_parameters();
            in.largest_unit = g.block_parameters();
            in.world = 2;
            const Estimate e = estimate(in, Config::parse(cfg));
            if (c.rank() != 0) return;
            expect_within(m.params, e.params, what + " params");
            expect_within(m.grads, e.grads, what + " grads");
            expect_within(m.master, e.master, what + " master");
            expect_within(m.optimizer_state, e.optimizer_state, what + " optimizer");
            // The parameters' pool grows as training reads shards ahead: not yet at start-up.
            if (!params_on_disk)
              expect_within(m.offload_buffers, e.swap_buffers, what + " swap buffers");
            expect_within(m.model_states(), e.model_states(), what + " model states");
          });
          for (auto& e : errors) EXPECT_FALSE(e) << what << ": " << error_text(e);
        }
      }
    }
  }
}

// With DSCPP_MEMORY_LIMIT below what stage 0 needs, initialize() refuses on every rank before
// allocating, naming the bytes and listing the settings that fit; one that fits starts.
TEST(Estimate, PreflightRefusesWhatDoesNotFitAndNamesWhatWould) {
  const auto g = gpt(4, 128);  // 0.87M parameters: 14 MB of fp32 AdamW model states at stage 0
  setenv("DSCPP_MEMORY_LIMIT", "8M", 1);
  auto start = [&](const std::string& zero) {
    std::vector<std::string> out(2);
    auto errors = run_thread_ranks(2, [&](Communicator& c) {
      try {  // "" when it starts
        auto model = std::make_shared<models::GPTImpl>(g, 1);
        initialize(model,
                   "{\"train_batch_size\": 4, \"optimizer\": {\"type\": \"AdamW\", \"params\": "
                   "{\"lr\": 0.001}}, \"zero_optimization\": " +
                       zero + "}",
                   enginetest::borrowed(c));
      } catch (const ConfigError& e) {
        out[c.rank()] = e.what();
      }
    });
    for (auto& e : errors) EXPECT_FALSE(e) << error_text(e);
    return out;
  };
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& msg : start("{\"stage\": 0}")) {
    EXPECT_NE(msg.find("at stage 0 need 12.7 MiB per rank"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(DSCPP_MEMORY_LIMIT=8M)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("Settings that fit:\n  stage 1: 9.5 MiB per rank"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("stage 3, optimizer on nvme"), std::string::npos) << msg;
    EXPECT_NE(msg.find("DSCPP_SKIP_MEMORY_CHECK=1"), std::string::npos) << msg;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  setenv("DSCPP_SKIP_MEMORY_CHECK", "1", 1);
  for (const auto& msg : start("{\"stage\": 0}")) EXPECT_TRUE(msg.empty()) << msg;
  unsetenv("DSCPP_SKIP_MEMORY_CHECK");
  setenv("DSCPP_MEMORY_LIMIT", "lots", 1);
  for (const auto& msg : start("{\"stage\": 2}"))
    EXPECT_NE(msg.find("DSCPP_MEMORY_LIMIT='lots' is not a number of bytes"), std::string::npos);
  unsetenv("DSCPP_MEMORY_LIMIT");
}

}  // namespace
}  // namespace dscpp::engine
