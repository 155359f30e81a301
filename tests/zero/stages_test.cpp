// ZeRO stages 1 and 2 against stage 0, with ranks as threads over a shared store: each stage
// reproduces stage 0 under every communication setting and gradient order, tied parameters are
// one parameter, the engine's memory accounting matches the ZeRO formulas, and bad input gets a
// clear error.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <torch/nn/module.h>

#include "dscpp/engine.h"
#include "dscpp/error.h"
#include "engine/test_net.h"
#include "support/errors.h"
#include "support/thread_ranks.h"

namespace dscpp {
namespace {

using comm::Communicator;
using testing::error_text;
using testing::run_thread_ranks;

using namespace enginetest;  // NOLINT: the fixtures of this file's tests

// ZeRO stage 1 (sharded optimizer state, reduce-scatter, all-gather) reproduces stage 0 at every
// world size and GAS, with parameter counts not divisible by the world size (280 parameters at
// world 3), tiny all-gather buckets, and the same logged grad_norm.
TEST(EngineZero, Stage1MatchesStage0) {
  const int B = 24, steps = 6;
  for (Case cs : {Case{1, 1}, Case{2, 1}, Case{2, 2}, Case{3, 1}, Case{3, 4}, Case{4, 2}}) {
    const int micro = B / (cs.world * cs.gas);
    std::string what = "world " + std::to_string(cs.world) + " gas " + std::to_string(cs.gas);
    auto s0 = run_ranks(cs.world, steps, config_json(B, micro, kAdamW));
    auto s1 = run_ranks(cs.world, steps, config_json(B, micro, kAdamW + ", \"zero_optimization\": {\"stage\": 1}"));
    auto s1small = run_ranks(cs.world, steps, config_json(B, micro, kAdamW + ", \"zero_optimization\": "
                                                                    "{\"stage\": 1, \"allgather_bucket_size\": 8}"));
    for (int r = 0; r < cs.world; ++r) {
      expect_same(s1[r], s0[0], 1e-6, what + " stage 1 rank " + std::to_string(r));
      expect_same(s1small[r], s0[0], 1e-6, what + " stage 1, small all-gather buckets");
      for (int i = 0; i < steps; ++i)
        EXPECT_NEAR(s1[r].grad_norms[i], s0[0].grad_norms[i], 1e-6 * s0[0].grad_norms[i]) << what;
    }
  }
}

// ZeRO stage 2 (gradients reduce-scattered bucket by bucket during backward into an
// accumulating shard) reproduces stage 0 for every combination of overlap_comm x
// contiguous_gradients, buckets smaller than one parameter and larger than the model, and
// reduce_scatter false (all-reduce, keep this rank's part), at worlds 1-4 and GAS 1, 2, 4. The
// model's `branch` gets no gradient (an unused parameter) in every step.
TEST(EngineZero, Stage2MatchesStage0UnderEveryCommunicationSetting) {
  const int B = 24, steps = 5;
  for (Case cs : {Case{1, 2}, Case{2, 1}, Case{2, 4}, Case{3, 2}, Case{4, 1}}) {
    const int micro = B / (cs.world * cs.gas);
    std::string what = "world " + std::to_string(cs.world) + " gas " + std::to_string(cs.gas);
    auto s0 = run_ranks(cs.world, steps, config_json(B, micro, kAdamW));
    for (bool overlap : {false, true}) {
      for (bool contiguous : {false, true}) {
        for (int bucket : {8, 100000}) {
          std::string zero = ", \"zero_optimization\": {\"stage\": 2, \"overlap_comm\": " +
                             std::string(overlap ? "true" : "false") + ", \"contiguous_gradients\": " +
                             (contiguous ? "true" : "false") + ", \"reduce_bucket_size\": " +
                             std::to_string(bucket) + "}";
          auto s2 = run_ranks(cs.world, steps, config_json(B, micro, kAdamW + zero));
          for (int r = 0; r < cs.world; ++r) {
            expect_same(s2[r], s0[0], 1e-6, what + zero + " rank " + std::to_string(r));
            for (int i = 0; i < steps; ++i)
              EXPECT_NEAR(s2[r].grad_norms[i], s0[0].grad_norms[i], 1e-6 * s0[0].grad_norms[i]) << what << zero;
          }
        }
      }
    }
    auto s2ar = run_ranks(cs.world, steps, config_json(B, micro, kAdamW + ", \"zero_optimization\": {\"stage\": 2, "
                                                                  "\"reduce_scatter\": false, \"reduce_bucket_size\": 50}"));
    for (int r = 0; r < cs.world; ++r) expect_same(s2ar[r], s0[0], 1e-6, what + " stage 2 reduce_scatter false");
  }
}

// Two simulated hosts of 2 ranks each (shared memory inside a host, Gloo between hosts: NOTE
// [hierarchical collectives]): every stage, fp32 and bf16, reproduces stage 0 on one host, and
// every rank ends with the same parameters; in fp32, and in bf16 with gradients reduced in fp32
// (NOTE [wire dtype]), each stage's training is the same stage's on one host bit for bit (NOTE
// [tree order]: 2 hosts of 2 ranks sum in one host's tree); in bf16 reduced in bf16 it is not
// (the sum is rounded to bf16 inside each host, then again between hosts).
TEST(EngineZero, EveryStageAcrossTwoHostsMatchesOneHost) {
  const int B = 24, steps = 5, world = 4;
  const std::string bf16 = ", \"bf16\": {\"enabled\": true}";
  for (std::string precision : {std::string(), bf16, bf16 + ", \"communication_data_type\": \"fp32\""}) {
    const double tol = precision.empty() ? 1e-6 : 2e-2;
    auto ref = run_ranks(world, steps, config_json(B, 3, kAdamW + precision));
    for (int stage : {0, 1, 2, 3}) {
      const std::string cfg = config_json(B, 3, kAdamW + precision +
                                                    ", \"zero_optimization\": {\"stage\": " +
                                                    std::to_string(stage) +
                                                    ", \"reduce_bucket_size\": 100}");
      auto got = run_ranks(world, steps, cfg, nullptr, testing::on_hosts(2));
      for (int r = 0; r < world; ++r) {
        expect_same(got[r], ref[0], tol, cfg + " rank " + std::to_string(r));
        EXPECT_TRUE(at::equal(got[r].params, got[0].params)) << cfg << " rank " << r;
      }
      if (precision == bf16) continue;
      auto one_host = stage == 0 ? ref : run_ranks(world, steps, cfg);
      EXPECT_TRUE(at::equal(got[0].params, one_host[0].params)) << cfg;
      EXPECT_EQ(got[0].losses, one_host[0].losses) << cfg;
    }
  }
}

// A model registered against the order backward reaches it (ReversedNet): some of its gradients
// arrive while every staging slot serves a bucket still accumulating, and autograd keeps them
// (ZeroReducer.GradientsArrivingOutOfBucketOrderAreKeptThenCopied); stage 2 still reproduces
// stage 0 exactly, with one slot and with two.
TEST(EngineZero, Stage2MatchesStage0WhenGradientsArriveOutOfBucketOrder) {
  // Buckets from the end of the registration order: {in}, {mid.bias}, {mid.weight}, {out}.
  const std::string bucket = ", \"reduce_bucket_size\": 150";
  auto run = [&](const std::string& zero) {
    std::vector<double> losses;
    at::Tensor final_params;
    auto errors = run_thread_ranks(2, [&](Communicator& c) {
      ReversedNet net = make_reversed_net();
      auto engine = initialize(net.ptr(), config_json(4, 2, kAdamW + zero), borrowed(c));
      auto X = dataset_x().narrow(0, 2 * c.rank(), 2), Y = dataset_y().narrow(0, 2 * c.rank(), 2);
      for (int s = 0; s < 4; ++s) {
        engine->backward(at::mse_loss(net->forward(X), Y));
        engine->step();
        if (c.rank() == 0) losses.push_back(engine->last_step().loss);
      }
      if (c.rank() == 0) {
        std::vector<at::Tensor> flat;
        for (auto& p : net->parameters()) flat.push_back(p.detach().reshape({-1}));
        final_params = at::cat(flat);
      }
    });
    for (auto& e : errors) EXPECT_FALSE(e) << zero << ": " << error_text(e);
    return std::make_pair(losses, final_params);
  };
  auto ref = run("");
  for (bool overlap : {false, true}) {
    std::string zero = ", \"zero_optimization\": {\"stage\": 2" + bucket + ", \"overlap_comm\": " +
                       (overlap ? "true" : "false") + "}";
    auto got = run(zero);
    ASSERT_EQ(got.first.size(), ref.first.size());
    for (size_t i = 0; i < ref.first.size(); ++i) EXPECT_NEAR(got.first[i], ref.first[i], 1e-6 * ref.first[i]) << zero;
    EXPECT_TRUE(at::allclose(got.second, ref.second, 1e-6, 1e-7)) << zero;
  }
}

// A parameter registered under two names (tied, used twice in forward) is one parameter: the
// engine holds it once and its two gradient contributions are summed before it is reduced.
struct TiedNetImpl : torch::nn::Module {
  TiedNetImpl() {
    w = register_parameter("encoder_w", at::linspace(-0.3, 0.4, 32).reshape({4, 8}));
    register_parameter("decoder_w", w);  // the same tensor
    b = register_parameter("b", at::zeros({4}));
  }
  at::Tensor forward(const at::Tensor& x) {  // [n, 8] -> [n, 4] -> [n, 8] -> [n, 4]
    at::Tensor h = at::tanh(at::linear(x, w, b));
    return at::linear(at::linear(h, w.t()), w);
  }
  at::Tensor w, b;
};
TORCH_MODULE(TiedNet);

TEST(EngineZero, TiedParameterIsOneParameterAtEveryStage) {
  std::vector<std::vector<double>> losses(3);
  std::vector<at::Tensor> weights(3);
  for (int stage : {0, 1, 2}) {
    auto errors = run_thread_ranks(2, [&](Communicator& c) {
      TiedNet net;
      auto engine = initialize(net.ptr(), config_json(4, 2, kAdamW + ", \"zero_optimization\": {\"stage\": " +
                                                                std::to_string(stage) + ", \"reduce_bucket_size\": 8}"),
                               borrowed(c));
      EXPECT_EQ(engine->memory_stats().params, 4 * (32 + 4));
      auto X = dataset_x().narrow(0, 2 * c.rank(), 2), Y = dataset_y().narrow(0, 2 * c.rank(), 2);
      for (int s = 0; s < 4; ++s) {
        engine->backward(at::mse_loss(net->forward(X), Y));
        engine->step();
        if (c.rank() == 0) losses[stage].push_back(engine->last_step().loss);
      }
      if (c.rank() == 0) weights[stage] = net->w.detach().clone();
    });
    for (auto& e : errors) ASSERT_FALSE(e) << "stage " << stage << ": " << error_text(e);
  }
  for (int stage : {1, 2}) {
    for (size_t i = 0; i < losses[0].size(); ++i) EXPECT_NEAR(losses[stage][i], losses[0][i], 1e-6 * losses[0][i]);
    EXPECT_TRUE(at::allclose(weights[stage], weights[0], 1e-6, 1e-7)) << "stage " << stage;
  }
}

// A gradient that arrives after its bucket was reduced is an error on that rank, never lost
// silently, and the window is dropped on every rank. Here a backward run from inside a hook (as
// reentrant checkpointing does) reaches the unused branch, whose buckets (one parameter each)
// went before backward; once the error propagates, once it is swallowed in the hook.
TEST(EngineZero, GradientAfterItsBucketWasReducedIsAnErrorNotALoss) {
  for (int stage : {0, 2}) {
    for (bool swallow : {false, true}) {
      auto errors = run_thread_ranks(2, [&](Communicator& c) {
        Net net = make_net(1);
        auto engine = initialize(net.ptr(), config_json(4, 2, kAdamW + ", \"zero_optimization\": {\"stage\": " +
                                                                  std::to_string(stage) + ", \"reduce_bucket_size\": 10}"),
                                 borrowed(c));
        auto X = dataset_x().narrow(0, 2 * c.rank(), 2), Y = dataset_y().narrow(0, 2 * c.rank(), 2);
        at::Tensor h = at::tanh(net->fc1->forward(X));
        if (c.rank() == 1) {
          h.register_hook([&](at::Tensor g) {
            c10::AutoGradMode enable(true);  // backward runs its hooks with grad mode off
            try {
              (net->branch->weight.sum() * 0.0).backward();  // a backward of its own
            } catch (const Error&) {
              if (!swallow) throw;
            }
            return g;
          });
        }
        at::Tensor loss = at::mse_loss(net->fc2->forward(h), Y);
        if (c.rank() == 1) {
          auto msg = testing::error_of<Error>([&] { engine->backward(loss); });
          EXPECT_NE(msg.find(swallow ? "a gradient arrived after its bucket had been reduced"
                                     : "parameter 'branch.weight' received a gradient in this backward after"),
                    std::string::npos) << msg;
        } else {
          engine->backward(loss);
        }
        auto msg = testing::error_of<Error>([&] { engine->step(); });
        EXPECT_NE(msg.find("backward() failed on rank(s) 1"), std::string::npos) << msg;
      });
      for (auto& e : errors) ASSERT_FALSE(e) << "stage " << stage << " swallow " << swallow << ": " << error_text(e);
    }
  }
}

TEST(EngineZero, ClientOptimizerNeedsZeroAllowUntestedOptimizer) {
  auto errors = run_thread_ranks(1, [&](Communicator& c) {
    Net net = make_net(1);
    InitOptions opts = borrowed(c);
    opts.optimizer = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
    for (int stage : {1, 2}) {
      auto msg = testing::error_of<ConfigError>([&] {
        initialize(net.ptr(), config_json(2, 2, ", \"zero_optimization\": {\"stage\": " + std::to_string(stage) + "}"), opts);
      });
      EXPECT_NE(msg.find("zero_allow_untested_optimizer"), std::string::npos) << msg;
    }
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
}

// Stage 2 partitions gradients as backward runs: no_sync() is DeepSpeed's error, and with
// ignore_unused_parameters false a parameter without a gradient stops training, naming it.
TEST(EngineZero, Stage2RefusesNoSyncAndReportsUnusedParametersWhenAsked) {
  auto errors = run_thread_ranks(2, [&](Communicator& c) {
    Net net = make_net(1);
    InitOptions opts = borrowed(c);
    auto X = dataset_x().narrow(0, 2 * c.rank(), 2), Y = dataset_y().narrow(0, 2 * c.rank(), 2);
    {
      auto engine = initialize(net.ptr(), config_json(4, 2, kAdamW + ", \"zero_optimization\": {\"stage\": 2}"), opts);
      auto msg = testing::error_of<Error>([&] { auto guard = engine->no_sync(); });
      EXPECT_NE(msg.find("no_sync() is incompatible with ZeRO stage 2"), std::string::npos) << msg;
    }
    Net net2 = make_net(1);
    auto engine = initialize(net2.ptr(), config_json(4, 2, kAdamW + ", \"zero_optimization\": {\"stage\": 2, "
                                                     "\"ignore_unused_parameters\": false}"), opts);
    auto msg = testing::error_of<Error>([&] { engine->backward(at::mse_loss(net2->forward(X), Y)); });
    EXPECT_NE(msg.find("first: 'branch.weight'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("ignore_unused_parameters"), std::string::npos) << msg;
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
}

// The engine's accounting of what it holds is the ZeRO formula, byte for byte on the small net
// (280 parameters; at world 4 the shards are 70): fp32 Adam 16, 8 + 8/N, 4 + 12/N bytes per
// parameter; bf16 with fp32 master 16, 4 + 12/N, 2 + 14/N.
TEST(EngineZero, MemoryAccountingIsTheZeroFormula) {
  const int world = 4;
  const int64_t P = 280, S = P / world;
  struct Expect {
    std::string extra;
    int64_t params, grads, master, optim;
  };
  const std::string bf16 = ", \"bf16\": {\"enabled\": true}";
  std::vector<Expect> cases = {
      {"", 4 * P, 4 * (P + 2 + world), 0, 8 * P},  // stage 0 fp32 (the side channel rides along)
      {", \"zero_optimization\": {\"stage\": 1}", 4 * P, 4 * P, 0, 8 * S},
      {", \"zero_optimization\": {\"stage\": 2}", 4 * P, 4 * S, 0, 8 * S},
      {bf16, 2 * P, 2 * P, 4 * P, 8 * P},
      {bf16 + ", \"zero_optimization\": {\"stage\": 1}", 2 * P, 2 * P, 4 * S, 8 * S},
      {bf16 + ", \"zero_optimization\": {\"stage\": 2}", 2 * P, 2 * S, 4 * S, 8 * S},
  };
  for (const auto& ex : cases) {
    auto t = run_ranks(world, 1, config_json(8, 2, kAdamW + ex.extra));
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(t[r].memory.params, ex.params) << ex.extra;
      EXPECT_EQ(t[r].memory.grads, ex.grads) << ex.extra;
      EXPECT_EQ(t[r].memory.master, ex.master) << ex.extra;
      EXPECT_EQ(t[r].memory.optimizer_state, ex.optim) << ex.extra;
    }
  }
}

}  // namespace
}  // namespace dscpp
