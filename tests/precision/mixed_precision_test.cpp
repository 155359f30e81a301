// Mixed precision end to end, with ranks as threads: bf16 and fp16 train on fp32 master weights
// (src/precision/master_weights.h) at every stage, and fp16 follows DeepSpeed's dynamic loss
// scaler (src/precision/loss_scaler.h) across ranks, driven by injected overflows.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include <map>
#include <mutex>
#include <string>

#include "dscpp/engine.h"
#include "dscpp/error.h"
#include "dscpp/optim.h"
#include "dscpp/zero_unit.h"
#include "engine/estimate.h"
#include "engine/test_net.h"
#include "precision/autocast.h"
#include "support/errors.h"
#include "support/temp_dir.h"
#include "support/thread_ranks.h"

namespace dscpp {
namespace {

using comm::Communicator;
using testing::error_text;
using testing::run_thread_ranks;

using namespace enginetest;  // NOLINT: the fixtures of this file's tests

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

// data_types.grad_accum_dtype "fp32" at stage 1 in bf16 (DeepSpeed's BF16 optimizer; NOTE
// [accumulation dtype]): the full gradient buffer is fp32 (twice stage 1's bf16 bytes, as the
// estimate says); with one micro-step it trains exactly as bf16 accumulation does (the same bf16
// gradient, stepped from fp32 instead of fused from bf16); over 8 micro-steps on 2 ranks it
// follows the fp32 run, and the replicas agree.
TEST(EngineMixedPrecision, Bf16WithFp32AccumulationAtStage1) {
  const int B = 24, steps = 6;
  const std::string bf16 = ", \"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 1}";
  const std::string fp32_acc = bf16 + ", \"data_types\": {\"grad_accum_dtype\": \"fp32\"}";
  auto plain = run_ranks(1, steps, config_json(B, B, kAdamW + bf16));
  auto acc = run_ranks(1, steps, config_json(B, B, kAdamW + fp32_acc));
  expect_same(acc[0], plain[0], 1e-6, "one micro-step");
  EXPECT_EQ(acc[0].memory.grads, 2 * plain[0].memory.grads);
  const Config config = Config::parse(config_json(B, B, kAdamW + fp32_acc));
  const int64_t numel = acc[0].params.numel();
  EXPECT_EQ(acc[0].memory.grads, numel * 4);
  EXPECT_EQ(engine::estimate(engine::EstimateInput{numel}, config).grads, numel * 4);
  auto fp32 = run_ranks(1, steps, config_json(B, 3, kAdamW));
  auto two = run_ranks(2, steps, config_json(B, 3, kAdamW + fp32_acc));
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(at::equal(two[r].params, two[0].params)) << "replicas diverged";
    for (int i = 0; i < steps; ++i) EXPECT_NEAR(two[r].losses[i], fp32[0].losses[i], 0.02 * fp32[0].losses[i]);
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

// The zero_optimization section for `stage`; at stage 3 every parameter is sharded (ElemNet's are
// far below the default persistence threshold).
std::string zero_stage(int stage) {
  return ", \"zero_optimization\": {\"stage\": " + std::to_string(stage) +
         (stage == 3 ? ", \"stage3_param_persistence_threshold\": 0}" : "}");
}

// bf16.bf16_master_weights_and_grads: no fp32 master weights; each step's SGD update is taken
// from the bf16 parameters widened to fp32 and rounded back once, exactly as a bf16 twin updated
// by hand, at stages 1-3; the default (fp32 master weights) does not round the master (the
// test's power). memory_stats has no master weights, as the estimate says.
TEST(EngineMixedPrecision, Bf16MasterWeightsAreTheParameters) {
  const std::string sgd = R"(, "gradient_clipping": 0, "optimizer": {"type": "SGD", "params": {"lr": 0.1}})";
  auto errors = run_thread_ranks(1, [&](Communicator& c) {
    for (bool master : {true, false}) {
      for (int stage : {1, 2, 3}) {
        const std::string what = "stage " + std::to_string(stage) + (master ? " bf16 master" : "");
        const std::string cfg = config_json(4, 4, sgd + R"(, "bf16": {"enabled": true, "bf16_master_weights_and_grads": )" +
                                                      (master ? "true" : "false") + "}" + zero_stage(stage));
        Net net = make_net(1), twin = make_net(1);
        auto engine = initialize(net.ptr(), cfg, borrowed(c));
        twin->to(at::kBFloat16);
        const at::Tensor X = dataset_x().narrow(0, 0, 4), Y = dataset_y().narrow(0, 0, 4);
        for (int step = 0; step < 3; ++step) {
          engine->backward(at::mse_loss(net->forward(X.to(at::kBFloat16)).to(at::kFloat), Y));
          engine->step();
          at::mse_loss(twin->forward(X.to(at::kBFloat16)).to(at::kFloat), Y).backward();
          at::NoGradGuard no_grad;
          for (auto& p : twin->parameters()) {
            if (!p.grad().defined()) continue;  // the unused branch: no gradient, no update
            p.copy_(p.to(at::kFloat) - 0.1 * p.grad().to(at::kFloat));
            p.mutable_grad() = at::Tensor();
          }
        }
        auto mine = net->named_parameters(), want = twin->named_parameters();
        bool all_equal = true;
        for (const auto& item : want) all_equal = all_equal && at::equal(mine[item.key()], item.value());
        EXPECT_EQ(all_equal, master) << what;
        int64_t numel = 0;
        for (const auto& p : net->parameters()) numel += p.numel();
        if (master && stage == 2) {
          // A checkpoint holds the bf16 values; a run with fp32 master weights (at stage 1)
          // loads them, and one with bf16 master weights (at stage 3) loads those back.
          testing::TempDir dir;
          engine->save_checkpoint(dir.path(), "bf16master");
          for (const std::string& other :
               {config_json(4, 4, sgd + R"(, "bf16": {"enabled": true})" + zero_stage(1)),
                config_json(4, 4, sgd + R"(, "bf16": {"enabled": true, "bf16_master_weights_and_grads": true})" +
                                      zero_stage(3))}) {
            Net again = make_net(2);
            auto loaded = initialize(again.ptr(), other, borrowed(c));
            loaded->load_checkpoint(dir.path(), "bf16master");
            auto got = again->named_parameters();
            for (const auto& item : want) EXPECT_TRUE(at::equal(got[item.key()], item.value())) << other;
          }
        }
        if (master) {
          EXPECT_EQ(engine->memory_stats().master, 0) << what;
          const Config config = Config::parse(cfg);
          EXPECT_EQ(engine::estimate(engine::EstimateInput{numel}, config).master, 0) << what;
        } else {
          EXPECT_GT(engine->memory_stats().master, 0) << what;
        }
      }
    }
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
}

// bf16 with bf16 master weights (and optionally bf16 optimizer states) at `stage`.
std::string bf16_master(bool states, int stage) {
  return std::string(R"(, "bf16": {"enabled": true, "bf16_master_weights_and_grads": true)") +
         (states ? R"(, "bf16_optimizer_states": true)" : "") + "}" + zero_stage(stage);
}

// bf16.bf16_optimizer_states (with bf16 master weights): the optimizer's states are bf16 too.
// Each step is the fp32 optimizer's on the parameters and states widened from bf16, both rounded
// back once: a bf16 twin stepped by optim::SGD (momentum 0.9) on widened copies is matched bit
// for bit at stages 1-3, while fp32 states (bf16 master weights alone) are not. The states take
// 2 bytes per element (Adam's two: 4), as the estimate says. A checkpoint holds the bf16 states;
// a run with fp32 states loads them, and so does one with bf16 states at another stage: each
// then takes the same next step as the run that saved.
TEST(EngineMixedPrecision, Bf16OptimizerStatesAreRoundedEveryStep) {
  const std::string sgd =
      R"(, "gradient_clipping": 0, "optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}})";
  const at::Tensor X = dataset_x().narrow(0, 0, 4), Y = dataset_y().narrow(0, 0, 4);
  auto train_step = [&](Net& net, Engine& engine) {
    engine.backward(at::mse_loss(net->forward(X.to(at::kBFloat16)).to(at::kFloat), Y));
    engine.step();
  };
  auto errors = run_thread_ranks(1, [&](Communicator& c) {
    for (bool states : {true, false}) {
      for (int stage : {1, 2, 3}) {
        const std::string what = "stage " + std::to_string(stage) + (states ? " bf16 states" : "");
        const std::string cfg = config_json(4, 4, sgd + bf16_master(states, stage));
        Net net = make_net(1), twin = make_net(1);
        auto engine = initialize(net.ptr(), cfg, borrowed(c));
        twin->to(at::kBFloat16);
        auto sgd_twin = optim::make_optimizer(Config::parse(cfg).optimizer, 0, at::kFloat);
        std::map<std::string, at::Tensor> buffers;  // bf16, as the store holds them
        for (int step = 1; step <= 3; ++step) {
          train_step(net, *engine);
          at::mse_loss(twin->forward(X.to(at::kBFloat16)).to(at::kFloat), Y).backward();
          at::NoGradGuard no_grad;
          for (auto& item : twin->named_parameters()) {
            at::Tensor p = item.value();
            if (!p.grad().defined()) continue;  // the unused branch: no gradient, no update
            at::Tensor& buffer = buffers[item.key()];
            if (!buffer.defined()) buffer = at::zeros_like(p);
            at::Tensor w = p.to(at::kFloat).reshape({-1}), b = buffer.to(at::kFloat).reshape({-1});
            optim::StepContext ctx;
            ctx.lr = 0.1;
            ctx.step = step;
            ctx.state = {b};
            sgd_twin->step(w, p.grad().to(at::kFloat).reshape({-1}), ctx);
            p.copy_(w.view(p.sizes()));
            buffer.copy_(b.view(p.sizes()));
            p.mutable_grad() = at::Tensor();
          }
        }
        auto mine = net->named_parameters(), want = twin->named_parameters();
        bool all_equal = true;
        for (const auto& item : want)
          all_equal = all_equal && at::equal(mine[item.key()], item.value());
        EXPECT_EQ(all_equal, states) << what;
        int64_t numel = 0;
        for (const auto& p : net->parameters()) numel += p.numel();
        const int64_t state_bytes = (states ? 2 : 4) * numel;
        EXPECT_EQ(engine->memory_stats().optimizer_state, state_bytes) << what;
        EXPECT_EQ(
            engine::estimate(engine::EstimateInput{numel}, Config::parse(cfg)).optimizer_state,
            state_bytes)
            << what;
        if (states && stage == 2) {
          testing::TempDir dir;
          engine->save_checkpoint(dir.path(), "bf16states");
          train_step(net, *engine);
          for (const std::string& other : {config_json(4, 4, sgd + bf16_master(false, 1)),
                                           config_json(4, 4, sgd + bf16_master(true, 3))}) {
            Net again = make_net(2);
            auto loaded = initialize(again.ptr(), other, borrowed(c));
            loaded->load_checkpoint(dir.path(), "bf16states");
            train_step(again, *loaded);
            auto got = again->named_parameters();
            for (const auto& item : net->named_parameters())
              EXPECT_TRUE(at::equal(got[item.key()], item.value())) << other;
          }
        }
      }
    }
    // Adam's two states, 2 bytes each, and the step still learns.
    const std::string adam = config_json(4, 4, kAdamW + bf16_master(true, 2));
    Net net = make_net(1);
    auto engine = initialize(net.ptr(), adam, borrowed(c));
    int64_t numel = 0;
    for (const auto& p : net->parameters()) numel += p.numel();
    EXPECT_EQ(engine->memory_stats().optimizer_state, 2 * 2 * numel);
    EXPECT_EQ(engine::estimate(engine::EstimateInput{numel}, Config::parse(adam)).optimizer_state,
              2 * 2 * numel);
    std::vector<double> losses;
    for (int step = 0; step < 8; ++step) {
      const at::Tensor loss = at::mse_loss(net->forward(X.to(at::kBFloat16)).to(at::kFloat), Y);
      losses.push_back(loss.item<double>());
      engine->backward(loss);
      engine->step();
    }
    EXPECT_LT(losses.back(), 0.9 * losses.front());
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
}

// Muon with bf16.bf16_optimizer_states: Muon holds both states in bf16 itself (the store holds
// the others'), half the bytes of its fp32 states at every stage, in the estimate too; the
// matrices' owners (NOTE [Muon across ranks]) work as with fp32 states on 2 ranks; and a
// checkpoint of bf16 states loads into a run with fp32 states, whose next step then gives the
// same weights (the step reads widened states either way). Exactness of the rounding itself:
// OptimMuon.Bf16StatesAreTheFp32StepRoundedOnce.
TEST(EngineMixedPrecision, MuonWithBf16OptimizerStates) {
  const std::string muon =
      R"(, "gradient_clipping": 0, "optimizer": {"type": "Muon", "params": {"lr": 0.005, "adam_lr": 0.003}})";
  const at::Tensor X = dataset_x().narrow(0, 0, 8), Y = dataset_y().narrow(0, 0, 8);
  auto train_step = [](Net& net, Engine& engine, const at::Tensor& x, const at::Tensor& y) {
    const at::Tensor loss = at::mse_loss(net->forward(x.to(at::kBFloat16)).to(at::kFloat), y);
    engine.backward(loss);
    engine.step();
    return loss.item<double>();
  };
  auto errors = run_thread_ranks(2, [&](Communicator& c) {
    const at::Tensor x = X.narrow(0, 4 * c.rank(), 4), y = Y.narrow(0, 4 * c.rank(), 4);
    for (int stage : {1, 2, 3}) {
      const std::string what = "stage " + std::to_string(stage);
      Net with = make_net(1), without = make_net(1);
      auto a =
          initialize(with.ptr(), config_json(8, 4, muon + bf16_master(true, stage)), borrowed(c));
      auto b = initialize(without.ptr(), config_json(8, 4, muon + bf16_master(false, stage)),
                          borrowed(c));
      EXPECT_EQ(2 * a->memory_stats().optimizer_state, b->memory_stats().optimizer_state) << what;
      std::vector<double> la, lb;
      for (int step = 0; step < 6; ++step) {
        la.push_back(train_step(with, *a, x, y));
        lb.push_back(train_step(without, *b, x, y));
      }
      // The batch's loss (both ranks' halves) falls.
      at::Tensor ends = at::tensor({la.front(), la.back()}, at::kDouble);
      c.all_reduce(ends)->wait();
      EXPECT_LT(ends[1].item<double>(), 0.98 * ends[0].item<double>()) << what << ": it learns";
      EXPECT_NEAR(la.back(), lb.back(), 0.02 * lb.back()) << what;
      bool all_equal = true;
      auto pa = with->named_parameters(), pb = without->named_parameters();
      for (const auto& item : pb) all_equal = all_equal && at::equal(pa[item.key()], item.value());
      EXPECT_FALSE(all_equal) << what << ": the states were not rounded";
    }
    int64_t numel = 0;
    for (const auto& p : make_net(1)->parameters()) numel += p.numel();
    engine::EstimateInput in{numel};
    in.world = 2;
    const auto states = [&](bool on) {
      return engine::estimate(in, Config::parse(config_json(8, 4, muon + bf16_master(on, 2))))
          .optimizer_state;
    };
    // Only exp_avg is held in bf16; the Newton-Schulz inputs, updates and gathered copies the
    // estimate counts with the states stay fp32: 2 bytes fewer per element of the part.
    EXPECT_EQ(states(false) - states(true), 2 * ((numel + 1) / 2));
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
  errors = run_thread_ranks(1, [&](Communicator& c) {
    const at::Tensor x = X.narrow(0, 0, 4), y = Y.narrow(0, 0, 4);
    Net net = make_net(1);
    auto engine =
        initialize(net.ptr(), config_json(4, 4, muon + bf16_master(true, 2)), borrowed(c));
    for (int step = 0; step < 3; ++step) train_step(net, *engine, x, y);
    testing::TempDir dir;
    engine->save_checkpoint(dir.path(), "muon");
    train_step(net, *engine, x, y);
    for (const std::string& other : {config_json(4, 4, muon + bf16_master(false, 1)),
                                     config_json(4, 4, muon + bf16_master(true, 3))}) {
      Net again = make_net(2);
      auto loaded = initialize(again.ptr(), other, borrowed(c));
      loaded->load_checkpoint(dir.path(), "muon");
      train_step(again, *loaded, x, y);
      auto got = again->named_parameters();
      for (const auto& item : net->named_parameters())
        EXPECT_TRUE(at::equal(got[item.key()], item.value())) << other << " " << item.key();
    }
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
}

// torch_autocast's test model: Linear layers around a module of its own class (Gain), whose
// product with a bf16 activation autocast leaves in fp32; the block may be checkpointed.
struct GainImpl : torch::nn::Module {
  GainImpl() { g = register_parameter("g", at::linspace(0.8, 1.2, 16)); }
  at::Tensor forward(const at::Tensor& x) { return x * g; }
  at::Tensor g;
};
TORCH_MODULE(Gain);
struct AutocastBlockImpl : torch::nn::Module {
  AutocastBlockImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    gain = register_module("gain", Gain());
  }
  at::Tensor forward(const at::Tensor& x) { return gain->forward(at::tanh(fc1->forward(x))); }
  torch::nn::Linear fc1{nullptr};
  Gain gain{nullptr};
};
TORCH_MODULE(AutocastBlock);
struct AutocastNetImpl : torch::nn::Module {
  explicit AutocastNetImpl(bool checkpointed) : checkpointed(checkpointed) {
    block = register_module("block", AutocastBlock());
    fc2 = register_module("fc2", torch::nn::Linear(16, 4));
  }
  at::Tensor forward(const at::Tensor& x) {
    auto run = [b = block.ptr()](const at::Tensor& y) { return b->forward(y); };
    at::Tensor h = checkpointed ? zero::checkpoint(*block, run, x) : zero::call(*block, run, x);
    return zero::call(
        *fc2, [this](const at::Tensor& y) { return fc2->forward(y); }, h);
  }
  bool checkpointed;
  AutocastBlock block{nullptr};
  torch::nn::Linear fc2{nullptr};
};
TORCH_MODULE(AutocastNet);

// The same weights on every thread (the ranks share libtorch's generator).
AutocastNet make_autocast_net(bool checkpointed) {
  static std::mutex mu;
  std::lock_guard<std::mutex> g(mu);
  at::manual_seed(3);
  return AutocastNet(checkpointed);
}

// torch_autocast (NOTE [autocast]): the parameters stay fp32, the forward inside
// engine->autocast() computes the Linear layers in bf16, and at stages 1-3 the Linear parameters'
// gradients are reduced in bf16 (the mean of the ranks' rounded once, as DeepSpeed's bucket copy
// does) while Gain's stay fp32; at stage 0 all of them in fp32 (DeepSpeed's engine all-reduce
// reads communication_data_type, not autocast). Three SGD steps on 1 and 2 ranks at every stage,
// with the block checkpointed or not, equal bit for bit a twin run by hand under libtorch's
// autocast with those roundings. With lower_precision_safe_modules naming Gain's class, Gain's
// gradient is the rounded one instead (even on one rank: a Linear's gradient under autocast is bf16
// already, the fp32 product with Gain is not), so the runs together fail an engine that rounds all
// gradients, or none.
TEST(EngineMixedPrecision, TorchAutocastComputesInBf16OnFp32Weights) {
  const std::string sgd =
      R"(, "gradient_clipping": 0, "optimizer": {"type": "SGD", "params": {"lr": 0.1}})";
  const at::Tensor X = dataset_x().narrow(0, 0, 4), Y = dataset_y().narrow(0, 0, 4);
  for (int world : {1, 2}) {
    auto errors = run_thread_ranks(world, [&](Communicator& c) {
      const int64_t b = 4 / world;
      for (const std::string modules : {"", R"(, "lower_precision_safe_modules": ["GainImpl"])"}) {
        for (int stage : {0, 1, 2, 3}) {
          for (bool checkpointed : {false, true}) {
            const std::string what = std::to_string(world) + " rank(s), stage " +
                                     std::to_string(stage) + (checkpointed ? " checkpointed" : "") +
                                     modules;
            const std::string cfg = config_json(4, b,
                                                sgd + R"(, "torch_autocast": {"enabled": true)" +
                                                    modules + "}" + zero_stage(stage));
            AutocastNet net = make_autocast_net(checkpointed), twin = make_autocast_net(false);
            auto bf16_wire = [&](const std::string& name) {
              // Stage 0 reduces in communication_data_type (unset: fp32), as DeepSpeed's engine.
              return stage > 0 && (name.find("gain") != std::string::npos) == !modules.empty();
            };
            auto engine = initialize(net.ptr(), cfg, borrowed(c));
            for (int step = 0; step < 3; ++step) {
              at::Tensor out;
              {
                auto autocast = engine->autocast();
                out = net->forward(X.narrow(0, c.rank() * b, b));
              }
              EXPECT_EQ(out.scalar_type(), at::kBFloat16) << what;
              engine->backward(at::mse_loss(out.to(at::kFloat), Y.narrow(0, c.rank() * b, b)));
              engine->step();
              // The twin: each rank's gradient under libtorch's autocast (rounded to bf16 where
              // the wire is bf16), their mean in fp32 (exact for two ranks), rounded again.
              std::map<std::string, at::Tensor> sum;
              for (int r = 0; r < world; ++r) {
                {
                  precision::AutocastScope autocast(
                      precision::autocast_on(c10::DeviceType::CPU, at::kBFloat16));
                  out = twin->forward(X.narrow(0, r * b, b));
                }
                at::mse_loss(out.to(at::kFloat), Y.narrow(0, r * b, b)).backward();
                for (const auto& item : twin->named_parameters()) {
                  at::Tensor& g = item.value().mutable_grad();
                  if (bf16_wire(item.key())) g = g.to(at::kBFloat16).to(at::kFloat);
                  sum[item.key()] = r == 0 ? g.clone() : sum[item.key()] + g;
                  g = at::Tensor();
                }
              }
              at::NoGradGuard no_grad;
              for (const auto& item : twin->named_parameters()) {
                at::Tensor g = sum[item.key()] / world;
                if (bf16_wire(item.key())) g = g.to(at::kBFloat16).to(at::kFloat);
                item.value().add_(g, -0.1);
              }
            }
            auto mine = net->named_parameters();
            for (const auto& item : twin->named_parameters()) {
              EXPECT_EQ(mine[item.key()].scalar_type(), at::kFloat) << what;
              EXPECT_TRUE(at::equal(mine[item.key()], item.value())) << what << ": " << item.key();
            }
          }
        }
      }
    });
    for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
  }
  auto errors = run_thread_ranks(1, [&](Communicator& c) {
    // A forward outside the scope trains fp32 gradients: refused at backward.
    AutocastNet net(false);
    auto engine =
        initialize(net.ptr(), config_json(4, 4, sgd + R"(, "torch_autocast": {"enabled": true})"),
                   borrowed(c));
    try {
      engine->backward(at::mse_loss(net->forward(X), Y));
      ADD_FAILURE() << "a forward outside engine->autocast() was accepted";
    } catch (const Error& e) {
      EXPECT_NE(
          std::string(e.what()).find("this micro-step's forward ran outside engine->autocast()"),
          std::string::npos)
          << e.what();
    }
    // A class the model does not have: named, with the classes it has.
    AutocastNet other(false);
    try {
      initialize(
          other.ptr(),
          config_json(
              4, 4,
              sgd +
                  R"(, "torch_autocast": {"enabled": true, "lower_precision_safe_modules": ["torch.nn.Conv2d", "Gian"]})"),
          borrowed(c));
      ADD_FAILURE() << "a lower_precision_safe_modules entry naming no module was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(
                    "\"torch.nn.Conv2d\" (read as the C++ class torch::nn::Conv2d), "
                    "\"Gian\" (read as the C++ class Gian) name no module of the "
                    "model; its module classes are: "),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("GainImpl"), std::string::npos) << e.what();
    }
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
}

// Without torch_autocast the scope switches a program's own autocast off inside (DeepSpeed's
// autocast_if_enabled): the model computes in fp32.
TEST(EngineMixedPrecision, WithoutTorchAutocastTheScopeTurnsAutocastOff) {
  auto errors = run_thread_ranks(1, [&](Communicator& c) {
    AutocastNet net(false);
    auto engine = initialize(net.ptr(), config_json(4, 4, kAdamW), borrowed(c));
    precision::AutocastScope outer(precision::autocast_on(c10::DeviceType::CPU, at::kBFloat16));
    EXPECT_EQ(net->forward(dataset_x().narrow(0, 0, 4)).scalar_type(), at::kBFloat16);
    {
      auto autocast = engine->autocast();
      EXPECT_EQ(net->forward(dataset_x().narrow(0, 0, 4)).scalar_type(), at::kFloat);
    }
    EXPECT_TRUE(at::autocast::is_autocast_enabled(c10::DeviceType::CPU));
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
}

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
  for (int stage : {0, 1, 2, 3}) {
    std::vector<Fp16Run> runs(2);
    std::string cfg = config_json(4, 2, kFp16Opt + fp16 + zero_stage(stage));
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
  std::map<int, at::Tensor> trained;
  for (int stage : {0, 2, 3}) {
    std::vector<Fp16Run> half(2);
    std::string cfg = config_json(4, 2, kFp16Opt + ", \"fp16\": {\"enabled\": true, \"initial_scale_power\": 10}" +
                                            zero_stage(stage));
    errors = run_thread_ranks(2, [&](Communicator& c) { half[c.rank()] = train_elem(c, cfg, none); });
    for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
    EXPECT_EQ(half[0].skipped_steps, 0);
    double err = (half[0].params - fp32[0].params).abs().max().item<double>();
    EXPECT_LT(err, 5e-3) << "stage " << stage;
    EXPECT_GT((half[0].params - fp32_init).abs().max().item<double>(), 1e-3) << "fp16 did not train";
    trained[stage] = half[0].params;
  }
  // Stage 3 (the whole model one unit, every parameter sharded) against stage 2.
  EXPECT_LT((trained[3] - trained[2]).abs().max().item<double>(), 5e-3);
}

}  // namespace
}  // namespace dscpp
