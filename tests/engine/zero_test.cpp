// ZeRO stages 1 and 2 and mixed precision, with ranks as threads over a shared store: each stage
// reproduces stage 0 under every communication setting, the engine's memory accounting matches
// the ZeRO formulas, bf16 and fp16 train (fp16 with DeepSpeed's loss scaler, driven by injected
// overflows), and bad input gets a clear error.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>
#include <mutex>
#include <string>
#include <torch/nn/module.h>

#include "dscpp/engine.h"
#include "dscpp/error.h"
#include "engine/grad_reducer.h"
#include "engine/test_net.h"
#include "support/errors.h"
#include "support/thread_ranks.h"

namespace dscpp {
namespace {

using comm::Communicator;
using testing::error_text;
using testing::run_thread_ranks;

using namespace enginetest;  // NOLINT: the fixtures of this file's tests

const std::string kAdamW = ", \"gradient_clipping\": 0.05, \"optimizer\": {\"type\": \"AdamW\", "
                           "\"params\": {\"lr\": 0.01, \"weight_decay\": 0.1}}";

// Runs train_cfg on `world` thread ranks; one trajectory per rank.
std::vector<Trajectory> run_ranks(int world, int steps, const std::string& cfg) {
  std::vector<Trajectory> out(world);
  auto errors = run_thread_ranks(world, [&](Communicator& c) { out[c.rank()] = train_cfg(c, steps, cfg); });
  for (auto& e : errors) EXPECT_FALSE(e) << cfg << ": " << error_text(e);
  return out;
}

// A GradReducer over `module`'s parameters, for the tests that watch the gradient path itself.
std::unique_ptr<engine::GradReducer> make_reducer(torch::nn::Module& module, Communicator& c,
                                                  const engine::GradReduceOptions& o) {
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  for (auto& item : module.named_parameters()) {
    params.push_back(item.value());
    names.push_back(item.key());
  }
  return std::make_unique<engine::GradReducer>(params, names, c, o);
}

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

// Buckets are reduced while backward runs, not after it: parameters the loss cannot reach (the
// unused `branch`, registered last, so in the first bucket to launch) are ready before backward
// starts and hold nothing back. Every mode, one parameter per bucket.
TEST(EngineZero, BucketsLaunchDuringBackwardDespiteAnUnusedParameter) {
  using engine::ReduceMode;
  auto errors = run_thread_ranks(1, [&](Communicator& c) {
    for (ReduceMode mode : {ReduceMode::kAllReduce, ReduceMode::kReduceScatterInPlace, ReduceMode::kReduceScatter}) {
      Net net = make_net(1);
      const size_t n = net->parameters().size();
      engine::GradReduceOptions o;
      o.mode = mode;
      o.reduce_bucket_size = 1;
      o.overlap_comm = true;
      auto reducer_ptr = make_reducer(*net, c, o);
      auto& reducer = *reducer_ptr;
      ASSERT_EQ(reducer.num_buckets(), n);
      at::Tensor loss = at::mse_loss(net->forward(dataset_x().narrow(0, 0, 2)), dataset_y().narrow(0, 0, 2));
      reducer.prepare_backward(true, loss);
      EXPECT_EQ(reducer.buckets_launched(), 2u) << "the unused branch's weight and bias";
      // fc1.weight's gradient is the last one autograd produces: every other bucket has been
      // launched from the hooks by the time backward returns.
      loss.backward();
      EXPECT_GE(reducer.buckets_launched(), n - 1) << "mode " << static_cast<int>(mode);
      reducer.finish_backward();
      EXPECT_EQ(reducer.buckets_launched(), n);
      EXPECT_EQ(reducer.unused_in_last_backward(), (std::vector<std::string>{"branch.weight", "branch.bias"}));
    }
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
}

// NOTE [bucket cap]: DeepSpeed's default buckets (5e8 elements) are cut to a sixteenth of the
// model, never below 2^20 elements; smaller values are kept.
TEST(EngineZero, BucketsAboveASixteenthOfTheModelAreCapped) {
  EXPECT_EQ(engine::capped_bucket_size(500000000, 151681024), 9480064);
  EXPECT_EQ(engine::capped_bucket_size(5000000, 151681024), 5000000);
  EXPECT_EQ(engine::capped_bucket_size(500000000, 280), int64_t{1} << 20);
  EXPECT_EQ(engine::capped_bucket_size(8, 280), 8);
}

// NOTE [stage 2 slots]: gradients that arrive in bucket order go straight into the staging
// slots (autograd keeps none), with one slot (overlap_comm false) or two.
TEST(EngineZero, Stage2GradientsGoStraightIntoTheStagingSlots) {
  auto errors = run_thread_ranks(2, [&](Communicator& c) {
    for (bool overlap : {false, true}) {
      Net net = make_net(1);
      engine::GradReduceOptions o;
      o.mode = engine::ReduceMode::kReduceScatter;
      o.reduce_bucket_size = 144;  // {branch, fc2} and {fc1}
      o.overlap_comm = overlap;
      auto reducer_ptr = make_reducer(*net, c, o);
      auto& reducer = *reducer_ptr;
      ASSERT_EQ(reducer.num_buckets(), 2u);
      EXPECT_EQ(reducer.staging_bytes(), (overlap ? 2 : 1) * 4 * 144);
      for (int step = 0; step < 2; ++step) {
        at::Tensor loss = at::mse_loss(net->forward(dataset_x().narrow(0, 2 * c.rank(), 2)),
                                       dataset_y().narrow(0, 2 * c.rank(), 2));
        reducer.prepare_backward(true, loss);
        loss.backward();
        reducer.finish_backward();
        EXPECT_EQ(reducer.kept_gradients(), 0) << "overlap " << overlap;
        for (auto& p : net->parameters()) EXPECT_FALSE(p.grad().defined()) << "a gradient outlived its bucket";
      }
    }
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
}

// A model registered against the order backward reaches it: its last layer is registered first,
// so that layer's gradients (the first to arrive) belong to the last bucket to launch and some
// arrive while every slot serves a bucket still accumulating. Autograd keeps those; stage 2
// still reproduces stage 0 exactly, with one slot and with two.
struct ReversedNetImpl : torch::nn::Module {
  ReversedNetImpl() {
    out = register_module("out", torch::nn::Linear(16, 4));
    mid = register_module("mid", torch::nn::Linear(16, 16));
    in = register_module("in", torch::nn::Linear(8, 16));
  }
  at::Tensor forward(const at::Tensor& x) {
    return out->forward(at::tanh(mid->forward(at::tanh(in->forward(x)))));
  }
  torch::nn::Linear out{nullptr}, mid{nullptr}, in{nullptr};
};
TORCH_MODULE(ReversedNet);

TEST(EngineZero, Stage2MatchesStage0WhenGradientsArriveOutOfBucketOrder) {
  // Buckets from the end of the registration order: {in}, {mid.bias}, {mid.weight}, {out}.
  const std::string bucket = ", \"reduce_bucket_size\": 150";
  auto build = [] {
    static std::mutex mu;  // the rank threads share the global generator
    std::lock_guard<std::mutex> g(mu);
    at::manual_seed(7);
    return ReversedNet();
  };
  auto run = [&](const std::string& zero) {
    std::vector<double> losses;
    at::Tensor final_params;
    auto errors = run_thread_ranks(2, [&](Communicator& c) {
      ReversedNet net = build();
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
  // The kept path was taken: with one slot, {out} takes it first and the other three buckets'
  // gradients (mid's and in's four parameters) arrive while it still accumulates.
  auto errors = run_thread_ranks(1, [&](Communicator& c) {
    ReversedNet net = build();
    engine::GradReduceOptions o;
    o.mode = engine::ReduceMode::kReduceScatter;
    o.reduce_bucket_size = 150;
    auto reducer_ptr = make_reducer(*net, c, o);
    auto& reducer = *reducer_ptr;
    ASSERT_EQ(reducer.num_buckets(), 4u);
    at::Tensor loss = at::mse_loss(net->forward(dataset_x().narrow(0, 0, 2)), dataset_y().narrow(0, 0, 2));
    reducer.prepare_backward(true, loss);
    loss.backward();
    reducer.finish_backward();
    EXPECT_EQ(reducer.kept_gradients(), 4);
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
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

// bf16: parameters and gradients in bf16, fp32 master weights. At world 1 every stage does the
// same arithmetic; across ranks the bf16 reductions differ in order, so stages agree loosely;
// and bf16 follows the fp32 run closely.
TEST(EngineMixedPrecision, Bf16TrainsAndEveryStageAgrees) {
  const int B = 24, steps = 6;
  const std::string bf16 = ", \"bf16\": {\"enabled\": true}";
  auto fp32 = run_ranks(1, steps, config_json(B, 12, kAdamW));
  auto ref = run_ranks(1, steps, config_json(B, 12, kAdamW + bf16));
  EXPECT_LT(ref[0].losses.back(), ref[0].losses.front()) << "bf16 does not learn";
  for (int i = 0; i < steps; ++i) EXPECT_NEAR(ref[0].losses[i], fp32[0].losses[i], 0.02 * fp32[0].losses[i]);
  for (int stage : {1, 2}) {
    std::string zero = ", \"zero_optimization\": {\"stage\": " + std::to_string(stage) + ", \"reduce_bucket_size\": 30}";
    auto one = run_ranks(1, steps, config_json(B, 12, kAdamW + bf16 + zero));
    expect_same(one[0], ref[0], 1e-6, "bf16 world 1 stage " + std::to_string(stage));
    auto two = run_ranks(2, steps, config_json(B, 6, kAdamW + bf16 + zero));
    for (int r = 0; r < 2; ++r) {
      EXPECT_TRUE(at::equal(two[r].params, two[0].params)) << "replicas diverged";
      for (int i = 0; i < steps; ++i) EXPECT_NEAR(two[r].losses[i], ref[0].losses[i], 0.02 * ref[0].losses[i]);
    }
  }
}

// A model whose forward has only element-wise operations: libtorch 1.13 has CPU fp16 kernels
// for those, but none for matmul, tanh, layer_norm, softmax or GELU (see docs/zero.md).
struct ElemNetImpl : torch::nn::Module {
  ElemNetImpl() {
    w = register_parameter("w", at::linspace(-0.5, 0.7, 8));
    b = register_parameter("b", at::linspace(0.1, -0.2, 8));
    v = register_parameter("v", at::linspace(0.3, -0.4, 8).reshape({4, 2}));
  }
  at::Tensor forward(const at::Tensor& x) {  // x [n, 8] -> [n, 4]
    at::Tensor h = x * w + b;
    return (h * h).reshape({-1, 4, 2}).mul(v).sum(-1);
  }
  at::Tensor w, b, v;
};
TORCH_MODULE(ElemNet);

struct Fp16Run {
  std::vector<double> lrs, scales;
  std::vector<bool> skipped;
  at::Tensor params;
  int64_t skipped_steps = 0;
};

// Trains ElemNet for overflow.size() steps; at step s, rank `overflow[s]` (or -1: none) feeds an
// input whose fp16 gradients overflow (finite loss, infinite gradients).
Fp16Run train_elem(Communicator& c, const std::string& cfg, const std::vector<int>& overflow) {
  ElemNet net;
  InitOptions opts = borrowed(c);
  auto engine = initialize(net.ptr(), cfg, opts);
  auto X = dataset_x().narrow(0, 2 * c.rank(), 2), Y = dataset_y().narrow(0, 2 * c.rank(), 2);
  Fp16Run run;
  for (size_t s = 0; s < overflow.size(); ++s) {
    at::Tensor x = overflow[s] == c.rank() ? X * 300.0 : X;
    at::Tensor out = net->forward(x.to(net->w.scalar_type()));
    engine->backward(at::mse_loss(out.to(at::kFloat), Y));
    engine->step();
    run.lrs.push_back(engine->last_step().lr);
    run.scales.push_back(engine->loss_scale());
    run.skipped.push_back(engine->last_step().skipped);
  }
  run.params = at::cat({net->w.detach(), net->b.detach(), net->v.detach().reshape({-1})}).to(at::kFloat);
  run.skipped_steps = engine->skipped_steps();
  return run;
}

const std::string kFp16Opt = ", \"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 0.01}}, "
                             "\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": 0.001, "
                             "\"warmup_max_lr\": 0.01, \"warmup_num_steps\": 10, \"warmup_type\": \"linear\"}}";

// Overflows injected on one rank skip the step on every rank, spend the hysteresis, then halve
// the scale; the LR schedule does not tick on a skipped step; the replicas stay identical; for
// every stage.
TEST(EngineMixedPrecision, Fp16DynamicLossScaleFollowsDeepSpeedAcrossRanks) {
  const std::string fp16 = ", \"fp16\": {\"enabled\": true, \"initial_scale_power\": 8, \"hysteresis\": 2, "
                           "\"loss_scale_window\": 3}";
  //                           step: 1   2  3  4   5   6   7   8
  const std::vector<int> overflow = {-1, 1, 0, -1, -1, -1, -1, 1};
  std::vector<Fp16Run> clean(2);  // the same schedule without overflows
  auto clean_errors = run_thread_ranks(2, [&](Communicator& c) {
    clean[c.rank()] = train_elem(c, config_json(4, 2, kFp16Opt + fp16), std::vector<int>(8, -1));
  });
  for (auto& e : clean_errors) ASSERT_FALSE(e) << error_text(e);
  for (int stage : {0, 1, 2}) {
    std::vector<Fp16Run> runs(2);
    std::string cfg = config_json(4, 2, kFp16Opt + fp16 + ", \"zero_optimization\": {\"stage\": " +
                                            std::to_string(stage) + "}");
    auto errors = run_thread_ranks(2, [&](Communicator& c) { runs[c.rank()] = train_elem(c, cfg, overflow); });
    for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
    const auto& r = runs[0];
    // Step 2 spends the hysteresis (2 -> 1), step 3 halves (256 -> 128) and restarts the window;
    // 3 clean steps later (step 6) the scale doubles and the hysteresis refills; step 8 spends it.
    EXPECT_EQ(r.scales, (std::vector<double>{256, 256, 128, 128, 128, 256, 256, 256})) << "stage " << stage;
    EXPECT_EQ(r.skipped, (std::vector<bool>{false, true, true, false, false, false, false, true}));
    EXPECT_EQ(r.skipped_steps, 3);
    // The schedule ticks only on applied steps: steps 2-4 all run at the schedule's second LR.
    const auto& l = clean[0].lrs;
    EXPECT_EQ(r.lrs, (std::vector<double>{l[0], l[1], l[1], l[1], l[2], l[3], l[4], l[5]}));
    EXPECT_LT(l[1], l[5]);
    EXPECT_TRUE(at::equal(runs[0].params, runs[1].params)) << "replicas diverged at stage " << stage;
    EXPECT_TRUE(at::isfinite(runs[0].params).all().item<bool>());
  }
}

// A static scale never moves, overflow still skips; at the minimum dynamic scale an overflow
// stops every rank with what to try.
TEST(EngineMixedPrecision, Fp16StaticScaleAndTheMinimumScaleError) {
  std::vector<Fp16Run> runs(2);
  std::string cfg = config_json(4, 2, kFp16Opt + ", \"fp16\": {\"enabled\": true, \"loss_scale\": 64}");
  auto errors = run_thread_ranks(2, [&](Communicator& c) { runs[c.rank()] = train_elem(c, cfg, {-1, 0, -1}); });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
  EXPECT_EQ(runs[0].scales, (std::vector<double>{64, 64, 64}));
  EXPECT_EQ(runs[1].skipped, (std::vector<bool>{false, true, false}));

  cfg = config_json(4, 2, kFp16Opt + ", \"fp16\": {\"enabled\": true, \"initial_scale_power\": 0, "
                                     "\"hysteresis\": 1, \"min_loss_scale\": 1}, \"zero_optimization\": {\"stage\": 2}");
  errors = run_thread_ranks(2, [&](Communicator& c) { train_elem(c, cfg, {-1, 1}); });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r << " went on at the minimum loss scale";
    const std::string msg = error_text(errors[r]);
    EXPECT_NE(msg.find("minimum"), std::string::npos) << msg;
    EXPECT_NE(msg.find("HINT"), std::string::npos) << msg;
  }
}

// fp16 follows the fp32 trajectory closely when nothing overflows, at every stage.
TEST(EngineMixedPrecision, Fp16FollowsFp32) {
  std::vector<Fp16Run> fp32(2);
  const std::vector<int> none(6, -1);
  auto errors = run_thread_ranks(2, [&](Communicator& c) { fp32[c.rank()] = train_elem(c, config_json(4, 2, kFp16Opt), none); });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
  ElemNet init;
  const at::Tensor fp32_init = at::cat({init->w.detach(), init->b.detach(), init->v.detach().reshape({-1})});
  for (int stage : {0, 2}) {
    std::vector<Fp16Run> half(2);
    std::string cfg = config_json(4, 2, kFp16Opt + ", \"fp16\": {\"enabled\": true, \"initial_scale_power\": 10}, \"zero_optimization\": "
                                            "{\"stage\": " + std::to_string(stage) + "}");
    errors = run_thread_ranks(2, [&](Communicator& c) { half[c.rank()] = train_elem(c, cfg, none); });
    for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
    EXPECT_EQ(half[0].skipped_steps, 0);
    double err = (half[0].params - fp32[0].params).abs().max().item<double>();
    EXPECT_LT(err, 5e-3) << "stage " << stage;
    EXPECT_GT((half[0].params - fp32_init).abs().max().item<double>(), 1e-3) << "fp16 did not train";
  }
}

}  // namespace
}  // namespace dscpp
