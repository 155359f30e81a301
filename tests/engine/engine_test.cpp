// Engine tests with ranks as threads over a shared store (each rank its own model replica and
// engine): the backbone is equivalence, every world size and GAS setting at the same
// train_batch_size reproduces the single-process trajectory; plus unused parameters, tiny
// buckets, no_sync, flushing a partial window, and a non-finite loss on one rank.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <mutex>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include "dscpp/engine.h"
#include "dscpp/error.h"
#include "support/errors.h"
#include "support/thread_ranks.h"

namespace dscpp {
namespace {

using comm::Communicator;
using testing::error_text;
using testing::run_thread_ranks;

// A small MLP with an optional branch used only when `use_branch` is set on the input.
struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 4));
    branch = register_module("branch", torch::nn::Linear(16, 4));
  }
  at::Tensor forward(const at::Tensor& x, bool use_branch = false) {
    auto h = at::tanh(fc1->forward(x));
    auto y = fc2->forward(h);
    return use_branch ? y + branch->forward(h) : y;
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, branch{nullptr};
};
TORCH_MODULE(Net);

constexpr int kSamples = 48;
at::Tensor dataset_x() { return at::sin(at::arange(kSamples * 8, at::kFloat).reshape({kSamples, 8}) * 0.37); }
at::Tensor dataset_y() { return at::cos(at::arange(kSamples * 4, at::kFloat).reshape({kSamples, 4}) * 0.11); }

// Every rank initialises differently (the engine must broadcast rank 0's weights). The global
// generator is shared by the rank threads, so seeding and building happen under one lock.
Net make_net(int seed) {
  static std::mutex mu;
  std::lock_guard<std::mutex> g(mu);
  at::manual_seed(seed);
  return Net();
}

std::string config_json(int train_batch, int micro, const std::string& extra = "") {
  return "{\"train_batch_size\": " + std::to_string(train_batch) +
         ", \"train_micro_batch_size_per_gpu\": " + std::to_string(micro) +
         ", \"steps_per_print\": 1000000" + extra + "}";
}

struct Trajectory {
  std::vector<double> losses;
  std::vector<double> grad_norms;
  at::Tensor params;  // flat, after training
};

// Trains `steps` optimizer steps on the data contract's no-shuffle order: step s uses samples
// (s*B + i) mod N; rank r, micro-step k gets i in [(k*world + r)*b, +b). `client` (may be null)
// installs a client optimizer; otherwise the config's optimizer is used.
using ClientOptimizer = std::function<std::shared_ptr<torch::optim::Optimizer>(Net&)>;
Trajectory train_with(Communicator& c, int steps, const std::string& cfg, const ClientOptimizer& client) {
  Net net = make_net(100 + c.rank());
  InitOptions opts;
  opts.comm = std::shared_ptr<Communicator>(&c, [](Communicator*) {});
  if (client) opts.optimizer = client(net);
  auto engine = initialize(net.ptr(), cfg, opts);
  const int B = engine->train_batch_size(), b = engine->train_micro_batch_size_per_gpu();
  const int gas = engine->gradient_accumulation_steps(), world = c.world_size();
  auto X = dataset_x(), Y = dataset_y();
  Trajectory t;
  for (int s = 0; s < steps; ++s) {
    for (int k = 0; k < gas; ++k) {
      std::vector<int64_t> idx;
      for (int i = 0; i < b; ++i) idx.push_back((s * B + (k * world + c.rank()) * b + i) % kSamples);
      auto ix = at::tensor(idx, at::kLong);
      engine->backward(at::mse_loss(net->forward(X.index_select(0, ix)), Y.index_select(0, ix)));
      engine->step();
    }
    t.losses.push_back(engine->last_step().loss);
    t.grad_norms.push_back(engine->last_step().grad_norm);
  }
  std::vector<at::Tensor> flat;
  for (auto& p : net->parameters()) flat.push_back(p.detach().reshape({-1}).clone());
  t.params = at::cat(flat);
  return t;
}

// With a client torch optimizer: Adam, or SGD with momentum.
Trajectory train(Communicator& c, int steps, const std::string& cfg, bool adam) {
  return train_with(c, steps, cfg, [adam](Net& net) -> std::shared_ptr<torch::optim::Optimizer> {
    if (adam) return std::make_shared<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(0.01));
    return std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  });
}

// With the config's own optimizer (ZeRO runs dscpp's optimizer on each rank's shard).
Trajectory train_cfg(Communicator& c, int steps, const std::string& cfg) {
  return train_with(c, steps, cfg, nullptr);
}

