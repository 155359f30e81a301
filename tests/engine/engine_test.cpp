// Engine tests with ranks as threads over a shared store (each rank its own model replica and
// engine): the backbone is equivalence, every world size and GAS setting at the same
// train_batch_size reproduces the single-process trajectory; plus unused parameters, tiny
// buckets, no_sync, flushing a partial window, and a non-finite loss on one rank.
#include "dscpp/engine.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/schedulers/step_lr.h>
#include <torch/optim/sgd.h>

#include <functional>
#include <mutex>

#include "dscpp/error.h"
#include "dscpp/log.h"
#include "engine/test_net.h"
#include "support/errors.h"
#include "support/temp_dir.h"
#include "support/thread_ranks.h"

namespace dscpp {
namespace {

using comm::Communicator;
using testing::error_text;
using testing::run_thread_ranks;

using namespace enginetest;  // NOLINT: the fixtures of this file's tests

class EngineEquivalence : public ::testing::TestWithParam<bool> {};

TEST_P(EngineEquivalence, EveryWorldSizeAndGasMatchesOneProcess) {
  const bool adam = GetParam();
  const int B = 24, steps = 6;
  Trajectory ref;
  run_thread_ranks(1, [&](Communicator& c) { ref = train(c, steps, config_json(B, B), adam); });
  ASSERT_EQ(ref.losses.size(), static_cast<size_t>(steps));
  EXPECT_LT(ref.losses.back(), ref.losses.front()) << "the reference run does not learn";
  for (Case cs : {Case{1, 2}, Case{1, 4}, Case{2, 1}, Case{2, 2}, Case{2, 4}, Case{3, 1}, Case{3, 2},
                  Case{3, 4}}) {
    std::vector<Trajectory> got(cs.world);
    auto errors = run_thread_ranks(cs.world, [&](Communicator& c) {
      got[c.rank()] = train(c, steps, config_json(B, B / (cs.world * cs.gas)), adam);
    });
    std::string what = "world " + std::to_string(cs.world) + " gas " + std::to_string(cs.gas);
    for (auto& e : errors) ASSERT_FALSE(e) << what << ": " << error_text(e);
    for (int r = 0; r < cs.world; ++r) expect_same(got[r], ref, 1e-5, what + " rank " + std::to_string(r));
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, EngineEquivalence, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Adam" : "SGDMomentum"; });

TEST(Engine, TinyBucketsPrescaleAndPredivideGiveTheSameTrajectory) {
  const int B = 24;
  Trajectory ref;
  run_thread_ranks(1, [&](Communicator& c) { ref = train(c, 4, config_json(B, B), true); });
  for (std::string extra : {", \"zero_optimization\": {\"reduce_bucket_size\": 1}",
                            ", \"prescale_gradients\": true",
                            ", \"gradient_predivide_factor\": 2.0"}) {
    std::vector<Trajectory> got(2);
    auto errors = run_thread_ranks(2, [&](Communicator& c) { got[c.rank()] = train(c, 4, config_json(B, 6, extra), true); });
    for (auto& e : errors) ASSERT_FALSE(e) << extra << ": " << error_text(e);
    expect_same(got[0], ref, 1e-5, extra);
  }
}

TEST(Engine, ParameterUnusedOnOneRankNeitherHangsNorDiverges) {
  // Rank 1 uses the branch, rank 0 does not: the branch's gradient is averaged with rank 0's
  // zeros, and all replicas stay identical.
  std::vector<at::Tensor> final_params(2);
  auto errors = run_thread_ranks(2, [&](Communicator& c) {
    Net net = make_net(7 + c.rank());
    InitOptions opts = borrowed(c);
    opts.optimizer = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
    auto engine = initialize(net.ptr(), config_json(8, 2, ", \"zero_optimization\": {\"reduce_bucket_size\": 10}"), opts);
    auto X = dataset_x().narrow(0, 0, 2), Y = dataset_y().narrow(0, 0, 2);
    for (int i = 0; i < 6; ++i) {
      engine->backward(at::mse_loss(net->forward(X, c.rank() == 1), Y));
      engine->step();
    }
    EXPECT_EQ(engine->global_steps(), 3);
    final_params[c.rank()] = at::cat({net->branch->weight.detach().reshape({-1}), net->fc1->weight.detach().reshape({-1})});
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
  EXPECT_TRUE(at::equal(final_params[0], final_params[1]));
}

TEST(Engine, NoSyncStepAtBoundaryIsAnErrorAndFlushAppliesPartialWindow) {
  auto errors = run_thread_ranks(2, [&](Communicator& c) {
    Net net = make_net(1);
    InitOptions opts = borrowed(c);
    opts.optimizer = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
    auto engine = initialize(net.ptr(), config_json(8, 2), opts);  // GAS 2
    auto X = dataset_x().narrow(0, 2 * c.rank(), 2), Y = dataset_y().narrow(0, 2 * c.rank(), 2);
    engine->backward(at::mse_loss(net->forward(X), Y));
    engine->step();
    {
      auto guard = engine->no_sync();
      EXPECT_TRUE(engine->is_gradient_accumulation_boundary());
      engine->backward(at::mse_loss(net->forward(X), Y));
      EXPECT_THROW(engine->step(), Error);
    }
    // A fresh engine: one micro-step of two, then flush at "end of epoch".
    Net net2 = make_net(1);
    opts.optimizer = std::make_shared<torch::optim::SGD>(net2->parameters(), torch::optim::SGDOptions(0.1));
    auto e2 = initialize(net2.ptr(), config_json(8, 2), opts);
    auto before = net2->fc2->bias.detach().clone();
    e2->backward(at::mse_loss(net2->forward(X), Y));
    e2->step();
    EXPECT_EQ(e2->global_steps(), 0);
    e2->flush_accumulation();
    EXPECT_EQ(e2->global_steps(), 1);
    EXPECT_FALSE(at::equal(before, net2->fc2->bias.detach()));
    EXPECT_TRUE(e2->is_gradient_accumulation_boundary() == false);
    EXPECT_EQ(e2->micro_steps() % 2, 0);
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
}

TEST(Engine, NonFiniteLossOnOneRankStopsEveryRankNamingIt) {
  auto errors = run_thread_ranks(3, [&](Communicator& c) {
    Net net = make_net(1);
    InitOptions opts = borrowed(c);
    opts.optimizer = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
    auto engine = initialize(net.ptr(), config_json(3, 1), opts);
    auto X = dataset_x().narrow(0, c.rank(), 1), Y = dataset_y().narrow(0, c.rank(), 1);
    if (c.rank() == 2) X = X * std::numeric_limits<float>::quiet_NaN();
    engine->backward(at::mse_loss(net->forward(X), Y));
    engine->step();
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r << " did not stop";
    EXPECT_NE(error_text(errors[r]).find("non-finite loss at optimizer step 1 on rank(s) 2"), std::string::npos)
        << error_text(errors[r]);
  }
}

// Regressions found in review: a boundary backward inside no_sync followed by step() outside
// must still average over ranks; ranks that took different numbers of micro-steps can flush
// together; after a non-finite loss the engine keeps working.
TEST(Engine, NoSyncBoundaryThenStepUnevenFlushAndRecoveryAfterNaN) {
  std::vector<at::Tensor> weights(2);
  auto errors = run_thread_ranks(2, [&](Communicator& c) {
    Net net = make_net(5 + c.rank());
    InitOptions opts = borrowed(c);
    opts.optimizer = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
    auto engine = initialize(net.ptr(), config_json(4, 2), opts);  // GAS 1
    auto X = dataset_x().narrow(0, 2 * c.rank(), 2), Y = dataset_y().narrow(0, 2 * c.rank(), 2);
    {
      auto guard = engine->no_sync();
      engine->backward(at::mse_loss(net->forward(X), Y));
    }
    engine->step();  // averages now: replicas stay identical
    EXPECT_EQ(engine->global_steps(), 1);
    // Uneven flush: only rank 0 ran a micro-step in this window (GAS 1 means every backward is a
    // boundary, so use a fresh GAS-2 engine on the same model).
    opts.optimizer = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
    auto e2 = initialize(net.ptr(), config_json(8, 2), opts);  // GAS 2
    if (c.rank() == 0) {
      e2->backward(at::mse_loss(net->forward(X), Y));
      e2->step();
    }
    e2->flush_accumulation();
    EXPECT_EQ(e2->global_steps(), 1);
    // A non-finite loss on rank 1: every rank throws, then training goes on.
    auto bad = c.rank() == 1 ? X * std::numeric_limits<float>::quiet_NaN() : X;
    e2->backward(at::mse_loss(net->forward(bad), Y));
    e2->step();
    e2->backward(at::mse_loss(net->forward(bad), Y));
    EXPECT_THROW(e2->step(), Error);
    EXPECT_EQ(e2->global_steps(), 1);
    for (int i = 0; i < 2; ++i) {
      e2->backward(at::mse_loss(net->forward(X), Y));
      e2->step();
    }
    EXPECT_EQ(e2->global_steps(), 2);
    EXPECT_TRUE(at::isfinite(net->fc1->weight).all().item<bool>());
    weights[c.rank()] = net->fc1->weight.detach().clone();
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
  EXPECT_TRUE(at::equal(weights[0], weights[1])) << "replicas diverged";
}

// A backward that throws on one rank before its gradients are complete spoils the window on
// every rank: the collectives stay in step, step() drops the window everywhere naming the rank,
// and the next window trains normally, replicas identical. Stages 0 (the flag rides in the side
// channel), 1 and 2, at a boundary and before one.
TEST(Engine, BackwardThatThrowsOnOneRankDropsTheWindowEverywhere) {
  for (int stage : {0, 1, 2}) {
    for (int gas : {1, 2}) {
      std::vector<at::Tensor> weights(2);
      auto errors = run_thread_ranks(2, [&](Communicator& c) {
        Net net = make_net(3);
        std::string cfg = config_json(4 * gas, 2, ", \"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.1}}, "
                                                  "\"zero_optimization\": {\"stage\": " + std::to_string(stage) +
                                                  ", \"reduce_bucket_size\": 10}");
        auto engine = initialize(net.ptr(), cfg, borrowed(c));
        auto X = dataset_x().narrow(0, 2 * c.rank(), 2), Y = dataset_y().narrow(0, 2 * c.rank(), 2);
        for (int k = 0; k < gas; ++k) {
          at::Tensor h = at::tanh(net->fc1->forward(X));
          // Rank 1's backward fails in the first layer, after the later layers' buckets went.
          if (c.rank() == 1 && k == 0) h.register_hook([](at::Tensor g) -> at::Tensor { throw std::runtime_error("boom"); });
          at::Tensor loss = at::mse_loss(net->fc2->forward(h), Y);
          if (c.rank() == 1 && k == 0) EXPECT_THROW(engine->backward(loss), std::exception);
          else engine->backward(loss);
          if (k + 1 < gas) engine->step();
        }
        auto msg = testing::error_of<Error>([&] { engine->step(); });
        EXPECT_NE(msg.find("backward() failed on rank(s) 1"), std::string::npos) << msg;
        EXPECT_EQ(engine->global_steps(), 0);
        for (int k = 0; k < gas; ++k) {
          engine->backward(at::mse_loss(net->forward(X), Y));
          engine->step();
        }
        EXPECT_EQ(engine->global_steps(), 1);
        weights[c.rank()] = net->fc1->weight.detach().clone();
      });
      for (auto& e : errors) ASSERT_FALSE(e) << "stage " << stage << " gas " << gas << ": " << error_text(e);
      EXPECT_TRUE(at::equal(weights[0], weights[1])) << "replicas diverged at stage " << stage;
    }
  }
}

// A NaN gradient on one rank with every loss finite: step() refuses the step and names the rank
// and its first parameter (in model order) whose own gradient was non-finite before averaging,
// from the per-parameter sums the reducer keeps on the device, and the next window trains. At
// stage 0 (one reduction per window) and stage 2 with GAS 2 (a reduction per micro-batch: the
// NaN comes in the second).
TEST(Engine, NonFiniteGradientNamesTheRankAndItsFirstParameter) {
  for (auto [stage, gas] : {std::pair{0, 1}, std::pair{2, 2}}) {
    auto errors = run_thread_ranks(2, [&, stage = stage, gas = gas](Communicator& c) {
      Net net = make_net(3);
      std::string cfg = config_json(4 * gas, 2,
                                    ", \"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": "
                                    "0.1}}, \"zero_optimization\": {\"stage\": " +
                                        std::to_string(stage) + "}");
      auto engine = initialize(net.ptr(), cfg, borrowed(c));
      auto X = dataset_x().narrow(0, 2 * c.rank(), 2), Y = dataset_y().narrow(0, 2 * c.rank(), 2);
      for (int k = 0; k < gas; ++k) {
        at::Tensor h = at::tanh(net->fc1->forward(X));
        if (c.rank() == 1 && k == gas - 1) {
          h.register_hook([](at::Tensor g) { return g * std::nan(""); });  // fc1's gradients
        }
        engine->backward(at::mse_loss(net->fc2->forward(h), Y));
        if (k + 1 < gas) engine->step();
      }
      const std::string msg = testing::error_of<Error>([&] { engine->step(); });
      EXPECT_NE(msg.find("although every loss was finite"), std::string::npos) << msg;
      EXPECT_NE(msg.find("non-finite before averaging on rank 1 (first in 'fc1.weight')"),
                std::string::npos)
          << msg;
      EXPECT_EQ(engine->global_steps(), 0);
      // The next window starts from clean sums: finite gradients train.
      for (int k = 0; k < gas; ++k) {
        engine->backward(at::mse_loss(net->forward(X), Y));
        engine->step();
      }
      EXPECT_EQ(engine->global_steps(), 1);
    });
    for (auto& e : errors) ASSERT_FALSE(e) << "stage " << stage << ": " << error_text(e);
  }
}

// A zero-element parameter registered first shares offset 0 with the next bucket: the side
// channel must still ride in exactly one bucket (summing it twice would double the micro-step
// count and halve the update).
struct EmptyFirstNetImpl : torch::nn::Module {
  EmptyFirstNetImpl() {
    empty = register_parameter("empty", at::zeros({0}));
    fc = register_module("fc", torch::nn::Linear(8, 4));
  }
  at::Tensor forward(const at::Tensor& x) { return fc->forward(x) + empty.sum(); }
  at::Tensor empty;
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(EmptyFirstNet);

TEST(Engine, ZeroElementParameterFirstKeepsTheSideChannelSingle) {
  std::vector<at::Tensor> got(3);
  for (int world : {1, 2}) {
    auto errors = run_thread_ranks(world, [&](Communicator& c) {
      // The rank threads share the global generator: seed and build under one lock (as make_net).
      static std::mutex mu;
      std::unique_lock<std::mutex> lock(mu);
      at::manual_seed(11);
      EmptyFirstNet net;
      lock.unlock();
      auto engine = initialize(net.ptr(), config_json(4, 4 / world, ", \"optimizer\": {\"type\": \"SGD\", "
                                                                     "\"params\": {\"lr\": 0.1}}, \"zero_optimization\": "
                                                                     "{\"reduce_bucket_size\": 8}"),
                               borrowed(c));
      const int b = 4 / world;
      auto X = dataset_x().narrow(0, b * c.rank(), b), Y = dataset_y().narrow(0, b * c.rank(), b);
      engine->backward(at::mse_loss(net->forward(X), Y));
      engine->step();
      if (c.rank() == 0) got[world] = net->fc->weight.detach().clone();
    });
    for (auto& e : errors) ASSERT_FALSE(e) << "world " << world << ": " << error_text(e);
  }
  EXPECT_TRUE(at::allclose(got[2], got[1], 1e-6, 1e-7)) << got[1] << "\n" << got[2];
}

// Regression: the gradient hooks must not outlive the engine that installed them.
TEST(Engine, ModelOutlivesItsEngine) {
  auto errors = run_thread_ranks(1, [&](Communicator& c) {
    Net net = make_net(3);
    {
      InitOptions opts = borrowed(c);
      opts.optimizer = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
      auto engine = initialize(net.ptr(), config_json(2, 2), opts);
      engine->backward(at::mse_loss(net->forward(dataset_x().narrow(0, 0, 2)), dataset_y().narrow(0, 0, 2)));
      engine->step();
    }
    // Plain libtorch training of the same model afterwards.
    at::mse_loss(net->forward(dataset_x().narrow(0, 0, 2)), dataset_y().narrow(0, 0, 2)).backward();
    EXPECT_TRUE(net->fc1->weight.grad().defined());
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
}

const char* const kAdamW = R"(, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}})";

// The DDP habit (several backward() calls, then one step()) fails at the first surplus call, at
// GAS 1 and inside a window of GAS 2, saying what to do; the engine goes on as if it had not
// been made.
TEST(Engine, BackwardWithoutStepFailsAtTheFirstSurplusCall) {
  auto errors = run_thread_ranks(1, [&](Communicator& c) {
    for (int gas : {1, 2}) {
      Net net = make_net(1);
      auto engine = initialize(net.ptr(), config_json(2 * gas, 2, kAdamW), borrowed(c));
      auto X = dataset_x().narrow(0, 0, 2), Y = dataset_y().narrow(0, 0, 2);
      for (int k = 0; k < gas; ++k) {
        engine->backward(at::mse_loss(net->forward(X), Y));
        const std::string what = testing::error_of<Error>(
            [&] { engine->backward(at::mse_loss(net->forward(X), Y)); });
        EXPECT_NE(what.find("backward() called again without step()"), std::string::npos)
            << what;
        EXPECT_NE(what.find("micro-step " + std::to_string(k + 1) + " of " + std::to_string(gas)),
                  std::string::npos)
            << what;
        EXPECT_NE(what.find("call step() after every backward()"), std::string::npos) << what;
        engine->step();
      }
      EXPECT_EQ(engine->global_steps(), 1) << "GAS " << gas;
    }
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
}

// A model that differs across ranks is named by its first differing parameter, even when the
// counts of tensors and elements agree.
TEST(Engine, ModelThatDiffersAcrossRanksNamesTheFirstDifferingParameter) {
  auto errors = run_thread_ranks(2, [&](Communicator& c) {
    Net net = make_net(1);
    if (c.rank() == 1) net->fc2->bias.set_requires_grad(false);
    const std::string what = testing::error_of<ConfigError>(
        [&] { initialize(net.ptr(), config_json(4, 2, kAdamW), borrowed(c)); });
    EXPECT_NE(what.find("differs across ranks"), std::string::npos) << what;
    EXPECT_NE(what.find("first parameter that differs is number 4"), std::string::npos) << what;
    EXPECT_NE(what.find("rank 0 has 'fc2.bias' [4] Float, rank 1 has 'fc2.bias' [4] Float frozen"),
              std::string::npos)
        << what;
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
}

// One optimizer and one schedule: the config's or the program's. Refused with one text before
// anything is built, also where the optimizer's swap file would be made first (offload to nvme).
TEST(Engine, OptimizerAndScheduleComeFromTheConfigOrTheProgram) {
  testing::TempDir swap;
  const std::string nvme =
      ", \"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": "
      "{\"device\": \"nvme\", \"nvme_path\": \"" +
      swap.path() + "\"}}";
  const std::string schedule =
      ", \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 2}}";
  auto errors = run_thread_ranks(1, [&](Communicator& c) {
    Net net = make_net(1);
    auto error = [&](const std::string& extra, bool client_optimizer, bool client_schedule) {
      InitOptions o = borrowed(c);
      if (client_optimizer)
        o.optimizer =
            std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
      if (client_schedule)
        o.lr_scheduler = std::make_shared<torch::optim::StepLR>(*o.optimizer, 10);
      return testing::error_of<ConfigError>(
          [&] { initialize(net.ptr(), config_json(4, 4, extra), o); });
    };
    const std::string none =
        "the config has no optimizer section and no optimizer was passed to "
        "initialize()";
    EXPECT_NE(error("", false, false).find(none), std::string::npos);
    EXPECT_NE(error(nvme, false, false).find(none), std::string::npos);
    EXPECT_NE(error(kAdamW, true, false)
                  .find("both the config's optimizer section (AdamW) and a client optimizer"),
              std::string::npos);
    EXPECT_NE(error(schedule, true, true)
                  .find("both the config's scheduler section (WarmupLR) and a client LR "
                        "scheduler"),
              std::string::npos);
    EXPECT_NE(error(schedule, true, false).find("a scheduler section needs the config's optimizer"),
              std::string::npos);
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
}

// bf16: dtype() says what the model computes in and cast_input() brings an fp32 input to it
// (token ids stay integers), so the user's forward runs; in fp32 both are the identity.
TEST(Engine, CastInputBringsInputsToTheTrainingDtype) {
  auto errors = run_thread_ranks(1, [&](Communicator& c) {
    for (bool bf16 : {false, true}) {
      Net net = make_net(1);
      const std::string extra = std::string(kAdamW) + (bf16 ? R"(, "bf16": {"enabled": true})" : "");
      auto engine = initialize(net.ptr(), config_json(2, 2, extra), borrowed(c));
      const at::ScalarType want = bf16 ? at::kBFloat16 : at::kFloat;
      EXPECT_EQ(engine->dtype(), want);
      auto X = dataset_x().narrow(0, 0, 2), Y = dataset_y().narrow(0, 0, 2);
      EXPECT_EQ(engine->cast_input(X).scalar_type(), want);
      EXPECT_EQ(engine->cast_input(at::arange(3)).scalar_type(), at::kLong);
      at::Tensor out = net->forward(engine->cast_input(X));
      engine->backward(at::mse_loss(out.to(at::kFloat), Y));
      engine->step();
      EXPECT_EQ(engine->global_steps(), 1);
    }
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
}

// The resolved config (~55 lines) is a debug line in a user's program unless asked for, so a
// failing job's last lines are its error.
TEST(Engine, ResolvedConfigIsLoggedOnlyWhenAskedFor) {
  const LogLevel before = log_level();
  set_log_level(LogLevel::info);
  auto errors = run_thread_ranks(1, [&](Communicator& c) {
    for (bool ask : {false, true}) {
      Net net = make_net(1);
      InitOptions opts = borrowed(c);
      if (ask) opts.config_log_level = LogLevel::info;
      ::testing::internal::CaptureStderr();
      initialize(net.ptr(), config_json(2, 2, kAdamW), opts);
      const std::string err = ::testing::internal::GetCapturedStderr();
      EXPECT_EQ(err.find("resolved config") != std::string::npos, ask) << err;
    }
  });
  set_log_level(before);
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
}

TEST(Engine, ConfigErrorsAreClear) {
  auto errors = run_thread_ranks(1, [&](Communicator& c) {
    Net net = make_net(1);
    InitOptions opts = borrowed(c);
    try {
      initialize(net.ptr(), config_json(4, 4), opts);
      ADD_FAILURE() << "no optimizer accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("no optimizer section"), std::string::npos) << e.what();
    }
    try {
      initialize(net.ptr(), config_json(4, 3, kAdamW), opts);
      ADD_FAILURE() << "inconsistent batch accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("train_batch_size 4"), std::string::npos) << e.what();
    }
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
}

}  // namespace
}  // namespace dscpp
