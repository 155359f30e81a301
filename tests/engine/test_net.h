// The engine tests' common ground: a small MLP (280 parameters, so counts do not divide by 3 or
// 4), its dataset, a config builder and a training loop on the data contract's no-shuffle
// order, run by ranks as threads. Included by the engine test sources only.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <mutex>
#include <string>
#include <vector>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include "dscpp/engine.h"
#include "support/errors.h"
#include "support/thread_ranks.h"

namespace dscpp::enginetest {
namespace {  // each test source its own copy

using comm::Communicator;

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

// A net registered against the order backward reaches it: its last layer is registered first,
// so that layer's gradients (the first to arrive) belong to the last bucket to launch.
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

// The same ReversedNet on every rank thread (the threads share the global generator).
ReversedNet make_reversed_net() {
  static std::mutex mu;
  std::lock_guard<std::mutex> g(mu);
  at::manual_seed(7);
  return ReversedNet();
}

// InitOptions with the test's communicator (owned by the rank thread, not the engine).
InitOptions borrowed(Communicator& c) {
  InitOptions opts;
  opts.comm = std::shared_ptr<Communicator>(&c, [](Communicator*) {});
  return opts;
}

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
  MemoryStats memory;
  int64_t skipped = 0;
};

// Trains `steps` optimizer steps on the data contract's no-shuffle order: step s uses samples
// (s*B + i) mod N; rank r, micro-step k gets i in [(k*world + r)*b, +b). `client` (may be null)
// installs a client optimizer; otherwise the config's optimizer is used.
// `adjust` (may be null) changes the other InitOptions (an injected AsyncIo, say).
using ClientOptimizer = std::function<std::shared_ptr<torch::optim::Optimizer>(Net&)>;
Trajectory train_with(Communicator& c, int steps, const std::string& cfg, const ClientOptimizer& client,
                      const std::function<void(InitOptions&)>& adjust = nullptr) {
  Net net = make_net(100 + c.rank());
  InitOptions opts = borrowed(c);
  if (client) opts.optimizer = client(net);
  if (adjust) adjust(opts);
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
      // Mixed precision: the model trains in its (cast) dtype, the loss is taken in fp32.
      at::Tensor out = net->forward(X.index_select(0, ix).to(net->fc1->weight.scalar_type()));
      engine->backward(at::mse_loss(out.to(at::kFloat), Y.index_select(0, ix)));
      engine->step();
    }
    t.losses.push_back(engine->last_step().loss);
    t.grad_norms.push_back(engine->last_step().grad_norm);
  }
  std::vector<at::Tensor> flat;
  for (auto& p : net->parameters()) flat.push_back(p.detach().reshape({-1}).clone());
  t.params = at::cat(flat).to(at::kFloat);
  t.memory = engine->memory_stats();
  t.skipped = engine->skipped_steps();
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

const std::string kAdamW = ", \"gradient_clipping\": 0.05, \"optimizer\": {\"type\": \"AdamW\", "
                           "\"params\": {\"lr\": 0.01, \"weight_decay\": 0.1}}";

// Runs train_cfg on `world` thread ranks; one trajectory per rank. `adjust`: see train_with.
std::vector<Trajectory> run_ranks(int world, int steps, const std::string& cfg,
                                  const std::function<void(InitOptions&)>& adjust = nullptr,
                                  const testing::OptionsFn& comm_options = nullptr) {
  std::vector<Trajectory> out(world);
  auto errors = testing::run_thread_ranks_with(
      comm_options ? comm_options : [](int) { return comm::CommOptions(); }, world,
      [&](Communicator& c) { out[c.rank()] = train_with(c, steps, cfg, nullptr, adjust); });
  for (auto& e : errors) EXPECT_FALSE(e) << cfg << ": " << testing::error_text(e);
  return out;
}

}  // namespace
}  // namespace dscpp::enginetest