void expect_same(const Trajectory& a, const Trajectory& ref, double rtol, const std::string& what) {
  ASSERT_EQ(a.losses.size(), ref.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i)
    EXPECT_NEAR(a.losses[i], ref.losses[i], rtol * std::abs(ref.losses[i]) + 1e-12) << what << " step " << i;
  double err = (a.params - ref.params).abs().max().item<double>();
  double scale = ref.params.abs().max().item<double>();
  EXPECT_LE(err, rtol * scale) << what << ": final parameters differ by " << err;
}

struct Case {
  int world, gas;
};

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

// ZeRO stage 1 (sharded optimizer state, reduce-scatter, all-gather) reproduces stage 0 at every
// world size and GAS, with parameter counts not divisible by the world size (280 parameters at
// world 3), tiny all-gather buckets, and the same logged grad_norm.
TEST(EngineZero, Stage1MatchesStage0) {
  const int B = 24, steps = 6;
  const std::string opt = ", \"gradient_clipping\": 0.05, \"optimizer\": {\"type\": \"AdamW\", "
                          "\"params\": {\"lr\": 0.01, \"weight_decay\": 0.1}}";
  for (Case cs : {Case{1, 1}, Case{2, 1}, Case{2, 2}, Case{3, 1}, Case{3, 4}, Case{4, 2}}) {
    const int micro = B / (cs.world * cs.gas);
    std::string what = "world " + std::to_string(cs.world) + " gas " + std::to_string(cs.gas);
    std::vector<Trajectory> s0(cs.world), s1(cs.world), s1small(cs.world);
    auto run = [&](std::vector<Trajectory>& out, const std::string& zero) {
      auto errors = run_thread_ranks(cs.world, [&](Communicator& c) {
        out[c.rank()] = train_cfg(c, steps, config_json(B, micro, opt + zero));
      });
      for (auto& e : errors) ASSERT_FALSE(e) << what << zero << ": " << error_text(e);
    };
    run(s0, "");
    run(s1, ", \"zero_optimization\": {\"stage\": 1}");
    run(s1small, ", \"zero_optimization\": {\"stage\": 1, \"allgather_bucket_size\": 8}");
    for (int r = 0; r < cs.world; ++r) {
      expect_same(s1[r], s0[0], 1e-6, what + " stage 1 rank " + std::to_string(r));
      expect_same(s1small[r], s0[0], 1e-6, what + " stage 1, small all-gather buckets");
      for (int i = 0; i < steps; ++i)
        EXPECT_NEAR(s1[r].grad_norms[i], s0[0].grad_norms[i], 1e-6 * s0[0].grad_norms[i]) << what;
    }
  }
}

TEST(EngineZero, ClientOptimizerNeedsZeroAllowUntestedOptimizer) {
  auto errors = run_thread_ranks(1, [&](Communicator& c) {
    Net net = make_net(1);
    InitOptions opts;
    opts.comm = std::shared_ptr<Communicator>(&c, [](Communicator*) {});
    opts.optimizer = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
    auto msg = testing::error_of<ConfigError>([&] {
      initialize(net.ptr(), config_json(2, 2, ", \"zero_optimization\": {\"stage\": 1}"), opts);
    });
    EXPECT_NE(msg.find("zero_allow_untested_optimizer"), std::string::npos) << msg;
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
}

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
    InitOptions opts;
    opts.comm = std::shared_ptr<Communicator>(&c, [](Communicator*) {});
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
    InitOptions opts;
    opts.comm = std::shared_ptr<Communicator>(&c, [](Communicator*) {});
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
    InitOptions opts;
    opts.comm = std::shared_ptr<Communicator>(&c, [](Communicator*) {});
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
    InitOptions opts;
    opts.comm = std::shared_ptr<Communicator>(&c, [](Communicator*) {});
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

// Regression: the gradient hooks must not outlive the engine that installed them.
TEST(Engine, ModelOutlivesItsEngine) {
  auto errors = run_thread_ranks(1, [&](Communicator& c) {
    Net net = make_net(3);
    {
      InitOptions opts;
      opts.comm = std::shared_ptr<Communicator>(&c, [](Communicator*) {});
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

TEST(Engine, ConfigErrorsAreClear) {
  auto errors = run_thread_ranks(1, [&](Communicator& c) {
    Net net = make_net(1);
    InitOptions opts;
    opts.comm = std::shared_ptr<Communicator>(&c, [](Communicator*) {});
    try {
      initialize(net.ptr(), config_json(4, 4), opts);
      ADD_FAILURE() << "no optimizer accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("no optimizer section"), std::string::npos) << e.what();
    }
    try {
      initialize(net.ptr(), config_json(4, 3), opts);
      ADD_FAILURE() << "inconsistent batch accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("train_batch_size 4"), std::string::npos) << e.what();
    }
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
}

}  // namespace
}  // namespace dscpp
