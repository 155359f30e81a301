// ZeRO stage 3 against stage 0, with ranks as threads over a shared store: the same losses,
// gradient norms and final weights at every world size and GAS, under every unit policy,
// persistence threshold, prefetch and reuse setting, with and without zero::checkpoint; the
// memory accounting; GatheredParameters; and the errors for misuse.
#include "zero/stage3.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

#include "dscpp/engine.h"
#include "dscpp/error.h"
#include "dscpp/log.h"
#include "dscpp/models/gpt.h"
#include "dscpp/safetensors.h"
#include "dscpp/zero.h"
#include "dscpp/zero_unit.h"
#include "engine/test_net.h"
#include "support/errors.h"
#include "support/stand_in_link.h"
#include "support/temp_dir.h"
#include "support/thread_ranks.h"
#include "zero/presharded.h"
#include "zero/unit_functions.h"
#include "zero/unit_policy.h"

namespace dscpp {
namespace {

using comm::Communicator;
using testing::error_text;
using testing::run_thread_ranks;

using namespace enginetest;  // NOLINT: the fixtures of this file's tests

// A model that marks its units: an input layer, three blocks and a head, each run through
// zero::call (or zero::checkpoint for the blocks), and a tied embedding-style matrix used twice.
// 8 -> 16 -> (16 -> 16) x 3 -> 4, plus `tied` [4, 16] used by the head and to embed a residual.
struct StackNetImpl : torch::nn::Module {
  StackNetImpl() {
    in = register_module("in", torch::nn::Linear(8, 16));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < 3; ++i) blocks->push_back(torch::nn::Linear(16, 16));
    head = register_module("head", torch::nn::Linear(16, 4));
    tied = register_module("tied", torch::nn::Embedding(4, 16));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = zero::call(
        *in, [this](const at::Tensor& v) { return at::tanh(in->forward(v)); }, x);
    // The tied matrix's first use: a learned offset added to every row.
    h = h +
        zero::call(
            *tied, [this](const at::Tensor& v) { return tied->weight.sum(0) * 0.1 + v * 0; }, h);
    for (const auto& m : *blocks) {
      auto lin = std::dynamic_pointer_cast<torch::nn::LinearImpl>(m);
      auto fn = [lin](const at::Tensor& v) { return at::tanh(lin->forward(v)) + v; };
      h = checkpoint ? zero::checkpoint(*lin, fn, h) : zero::call(*lin, fn, h);
    }
    at::Tensor y = zero::call(
        *head, [this](const at::Tensor& v) { return head->forward(v); }, h);
    // Its second use: the output projected back through it.
    return y + zero::call(
                   *tied,
                   [this](const at::Tensor& v) { return at::linear(v, tied->weight) * 0.05; }, h);
  }
  torch::nn::Linear in{nullptr}, head{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::Embedding tied{nullptr};
  bool checkpoint = false;
};
TORCH_MODULE(StackNet);

StackNet make_stack_net(int seed) {
  static std::mutex mu;  // the rank threads share the global generator
  std::lock_guard<std::mutex> g(mu);
  at::manual_seed(seed);
  return StackNet();
}

struct Run {
  std::vector<double> losses, grad_norms;
  at::Tensor params;  // whole, after training (gathered)
  MemoryStats memory;
};

// Trains StackNet for `steps` on the data contract's no-shuffle order (as train_with does).
// `adjust` (may be null) changes the InitOptions (an injected device link, say).
Run train_stack(Communicator& c, int steps, const std::string& cfg, const zero::UnitPolicy& units,
                bool checkpoint, const std::function<void()>& trained = nullptr,
                const std::function<void(InitOptions&)>& adjust = nullptr) {
  StackNet net = make_stack_net(100 + c.rank());
  net->checkpoint = checkpoint;
  InitOptions opts = borrowed(c);
  opts.zero_units = units;
  if (adjust) adjust(opts);
  auto engine = initialize(net.ptr(), cfg, opts);
  const int B = engine->train_batch_size(), b = engine->train_micro_batch_size_per_gpu();
  const int gas = engine->gradient_accumulation_steps(), world = c.world_size();
  auto X = dataset_x(), Y = dataset_y();
  Run run;
  for (int s = 0; s < steps; ++s) {
    for (int k = 0; k < gas; ++k) {
      std::vector<int64_t> idx;
      for (int i = 0; i < b; ++i)
        idx.push_back((s * B + (k * world + c.rank()) * b + i) % kSamples);
      auto ix = at::tensor(idx, at::kLong);
      at::Tensor out = net->forward(X.index_select(0, ix).to(net->in->weight.scalar_type()));
      engine->backward(at::mse_loss(out.to(at::kFloat), Y.index_select(0, ix)));
      engine->step();
    }
    run.losses.push_back(engine->last_step().loss);
    run.grad_norms.push_back(engine->last_step().grad_norm);
  }
  run.memory = engine->memory_stats();  // before the whole model is gathered below
  if (trained) trained();
  {
    zero::GatheredParameters whole(*net);
    std::vector<at::Tensor> flat;
    for (auto& p : net->parameters())
      flat.push_back(p.detach().reshape({-1}).to(at::kFloat).clone());
    run.params = at::cat(flat);
  }
  return run;
}

std::vector<Run> run_stack(int world, int steps, const std::string& cfg,
                           const zero::UnitPolicy& units = {}, bool checkpoint = false,
                           const std::function<void(InitOptions&)>& adjust = nullptr) {
  std::vector<Run> out(world);
  auto errors = run_thread_ranks(world, [&](Communicator& c) {
    out[c.rank()] = train_stack(c, steps, cfg, units, checkpoint, nullptr, adjust);
  });
  for (auto& e : errors) EXPECT_FALSE(e) << cfg << ": " << error_text(e);
  return out;
}

void expect_same_run(const Run& a, const Run& ref, double rtol, const std::string& what) {
  ASSERT_EQ(a.losses.size(), ref.losses.size()) << what;
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    EXPECT_NEAR(a.losses[i], ref.losses[i], rtol * std::abs(ref.losses[i]) + 1e-12)
        << what << " step " << i;
    EXPECT_NEAR(a.grad_norms[i], ref.grad_norms[i], rtol * ref.grad_norms[i] + 1e-12)
        << what << " step " << i;
  }
  ASSERT_TRUE(a.params.defined() && ref.params.defined()) << what;
  double err = (a.params - ref.params).abs().max().item<double>();
  double scale = ref.params.abs().max().item<double>();
  EXPECT_LE(err, rtol * scale) << what << ": final parameters differ by " << err;
}

const zero::UnitPolicy kBlocks{{"blocks.*"}};
const zero::UnitPolicy kLinears{{}, {"*LinearImpl"}};  // by type: the blocks, `in` and `head`
const zero::UnitPolicy kEverything{{"in", "blocks.*", "head", "tied"}};

std::string zero3(const std::string& extra = "") {
  return ", \"zero_optimization\": {\"stage\": 3" + extra + "}";
}

// Stage 3 reproduces stage 0 at worlds 1-4 and GAS 1/2/4 (StackNet's 952 parameters divide by
// none of 3), with every parameter in a unit and a threshold that shards them all.
TEST(EngineZero3, MatchesStage0AtEveryWorldSizeAndGas) {
  const int B = 24, steps = 4;
  for (Case cs : {Case{1, 1}, Case{2, 1}, Case{2, 2}, Case{3, 4}, Case{4, 2}}) {
    const int micro = B / (cs.world * cs.gas);
    std::string what = "world " + std::to_string(cs.world) + " gas " + std::to_string(cs.gas);
    auto s0 = run_stack(cs.world, steps, config_json(B, micro, kAdamW), kEverything);
    auto s3 = run_stack(
        cs.world, steps,
        config_json(B, micro, kAdamW + zero3(", \"stage3_param_persistence_threshold\": 0")),
        kEverything);
    for (int r = 0; r < cs.world; ++r)
      expect_same_run(s3[r], s0[0], 1e-6, what + " rank " + std::to_string(r));
  }
}

// Every unit setting gives the same trajectory: policies (blocks only, everything, none = the
// whole model), persistence thresholds that keep none / some (biases) / all parameters whole,
// prefetch on and off, release at once (reuse distance 0) or keep, bucket sizes, overlap_comm,
// and zero::checkpoint for the blocks. Against stage 0 at GAS 1, and against stage 2 at GAS 2:
// stages 2-3 reduce every micro-step's gradient and sum the results, stage 0 sums first and
// reduces once, and on this model that different rounding alone moves the weights by 5e-6
// relative over 4 steps (stage 2 differs from stage 0 exactly as much as stage 3 does).
TEST(EngineZero3, MatchesStage0UnderEveryUnitSetting) {
  const int world = 2, steps = 4;
  struct Setting {
    std::string zero;
    zero::UnitPolicy units;
    bool checkpoint;
  };
  const std::vector<Setting> settings = {
      {zero3(), kBlocks, false},
      {zero3(", \"stage3_param_persistence_threshold\": 0"), kLinears, false},
      {zero3(", \"stage3_param_persistence_threshold\": 0"), kEverything, false},
      {zero3(", \"stage3_param_persistence_threshold\": 20"), kEverything, false},  // biases whole
      {zero3(", \"stage3_param_persistence_threshold\": 100000000"), kEverything,
       false},  // all whole
      {zero3(", \"stage3_param_persistence_threshold\": 0"),
       {},
       false},  // the whole model one unit
      {zero3(", \"stage3_param_persistence_threshold\": 0, \"stage3_prefetch_bucket_size\": 0, "
             "\"stage3_max_reuse_distance\": 0"),
       kEverything, false},
      {zero3(", \"stage3_param_persistence_threshold\": 0, \"stage3_max_reuse_distance\": 0, "
             "\"stage3_max_live_parameters\": 300"),
       kEverything, false},
      {zero3(", \"stage3_param_persistence_threshold\": 0, \"reduce_bucket_size\": 100, "
             "\"overlap_comm\": false, \"contiguous_gradients\": false"),
       kEverything, false},
      {zero3(", \"stage3_param_persistence_threshold\": 0"), kEverything, true},
      // Units from the config (leaf_module), alone and added to the program's.
      {zero3(", \"stage3_param_persistence_threshold\": 0, \"leaf_module\": {\"classes\": "
             "\"LinearImpl\"}"),
       {},
       false},
      {zero3(", \"stage3_param_persistence_threshold\": 0, \"leaf_module\": {\"names\": "
             "[\"in\", \"head\"], \"name_suffixes\": \"tied\"}"),
       kBlocks, false},
      {zero3(", \"stage3_param_persistence_threshold\": 0, \"stage3_max_reuse_distance\": 0"),
       kBlocks, true},
  };
  auto s0 = run_stack(world, steps, config_json(4, 2, kAdamW), kEverything);
  auto s2 =
      run_stack(world, steps, config_json(8, 2, kAdamW + ", \"zero_optimization\": {\"stage\": 2}"),
                kEverything);
  for (const auto& s : settings) {
    std::string what = s.zero + (s.checkpoint ? " with zero::checkpoint" : "") + " units " +
                       std::to_string(s.units.paths.size());
    auto gas1 = run_stack(world, steps, config_json(4, 2, kAdamW + s.zero), s.units, s.checkpoint);
    auto gas2 = run_stack(world, steps, config_json(8, 2, kAdamW + s.zero), s.units, s.checkpoint);
    for (int r = 0; r < world; ++r) {
      expect_same_run(gas1[r], s0[0], 1e-6, what + " GAS 1 rank " + std::to_string(r));
      expect_same_run(gas2[r], s2[0], 1e-6, what + " GAS 2 rank " + std::to_string(r));
    }
  }
}

// Muon at stages 1, 2 and 3 (and at stage 3 with offload to cpu of this model in host memory)
// reproduces stage 0 at worlds 1-3 and GAS 1-2: every weight matrix
// (in, the blocks, head, and tied, an Embedding whose name lacks "embed") is orthogonalised
// whole by one rank although StackNet's 952 elements cut matrices between ranks, and the biases
// take the Adam half at its own learning rate and schedule. rtol 1e-5: the different order of
// the gradients' sums between stages reaches the weights through Newton-Schulz, which magnifies
// it.
TEST(EngineZero3, MuonMatchesStage0AtEveryStage) {
  const int B = 12, steps = 4;
  const std::string muon =
      ", \"gradient_clipping\": 0.05, \"optimizer\": {\"type\": \"Muon\", \"params\": "
      "{\"lr\": 0.01, \"adam_lr\": 0.003, \"weight_decay\": 0.1}}, \"scheduler\": {\"type\": "
      "\"WarmupLR\", \"params\": {\"warmup_num_steps\": 3, \"warmup_type\": \"linear\"}}";
  for (Case cs : {Case{1, 1}, Case{2, 1}, Case{2, 2}, Case{3, 2}}) {
    const int micro = B / (cs.world * cs.gas);
    const std::string what = "world " + std::to_string(cs.world) + " gas " + std::to_string(cs.gas);
    auto s0 = run_stack(cs.world, steps, config_json(B, micro, muon), kEverything);
    auto adamw = run_stack(cs.world, steps, config_json(B, micro, kAdamW), kEverything);
    EXPECT_GT((s0[0].params - adamw[0].params).abs().max().item<double>(), 1e-3)
        << what << ": Muon trained like AdamW";
    for (const std::string zero :
         {std::string(", \"zero_optimization\": {\"stage\": 1}"),
          std::string(", \"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 50}"),
          zero3(", \"stage3_param_persistence_threshold\": 0"),
          // Offload to cpu of a model in host memory: nothing moves, the same run.
          zero3(", \"stage3_param_persistence_threshold\": 0, \"offload_optimizer\": "
                "{\"device\": \"cpu\"}, \"offload_param\": {\"device\": \"cpu\"}")}) {
      auto sk = run_stack(cs.world, steps, config_json(B, micro, muon + zero), kEverything);
      for (int r = 0; r < cs.world; ++r)
        expect_same_run(sk[r], s0[0], 1e-5, what + zero + " rank " + std::to_string(r));
    }
  }
}

// gradient_allreduce_op "sum" (DeepSpeed 0.19.8) adds the ranks' gradients: with plain SGD at
// learning rate lr it trains as "mean" at 2 lr on 2 ranks, at every stage (DeepSpeed refuses sum
// at stage 3; dscpp sums there too), and prescale_gradients is then not applied (DeepSpeed's
// rule). The logged gradient norm is the summed gradients'.
TEST(EngineZero3, GradientAllreduceOpSumAddsTheRanksGradients) {
  const int world = 2, steps = 3;
  auto sgd = [](double lr) {
    return ", \"gradient_clipping\": 0, \"optimizer\": {\"type\": \"SGD\", \"params\": "
           "{\"lr\": " +
           std::to_string(lr) + "}}";
  };
  for (const std::string zero :
       {std::string(""), std::string(", \"zero_optimization\": {\"stage\": 1}"),
        std::string(", \"zero_optimization\": {\"stage\": 2}"),
        zero3(", \"stage3_param_persistence_threshold\": 0")}) {
    auto mean = run_stack(world, steps, config_json(8, 4, sgd(0.1) + zero), kEverything);
    auto sum = run_stack(world, steps,
                         config_json(8, 4,
                                     sgd(0.05) + zero +
                                         ", \"gradient_allreduce_op\": \"SUM\", "
                                         "\"prescale_gradients\": true"),
                         kEverything);
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(sum[r].losses.size(), mean[0].losses.size());
      for (size_t i = 0; i < mean[0].losses.size(); ++i) {
        EXPECT_NEAR(sum[r].losses[i], mean[0].losses[i], 1e-6 * mean[0].losses[i]) << zero;
        EXPECT_NEAR(sum[r].grad_norms[i], 2 * mean[0].grad_norms[i], 1e-6 * mean[0].grad_norms[i])
            << zero;
      }
      const double err = (sum[r].params - mean[0].params).abs().max().item<double>();
      EXPECT_LE(err, 1e-6 * mean[0].params.abs().max().item<double>()) << zero << " rank " << r;
    }
  }
}

// zero::checkpoint below stage 3 recomputes too, and stays exact at stages 0 and 2 (GAS 1).
TEST(EngineZero3, CheckpointBelowStage3IsExact) {
  const int world = 2, B = 4, micro = 2, steps = 3;
  auto ref = run_stack(world, steps, config_json(B, micro, kAdamW), kEverything);
  for (const std::string zero :
       {std::string(""), std::string(", \"zero_optimization\": {\"stage\": 2, "
                                     "\"reduce_bucket_size\": 50}")}) {
    auto ck = run_stack(world, steps, config_json(B, micro, kAdamW + zero), kEverything,
                        /*checkpoint=*/true);
    for (int r = 0; r < world; ++r) expect_same_run(ck[r], ref[0], 1e-6, "checkpoint" + zero);
  }
}

// activation_checkpointing.cpu_checkpointing: zero::checkpoint keeps a CUDA unit's input in
// (pinned) host memory until backward, and the gradients are those of keeping it on the GPU.
// Runs where a GPU is (scripts/device_check.sh); a model in host memory is said to change
// nothing (CheckSupported.CpuCheckpointingWithAModelInHostMemoryIsAWarning).
TEST(ZeroCheckpoint, CpuCheckpointingKeepsADeviceUnitsInputsInHostMemory) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  torch::nn::Linear lin(16, 16);
  lin->to(at::kCUDA);
  const at::Tensor x0 = at::randn({4, 16}, at::kCUDA);
  auto run = [&](bool to_host) {
    zero::set_cpu_checkpointing(to_host);
    lin->zero_grad();
    at::Tensor x = x0.clone().requires_grad_(true);
    at::Tensor y =
        zero::checkpoint(*lin, [lin](const at::Tensor& in) mutable { return lin->forward(in).relu(); }, x);
    auto* node = dynamic_cast<torch::autograd::CppNode<zero::CheckpointFn>*>(y.grad_fn().get());
    EXPECT_NE(node, nullptr);
    if (node) {
      const auto kept = node->ctx_.get_saved_variables();
      EXPECT_EQ(kept.at(0).is_cpu(), to_host);
      if (to_host) EXPECT_TRUE(kept.at(0).is_pinned());
    }
    y.pow(2).sum().backward();
    zero::set_cpu_checkpointing(false);
    return std::make_pair(x.grad().cpu(), lin->weight.grad().cpu());
  };
  const auto on_gpu = run(false), on_host = run(true);
  EXPECT_TRUE(at::equal(on_host.first, on_gpu.first));
  EXPECT_TRUE(at::equal(on_host.second, on_gpu.second));
}

// bf16 at stage 3 matches bf16 at stage 2 as the mixed-precision tests hold stages to each other.
TEST(EngineZero3, Bf16MatchesStage2) {
  const std::string bf16 = ", \"bf16\": {\"enabled\": true}";
  auto s2 =
      run_stack(1, 4, config_json(8, 8, kAdamW + bf16 + ", \"zero_optimization\": {\"stage\": 2}"),
                kEverything);
  auto s3 = run_stack(
      1, 4, config_json(8, 8, kAdamW + bf16 + zero3(", \"stage3_param_persistence_threshold\": 0")),
      kEverything);
  expect_same_run(s3[0], s2[0], 1e-6, "bf16 world 1");
  auto two2 =
      run_stack(2, 4, config_json(8, 4, kAdamW + bf16 + ", \"zero_optimization\": {\"stage\": 2}"),
                kEverything);
  auto two3 = run_stack(
      2, 4, config_json(8, 4, kAdamW + bf16 + zero3(", \"stage3_param_persistence_threshold\": 0")),
      kEverything);
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(at::equal(two3[r].params, two3[0].params)) << "replicas diverged";
    for (size_t i = 0; i < two2[0].losses.size(); ++i)
      EXPECT_NEAR(two3[r].losses[i], two2[0].losses[i], 0.02 * two2[0].losses[i]);
  }
}

// Counts the bytes every all_gather_into delivers, by dtype, and forwards everything.
class GatherCounter final : public Communicator {
 public:
  explicit GatherCounter(std::shared_ptr<Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string backend_name() const override { return inner_->backend_name(); }
  using Communicator::all_gather;
  using Communicator::reduce_scatter;
  comm::WorkHandle all_reduce(at::Tensor t, comm::ReduceOp op) override {
    return inner_->all_reduce(t, op);
  }
  comm::WorkHandle reduce_scatter(at::Tensor o, at::Tensor i, std::vector<int64_t> c,
                                  comm::ReduceOp op) override {
    return inner_->reduce_scatter(o, i, c, op);
  }
  comm::WorkHandle reduce_scatter_quantized(at::Tensor o, at::Tensor i, std::vector<int64_t> c,
                                            comm::ReduceOp op) override {
    return inner_->reduce_scatter_quantized(o, i, c, op);
  }
  comm::WorkHandle all_gather(at::Tensor o, at::Tensor i, std::vector<int64_t> c) override {
    return inner_->all_gather(o, i, c);
  }
  comm::WorkHandle all_gather_into(std::vector<at::Tensor> outputs, at::Tensor input) override {
    if (counting) {
      for (auto& o : outputs) bytes[input.scalar_type()] += static_cast<int64_t>(o.nbytes());
    }
    return inner_->all_gather_into(outputs, input);
  }
  int host_group_size() const override { return inner_->host_group_size(); }
  comm::WorkHandle host_all_gather_into(std::vector<at::Tensor> outputs,
                                        at::Tensor input) override {
    if (counting) {
      for (auto& o : outputs) host_bytes[input.scalar_type()] += static_cast<int64_t>(o.nbytes());
    }
    return inner_->host_all_gather_into(outputs, input);
  }
  comm::WorkHandle broadcast(at::Tensor t, int root) override { return inner_->broadcast(t, root); }
  comm::WorkHandle barrier() override { return inner_->barrier(); }
  comm::WorkHandle send(at::Tensor t, int dst) override { return inner_->send(t, dst); }
  comm::WorkHandle recv(at::Tensor t, int src) override { return inner_->recv(t, src); }
  void set_step(int64_t step) override { inner_->set_step(step); }
  int64_t sequence_number() const override { return inner_->sequence_number(); }
  void log_summary() override { inner_->log_summary(); }
  std::map<at::ScalarType, int64_t> bytes;       // all_gather_into, by dtype
  std::map<at::ScalarType, int64_t> host_bytes;  // host_all_gather_into (hpZ), by dtype
  bool counting = true;

 private:
  std::shared_ptr<Communicator> inner_;
};

// ZeRO++ qwZ (zero_quantized_weights): forward's and backward's gathers carry block-wise int8
// codes and scales. Every rank computes with the same dequantized weights, so all ranks end
// equal; the trajectory stays within the quantization error of plain stage 3 (fp32 and bf16);
// training's parameter gathers deliver a quarter of fp32's bytes and half of bf16's (plus one
// scale per 2048 elements); GatheredParameters (Run::params) sees the shards' own values.
TEST(EngineZero3, QuantizedWeightsGatherInt8AndStayCloseToPlainStage3) {
  const int world = 2, steps = 6;
  for (std::string precision : {"", ", \"bf16\": {\"enabled\": true}"}) {
    auto run = [&](bool quantized, std::vector<std::map<at::ScalarType, int64_t>>* gathered) {
      const std::string cfg = config_json(
          4, 2,
          kAdamW + precision +
              zero3(", \"stage3_param_persistence_threshold\": 0, \"stage3_max_reuse_distance\": "
                    "0, \"zero_quantized_weights\": " +
                    std::string(quantized ? "true" : "false")));
      std::vector<::dscpp::Run> out(world);
      std::vector<std::shared_ptr<GatherCounter>> counters(world);  // outlive the rank threads
      auto errors = run_thread_ranks(
          world,
          [&](Communicator& c) {
            out[c.rank()] = train_stack(c, steps, cfg, kEverything, false,
                                        [&] { counters[c.rank()]->counting = false; });
          },
          {}, [&](std::shared_ptr<Communicator> inner) {
            auto counter = std::make_shared<GatherCounter>(inner);
            counters[inner->rank()] = counter;
            return counter;
          });
      for (auto& e : errors) EXPECT_FALSE(e) << cfg << ": " << error_text(e);
      for (int r = 0; r < world; ++r) gathered->push_back(counters[r]->bytes);
      return out;
    };
    std::vector<std::map<at::ScalarType, int64_t>> plain_bytes, quant_bytes;
    auto plain = run(false, &plain_bytes);
    auto quant = run(true, &quant_bytes);
    const auto dtype = precision.empty() ? at::kFloat : at::kBFloat16;
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(at::equal(quant[r].params, quant[0].params)) << precision << " rank " << r;
      expect_same_run(quant[r], plain[0], precision.empty() ? 2e-2 : 5e-2,
                      "qwZ" + precision + " rank " + std::to_string(r));
      // Training gathered the same elements in both runs: the training dtype's bytes in the
      // plain one; one int8 code per element and one float scale per block of 2048 (a partial
      // block per rank and gather at most) in the quantized one, and nothing else.
      const int64_t item = static_cast<int64_t>(c10::elementSize(dtype));
      const int64_t codes = quant_bytes[r][at::kChar];
      const int64_t scales = quant_bytes[r][at::kFloat];
      EXPECT_GT(codes, 0) << precision;
      EXPECT_EQ(codes * item, plain_bytes[r][dtype]) << precision;
      if (dtype != at::kFloat) EXPECT_EQ(quant_bytes[r][dtype], 0) << precision;
      EXPECT_GE(scales, codes / 2048 * 4) << precision;
      EXPECT_LE(scales, codes / 2048 * 4 + 4096) << precision;
    }
    // The quantization moved the weights: this is not plain stage 3 under another name.
    EXPECT_FALSE(at::equal(quant[0].params, plain[0].params)) << precision;
  }
}

// ZeRO++ qgZ (zero_quantized_gradients) across 2 simulated hosts of 2 ranks: the units'
// gradients cross hosts as int4, so training stays near plain stage 3 without equalling it, every
// rank ends with the same parameters, and with qwZ as well too; on one host nothing crosses a
// network and qgZ is plain stage 3 bit for bit.
TEST(EngineZero3, QuantizedGradientsAcrossHostsStayCloseAndOnOneHostAreExact) {
  const int world = 4, steps = 6;
  auto run = [&](const std::string& extra, bool two_hosts) {
    const std::string cfg = config_json(
        8, 2,
        kAdamW + zero3(", \"stage3_param_persistence_threshold\": 20, \"reduce_bucket_size\": 200" +
                       extra));
    std::vector<::dscpp::Run> out(world);
    auto errors = testing::run_thread_ranks_with(
        two_hosts ? testing::on_hosts(2) : [](int) { return comm::CommOptions(); }, world,
        [&](Communicator& c) { out[c.rank()] = train_stack(c, steps, cfg, kEverything, false); });
    for (auto& e : errors) EXPECT_FALSE(e) << cfg << ": " << error_text(e);
    return out;
  };
  const std::string qg = ", \"zero_quantized_gradients\": true";
  auto plain = run("", true);
  for (const std::string& extra : {qg, qg + ", \"zero_quantized_weights\": true"}) {
    auto got = run(extra, true);
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(at::equal(got[r].params, got[0].params)) << extra << " rank " << r;
      // int4 noise adds to the gradient norm (6% at step 1 on this small model).
      expect_same_run(got[r], plain[0], 0.1, extra + " rank " + std::to_string(r));
    }
    EXPECT_FALSE(at::equal(got[0].params, plain[0].params)) << extra;
  }
  auto one_plain = run("", false);
  auto one_qg = run(qg, false);
  for (int r = 0; r < world; ++r) EXPECT_TRUE(at::equal(one_qg[r].params, one_plain[r].params));
}

// ZeRO++ hpZ (zero_hpz_partition_size = 2 on 2 simulated hosts of 2 ranks, NOTE [secondary
// partition]): backward gathers every unit from its host's secondary shards, so every parameter
// gather of backward stays inside a host; the training is plain stage 3's bit for bit (with
// activation checkpointing, whose recompute gathers in backward, and GAS 2), and qwZ's with qwZ.
// Sizes hpZ cannot use are refused naming the host's ranks; on one host it warns and does
// nothing.
TEST(EngineZero3, SecondaryPartitionKeepsBackwardGathersInsideHostsBitForBit) {
  const int world = 4, steps = 3;
  struct Counted {
    std::vector<::dscpp::Run> runs;
    std::vector<std::map<at::ScalarType, int64_t>> across, in_host;
  };
  auto run = [&](const std::string& extra, bool checkpoint, const std::string& precision) {
    const std::string cfg = config_json(
        8, 1,
        kAdamW + precision + zero3(", \"stage3_param_persistence_threshold\": 0, \"stage3_max_reuse_distance\": "
                       "0, \"reduce_bucket_size\": 200" +
                       extra));
    Counted out;
    out.runs.resize(world);
    std::vector<std::shared_ptr<GatherCounter>> counters(world);
    auto errors = testing::run_thread_ranks_with(
        testing::on_hosts(2), world,
        [&](Communicator& c) {
          out.runs[c.rank()] = train_stack(c, steps, cfg, kEverything, checkpoint,
                                           [&] { counters[c.rank()]->counting = false; });
        },
        [&](std::shared_ptr<Communicator> inner) {
          auto counter = std::make_shared<GatherCounter>(inner);
          counters[inner->rank()] = counter;
          return counter;
        });
    for (auto& e : errors) EXPECT_FALSE(e) << cfg << ": " << error_text(e);
    for (int r = 0; r < world; ++r) {
      out.across.push_back(counters[r]->bytes);
      out.in_host.push_back(counters[r]->host_bytes);
    }
    return out;
  };
  const std::string hpz = ", \"zero_hpz_partition_size\": 2";
  const std::string qw = ", \"zero_quantized_weights\": true";
  testing::TempDir swap;  // bf16 with every shard on disk: backward reads none of them
  const std::string on_disk = ", \"offload_param\": {\"device\": \"nvme\", \"max_in_cpu\": 0, "
                              "\"nvme_path\": \"" + swap.path() + "\"}";
  const std::string bf16 = ", \"bf16\": {\"enabled\": true}";
  for (const auto& [extra, checkpoint] : std::vector<std::pair<std::string, bool>>{
           {"", false}, {qw, false}, {"", true}, {qw, true}, {on_disk, false}}) {
    {
      const std::string what = extra + (checkpoint ? " checkpointed" : "");
      const std::string precision = extra == on_disk ? bf16 : "";
      Counted plain = run(extra, checkpoint, precision);
      Counted secondary = run(extra + hpz, checkpoint, precision);
      // Gathered one unit at a time: the same bytes, so no gather ahead (the end of forward
      // gathers backward's first units) crossed hosts that backward's own would not.
      Counted one_by_one =
          run(extra + hpz + ", \"stage3_prefetch_bucket_size\": 0", checkpoint, precision);
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(one_by_one.across[r], secondary.across[r]) << what << " rank " << r;
        EXPECT_EQ(one_by_one.in_host[r], secondary.in_host[r]) << what << " rank " << r;
        EXPECT_EQ(secondary.runs[r].losses, plain.runs[r].losses) << what << " rank " << r;
        EXPECT_EQ(secondary.runs[r].grad_norms, plain.runs[r].grad_norms) << what;
        EXPECT_TRUE(at::equal(secondary.runs[r].params, plain.runs[r].params)) << what;
        // Backward's gathers moved inside the hosts: what crosses hosts is forward's alone, and
        // the two together are plain stage 3's gathers (each unit's full size either way).
        const bool quantized = extra == qw;
        const auto train = precision.empty() ? at::kFloat : at::kBFloat16;
        const auto dtype = quantized ? at::kChar : train;
        EXPECT_TRUE(plain.in_host[r].empty()) << what;
        EXPECT_GT(secondary.in_host[r][train], 0) << what;
        EXPECT_LT(secondary.across[r][dtype], plain.across[r][dtype]) << what;
        const int64_t item = quantized ? 4 : 1;  // int8 codes stand for fp32 elements
        EXPECT_EQ(secondary.across[r][dtype] * item + secondary.in_host[r][train],
                  plain.across[r][dtype] * item)
            << what;
      }
    }
  }
  // Sizes hpZ cannot use: not the ranks per host, or hosts that share no memory.
  auto refused = [&](const testing::OptionsFn& options_of, int64_t size, const std::string& want) {
    const std::string cfg =
        config_json(8, 2, kAdamW + zero3(", \"zero_hpz_partition_size\": " + std::to_string(size)));
    auto errors = testing::run_thread_ranks_with(options_of, world, [&](Communicator& c) {
      train_stack(c, 1, cfg, kEverything, false);
    });
    for (auto& e : errors) EXPECT_NE(error_text(e).find(want), std::string::npos) << error_text(e);
  };
  refused(testing::on_hosts(2), 4,
          "zero_optimization.zero_hpz_partition_size 4: the secondary partition is the ranks of "
          "one host, 2 here (2 hosts)");
  comm::CommOptions flat;
  flat.hierarchy = "off";
  refused(testing::on_hosts(2, flat), 2, "go over the network between every pair of ranks");
  refused([](int) { return comm::CommOptions(); }, 2,
          "all 4 ranks are on one host, so a secondary partition would be the primary one");
  // The whole world on one host: nothing to do, and training goes on.
  const std::string one_host = config_json(8, 2, kAdamW + zero3(", \"zero_hpz_partition_size\": 4"));
  auto errors = testing::run_thread_ranks(world, [&](Communicator& c) {
    train_stack(c, 1, one_host, kEverything, false);
  });
  for (auto& e : errors) EXPECT_FALSE(e) << error_text(e);
}

// The engine's accounting: 16/N bytes per sharded parameter (fp32 AdamW) plus the resident ones
// whole, and the live units' peak in `gathered`.
TEST(EngineZero3, MemoryAccountingIsTheZeroFormula) {
  const int world = 2;
  auto runs = run_stack(world, 1,
                        config_json(4, 2,
                                    kAdamW + zero3(", \"stage3_param_persistence_threshold\": 0, "
                                                   "\"stage3_max_reuse_distance\": 0")),
                        kEverything);
  // Units: in (8*16+16 = 144), blocks 3 x 272, head (16*4+4 = 68), tied 64: every group padded
  // to an even length, so each rank's part is half of each.
  const int64_t part = 144 / 2 + 3 * 272 / 2 + 68 / 2 + 64 / 2;
  for (const auto& r : runs) {
    EXPECT_EQ(r.memory.params, 4 * part);
    EXPECT_EQ(r.memory.grads, 4 * part);
    EXPECT_EQ(r.memory.optimizer_state, 8 * part);
    EXPECT_EQ(r.memory.master, 0);
    EXPECT_GT(r.memory.gathered, 0);
    EXPECT_LE(r.memory.gathered, 4 * (272 + 64)) << "more than a block and the tied matrix live";
  }
}

// GatheredParameters with a modifier rank: rank 0's change is what every rank trains on.
TEST(EngineZero3, GatheredParametersWritesTheModifiersChangeBack) {
  testing::TempDir swap;
  // The last: bf16 with every shard on disk (offload_param), where the change is written.
  const std::string on_disk =
      ", \"offload_param\": {\"device\": \"nvme\", \"max_in_cpu\": 0, "
      "\"nvme_path\": \"" +
      swap.path() + "\"}";
  for (const auto& setting : std::vector<std::pair<std::string, std::string>>{
           {"", ""},
           {", \"bf16\": {\"enabled\": true}", ""},
           {", \"bf16\": {\"enabled\": true}", on_disk}}) {
    const std::string& prec = setting.first;
    const std::string& param = setting.second;
    std::vector<at::Tensor> after(2);
    auto errors = run_thread_ranks(2, [&](Communicator& c) {
      StackNet net = make_stack_net(3);
      InitOptions opts = borrowed(c);
      opts.zero_units = kEverything;
      auto engine = initialize(
          net.ptr(),
          config_json(4, 2,
                      kAdamW + prec + zero3(", \"stage3_param_persistence_threshold\": 0" + param)),
          opts);
      {
        zero::GatheredParameters g(*net->head, /*modifier_rank=*/0);
        at::NoGradGuard no_grad;
        if (c.rank() == 0) net->head->weight.fill_(0.25);
      }
      {
        zero::GatheredParameters g(*net);
        after[c.rank()] = net->head->weight.detach().to(at::kFloat).clone();
      }
      // One step later the master weights (bf16: fp32 copies) carried the change too.
      auto X = dataset_x().narrow(0, 2 * c.rank(), 2), Y = dataset_y().narrow(0, 2 * c.rank(), 2);
      engine->backward(
          at::mse_loss(net->forward(X.to(net->in->weight.scalar_type())).to(at::kFloat), Y));
      engine->step();
      zero::GatheredParameters g(*net->head);
      EXPECT_LT((net->head->weight.detach().to(at::kFloat) - 0.25).abs().max().item<double>(),
                0.05);
    });
    for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
    EXPECT_TRUE(at::allclose(after[0], at::full_like(after[0], 0.25)));
    EXPECT_TRUE(at::equal(after[0], after[1]));
  }
}

// Misuse gets a clear error naming the unit: a module inside a unit called on its own, nested
// units, a GatheredParameters scope opened inside a unit or closed out of order, nested scopes
// with different modifier ranks.
struct MisuseNetImpl : torch::nn::Module {
  MisuseNetImpl() {
    outer = register_module(
        "outer", torch::nn::Sequential(torch::nn::Linear(4, 4), torch::nn::Linear(4, 4)));
    other = register_module("other", torch::nn::Linear(4, 4));
  }
  torch::nn::Sequential outer{nullptr};
  torch::nn::Linear other{nullptr};
};
TORCH_MODULE(MisuseNet);

// A backward that fails on one rank at stage 3: the other rank's backward goes on gathering
// the units' parameters, which the failing rank skips, so the collectives cannot stay in step
// (they fail at once or at the timeout, never hang). The failing rank still throws its own error
// (the cause), and its engine then refuses to go on, naming the collectives' failure; the other
// rank gets an error too, and both threads finish.
TEST(EngineZero3, BackwardThatThrowsOnOneRankKeepsItsCauseAndStopsTheEngine) {
  comm::CommOptions options;
  options.timeout = std::chrono::seconds(5);
  std::vector<std::string> step_errors(2);
  std::string backward_error;
  const auto start = std::chrono::steady_clock::now();
  auto errors = run_thread_ranks(
      2,
      [&](Communicator& c) {
        StackNet net = make_stack_net(100 + c.rank());
        InitOptions opts = borrowed(c);
        opts.zero_units = kEverything;
        auto engine = initialize(
            net.ptr(),
            config_json(4, 2, kAdamW + zero3(", \"stage3_param_persistence_threshold\": 0")), opts);
        auto X = dataset_x().narrow(0, 2 * c.rank(), 2), Y = dataset_y().narrow(0, 2 * c.rank(), 2);
        at::Tensor out = net->forward(X);
        if (c.rank() == 1) {
          out.register_hook([](at::Tensor) -> at::Tensor { throw std::runtime_error("boom"); });
          try {
            engine->backward(at::mse_loss(out, Y));
          } catch (const std::exception& e) {
            backward_error = e.what();
          }
        } else {
          try {
            engine->backward(at::mse_loss(out, Y));
            engine->step();
          } catch (const std::exception& e) {
            step_errors[0] = e.what();
          }
        }
        if (c.rank() == 1) step_errors[1] = testing::error_of<Error>([&] { engine->step(); });
      },
      options);
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
  // The cause, not the collectives' mismatch that followed it.
  EXPECT_NE(backward_error.find("boom"), std::string::npos) << backward_error;
  EXPECT_NE(step_errors[1].find("the engine stopped after an earlier failure"), std::string::npos)
      << step_errors[1];
  EXPECT_NE(step_errors[1].find("collectives fell out of step"), std::string::npos)
      << step_errors[1];
  EXPECT_FALSE(step_errors[0].empty()) << "rank 0 trained on as if nothing had happened";
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

// What stage 3 says at start-up about memory it will not save: with no units, a warning that
// names both halves of marking one and the model's own top-level modules; with units and a
// reuse distance that keeps them all gathered (DeepSpeed's default 1e9), a warning with the
// bytes it costs and the key that changes it; with units released after use, neither.
TEST(EngineZero3, StartUpWarnsWhenStage3WillNotSaveParameterMemory) {
  EXPECT_EQ(zero::top_level_modules(*make_stack_net(1)),
            "'in' (torch::nn::LinearImpl), 'blocks.*' (3 x torch::nn::LinearImpl), "
            "'head' (torch::nn::LinearImpl), 'tied' (torch::nn::EmbeddingImpl)");
  const LogLevel before = log_level();
  set_log_level(LogLevel::info);
  struct Case {
    zero::UnitPolicy units;
    std::string zero;
    std::vector<std::string> said, unsaid;
  };
  const std::vector<Case> cases = {
      {{}, "", {"[warning] ZeRO stage 3 without units", "zero_optimization.leaf_module",
                "dscpp::zero::call", "top-level modules: 'in' (torch::nn::LinearImpl), 'blocks.*'"},
       {"{{"}},
      {kBlocks, "", {"[warning] ZeRO stage 3: zero_optimization.stage3_max_reuse_distance 1000000000 "
                     "is at least the", "units are kept gathered", "MiB of whole parameters per rank",
                     "HINT: to release each unit after use"},
       {"without units"}},
      {kBlocks, ", \"stage3_max_reuse_distance\": 0", {}, {"without units", "kept gathered"}},
  };
  for (const Case& k : cases) {
    auto errors = run_thread_ranks(1, [&](Communicator& c) {
      StackNet net = make_stack_net(1);
      InitOptions opts = borrowed(c);
      opts.zero_units = k.units;
      ::testing::internal::CaptureStderr();
      initialize(net.ptr(),
                 config_json(2, 2, kAdamW + zero3(", \"stage3_param_persistence_threshold\": 0" +
                                                  k.zero)),
                 opts);
      const std::string err = ::testing::internal::GetCapturedStderr();
      for (const auto& s : k.said) EXPECT_NE(err.find(s), std::string::npos) << s << "\n" << err;
      for (const auto& s : k.unsaid) EXPECT_EQ(err.find(s), std::string::npos) << s << "\n" << err;
    });
    for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
  }
  set_log_level(before);
}

TEST(EngineZero3, MisuseIsAClearError) {
  auto errors = run_thread_ranks(2, [&](Communicator& c) {
    MisuseNet net;
    InitOptions opts = borrowed(c);
    // One unit named in the program, one in the config (DeepSpeed's leaf_module).
    opts.zero_units = zero::UnitPolicy{{"other"}};
    auto engine =
        initialize(net.ptr(),
                   config_json(4, 2,
                               kAdamW + zero3(", \"stage3_param_persistence_threshold\": 0, "
                                              "\"leaf_module\": {\"names\": \"outer\"}")),
                   opts);
    at::Tensor x = at::ones({2, 4});
    auto inner = net->outer->ptr(0);
    std::string msg = testing::error_of<Error>([&] {
      zero::call(
          *inner, [&](const at::Tensor& v) { return v; }, x);
    });
    EXPECT_NE(msg.find("inside stage-3 unit 'outer'"), std::string::npos) << msg;
    msg = testing::error_of<Error>([&] {
      zero::call(
          *net->outer,
          [&](const at::Tensor& v) {
            return zero::call(
                *net->other, [&](const at::Tensor& w) { return w; }, v);
          },
          x);
    });
    EXPECT_NE(msg.find("'other' was called while unit 'outer' runs"), std::string::npos) << msg;
    msg = testing::error_of<Error>([&] {
      zero::call(
          *net->outer,
          [&](const at::Tensor& v) {
            zero::GatheredParameters g(*net->other);
            return v;
          },
          x);
    });
    EXPECT_NE(msg.find("GatheredParameters opened while stage-3 unit 'outer' runs"),
              std::string::npos)
        << msg;
    msg = testing::error_of<Error>([&] { zero::GatheredParameters a(*net->outer, 2); });
    EXPECT_NE(msg.find("is not a rank of this job"), std::string::npos) << msg;
    msg = testing::error_of<Error>([&] {
      zero::GatheredParameters a(*net->outer, 0);
      zero::GatheredParameters b(*net->other, 1);
    });
    EXPECT_NE(msg.find("nested inside one with modifier_rank 0"), std::string::npos) << msg;
    {
      auto a = std::make_unique<zero::GatheredParameters>(*net->outer);
      auto b = std::make_unique<zero::GatheredParameters>(*net->other);
      a.reset();  // out of order: said at the next call
    }
    msg = testing::error_of<Error>([&] {
      zero::call(
          *net->other, [&](const at::Tensor& v) { return v; }, x);
    });
    EXPECT_NE(msg.find("closed out of order"), std::string::npos) << msg;
    // A parameter replaced or reshaped after sharding cannot be gathered.
    {
      at::NoGradGuard no_grad;
      net->other->bias.set_data(at::zeros({4}));
    }
    msg = testing::error_of<Error>([&] {
      zero::call(
          *net->other, [&](const at::Tensor& v) { return v; }, x);
    });
    EXPECT_NE(
        msg.find(
            "parameter 'other.bias' of stage-3 unit 'other' changed after the model was sharded"),
        std::string::npos)
        << msg;
    // A parameter shared by two units is refused when the engine is built.
    auto shared = std::make_shared<torch::nn::Module>();
    at::Tensor w = at::ones({4, 4});
    for (const char* name : {"a", "b"}) {
      auto holder = std::make_shared<torch::nn::Module>();
      holder->register_parameter("w", w);
      shared->register_module(name, holder);
    }
    InitOptions o2 = borrowed(c);
    o2.zero_units = zero::UnitPolicy{{"a", "b"}};
    msg = testing::error_of<ConfigError>([&] {
      initialize(shared,
                 config_json(4, 2, kAdamW + zero3(", \"stage3_param_persistence_threshold\": 0")),
                 o2);
    });
    EXPECT_NE(msg.find("also belongs to unit 'a'"), std::string::npos) << msg;
    // Units named but found nowhere: every one is listed, wherever it was named.
    o2.zero_units = zero::UnitPolicy{{"a", "c*"}, {"*Nothing"}};
    msg = testing::error_of<ConfigError>([&] {
      initialize(shared,
                 config_json(4, 2,
                             kAdamW + zero3(", \"leaf_module\": {\"names\": [\"b\", \"a.w\"], "
                                            "\"name_suffixes\": \"x\", \"classes\": \"Module\"}")),
                 o2);
    });
    EXPECT_NE(msg.find("matching no module of the model: InitOptions::zero_units path \"c*\"; "
                       "InitOptions::zero_units type \"*Nothing\"; "
                       "zero_optimization.leaf_module.names \"a.w\"; "
                       "zero_optimization.leaf_module.name_suffixes \"x\". Its module classes "
                       "are: "),
              std::string::npos)
        << msg;
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
}

// A stage-3 engine over `net` (micro-batch 2, 2 ranks) with every parameter in a unit and
// sharded; `extra` adds top-level config keys.
std::shared_ptr<Engine> sharded_stack_engine(Communicator& c, StackNet& net,
                                             const std::string& extra = "") {
  InitOptions opts = borrowed(c);
  opts.zero_units = kEverything;
  return initialize(
      net.ptr(),
      config_json(4, 2, kAdamW + extra + zero3(", \"stage3_param_persistence_threshold\": 0")),
      opts);
}

// A user's own block type made a unit in one line (DSCPP_ZERO_UNIT instead of TORCH_MODULE), with
// a non-tensor argument beside its tensor; `bypass` calls it past its holder (->forward).
struct MlpBlockImpl : torch::nn::Module {
  explicit MlpBlockImpl(int64_t width) {
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
    fc = register_module("fc", torch::nn::Linear(width, width));
  }
  at::Tensor forward(const at::Tensor& x, double scale) {
    return x + scale * at::gelu(fc->forward(norm->forward(x)));
  }
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear fc{nullptr};
};
DSCPP_ZERO_UNIT(MlpBlock);

struct MlpNetImpl : torch::nn::Module {
  MlpNetImpl() {
    in = register_module("in", torch::nn::Linear(8, 16));
    for (int i = 0; i < 3; ++i)
      blocks.push_back(register_module("block" + std::to_string(i), MlpBlock(16)));
    head = register_module("head", torch::nn::Linear(16, 4));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = in->forward(x);
    for (auto& b : blocks) h = bypass ? b->forward(h, 0.5) : b(h, 0.5);
    return head->forward(h);
  }
  torch::nn::Linear in{nullptr}, head{nullptr};
  std::vector<MlpBlock> blocks;
  bool bypass = false;
};
TORCH_MODULE(MlpNet);

MlpNet make_mlp_net() {
  static std::mutex mu;
  std::lock_guard<std::mutex> g(mu);
  at::manual_seed(5);
  return MlpNet();
}

// One unit per block with no policy at all: stage 3 trains as stage 0 does, holding one block's
// whole parameters at a time (units released after use, no prefetch).
TEST(EngineZero3, AUnitHolderMakesABlockTypeAUnitInOneLine) {
  const std::string s3 = zero3(
      ", \"stage3_param_persistence_threshold\": 0, \"stage3_max_reuse_distance\": 0, "
      "\"stage3_prefetch_bucket_size\": 0");
  std::vector<double> losses[2];
  MemoryStats memory;
  for (int stage3 : {0, 1}) {
    auto errors = run_thread_ranks(2, [&](Communicator& c) {
      MlpNet net = make_mlp_net();
      auto engine = initialize(net.ptr(), config_json(4, 2, kAdamW + (stage3 ? s3 : "")),
                               borrowed(c));
      for (int step = 0; step < 3; ++step) {
        auto X = dataset_x().narrow(0, 4 * step + 2 * c.rank(), 2);
        auto Y = dataset_y().narrow(0, 4 * step + 2 * c.rank(), 2);
        engine->backward(at::mse_loss(net->forward(X), Y));
        engine->step();
        if (c.rank() == 0) losses[stage3].push_back(engine->last_step().loss);
      }
      if (c.rank() == 0 && stage3) memory = engine->memory_stats();
    });
    for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
  }
  ASSERT_EQ(losses[1].size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(losses[1][i], losses[0][i], 1e-5 * losses[0][i]);
  // A block: LayerNorm 2 x 16 and Linear 16 x 16 + 16, fp32.
  const int64_t block_bytes = (2 * 16 + 16 * 16 + 16) * 4;
  EXPECT_GT(memory.gathered, 0);
  EXPECT_LE(memory.gathered, block_bytes) << "more than one block gathered at once";
}

// A unit run past zero::call (its holder bypassed; a policy with no zero::call in the model) is
// named at the first forward: that forward still computes the right values (no libtorch storage
// error, no NaN), the error is logged at once and thrown at backward, naming the unit and the fix.
TEST(EngineZero3, AUnitRunPastItsCallIsNamedAtTheFirstForward) {
  const std::string cfg =
      config_json(4, 2, kAdamW + zero3(", \"stage3_param_persistence_threshold\": 0"));
  auto errors = run_thread_ranks(2, [&](Communicator& c) {
    auto X = dataset_x().narrow(0, 2 * c.rank(), 2), Y = dataset_y().narrow(0, 2 * c.rank(), 2);
    {
      MlpNet net = make_mlp_net();
      net->bypass = true;
      at::Tensor want = net->forward(X).detach();
      auto engine = initialize(net.ptr(), cfg, borrowed(c));
      at::Tensor got;
      {
        at::NoGradGuard eval;
        got = net->forward(X);
      }
      EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-6)) << "the evaluation forward's values";
      const std::string msg = testing::error_of<Error>(
          [&] { engine->backward(at::mse_loss(net->forward(X), Y)); });
      EXPECT_NE(msg.find("stage-3 unit 'block0' (dscpp::(anonymous namespace)::MlpBlockImpl) "
                         "ran outside dscpp::zero::call"),
                std::string::npos)
          << msg;
      EXPECT_NE(msg.find("DSCPP_ZERO_UNIT(MlpBlock) instead of TORCH_MODULE(MlpBlock)"),
                std::string::npos)
          << msg;
    }
    {
      // A policy names libtorch's own modules, and the model calls them directly.
      Net net = make_net(1);
      at::Tensor want = net->forward(X).detach();
      InitOptions opts = borrowed(c);
      opts.zero_units = zero::UnitPolicy{{"fc1", "fc2"}};
      auto engine = initialize(net.ptr(), cfg, opts);
      at::Tensor out = net->forward(X);
      EXPECT_TRUE(at::allclose(out.detach(), want, 1e-5, 1e-6)) << "the first forward's values";
      const std::string msg =
          testing::error_of<Error>([&] { engine->backward(at::mse_loss(out, Y)); });
      EXPECT_NE(msg.find("stage-3 unit 'fc1' (torch::nn::LinearImpl) ran outside "
                         "dscpp::zero::call: aten::"),
                std::string::npos)
          << msg;
      EXPECT_NE(msg.find("HINT: run its forward through dscpp::zero::call"), std::string::npos)
          << msg;
    }
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
}

// An evaluation forward on rank 0 only (a collective at stage 3) fails on both ranks with the
// communicator's mismatch report, plus the unit each was gathering and the usual cause.
TEST(EngineZero3, AForwardOnSomeRanksOnlyIsNamedAsSuch) {
  comm::CommOptions sync;
  sync.debug_sync = true;  // the communicator compares every collective (the engine's debug off)
  auto errors = run_thread_ranks(
      2,
      [&](Communicator& c) {
        StackNet net = make_stack_net(1);
        auto engine = sharded_stack_engine(c, net);
        auto X = dataset_x().narrow(0, 2 * c.rank(), 2), Y = dataset_y().narrow(0, 2 * c.rank(), 2);
        std::string msg;
        if (c.rank() == 0) {
          msg = testing::error_of<CommError>([&] {
            at::NoGradGuard eval;
            net->forward(X);
          });
          EXPECT_NE(msg.find("for an evaluation forward (no_grad)"), std::string::npos) << msg;
        } else {
          msg = testing::error_of<CommError>(
              [&] { engine->backward(at::mse_loss(net->forward(X), Y)); });
        }
        EXPECT_NE(msg.find("collective mismatch"), std::string::npos) << msg;
        EXPECT_NE(msg.find("this rank was gathering unit 'in'"), std::string::npos) << msg;
        EXPECT_NE(msg.find("if a forward ran on some ranks only"), std::string::npos) << msg;
      },
      sync);
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
}

// Debug mode (comms_logger.debug, or DSCPP_DEBUG_SYNC=1): a released unit holds NaN instead of
// freed memory, and a parameter used outside its unit's call is an error naming it before
// backward runs.
TEST(EngineZero3, DebugModeNamesAParameterUsedOutsideItsUnit) {
  auto errors = run_thread_ranks(2, [&](Communicator& c) {
    StackNet net = make_stack_net(1);
    auto engine = sharded_stack_engine(c, net, ", \"comms_logger\": {\"debug\": true}");
    auto X = dataset_x().narrow(0, 2 * c.rank(), 2), Y = dataset_y().narrow(0, 2 * c.rank(), 2);
    at::Tensor released = net->head->weight;
    EXPECT_TRUE(at::isnan(released).all().item<bool>()) << "a released unit should hold NaN";
    at::Tensor out = net->forward(X);
    at::Tensor loss = at::mse_loss(out, Y) + released.sum() * 0;  // used outside zero::call
    std::string msg = testing::error_of<Error>([&] { engine->backward(loss); });
    EXPECT_NE(msg.find("parameter 'head.weight' of stage-3 unit 'head' is used outside"),
              std::string::npos)
        << msg;
    // An outside use whose result flows into the unit's own call is found too.
    at::Tensor sneaky = at::ones({2, 16}) + net->head->weight.sum() * 0;
    at::Tensor y = zero::call(
        *net->head, [&](const at::Tensor& v) { return net->head->forward(v); }, sneaky);
    msg = testing::error_of<Error>([&] { engine->backward(at::mse_loss(y, Y)); });
    EXPECT_NE(msg.find("parameter 'head.weight' of stage-3 unit 'head' is used outside"),
              std::string::npos)
        << msg;
    // Used inside, all is well.
    engine->backward(at::mse_loss(net->forward(X), Y));
    engine->step();
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
}

// Different unit orders on different ranks are an error on every rank, naming the units, never a
// hang or silently mixed-up parameters: the first forward and backward (and any that leaves the
// recorded order) compare every request across ranks; each pass's order is compared too.
TEST(EngineZero3, DifferentUnitOrdersOnDifferentRanksAreAnError) {
  auto errors = run_thread_ranks(2, [&](Communicator& c) {
    StackNet net = make_stack_net(1);
    auto engine = sharded_stack_engine(c, net);
    auto X = dataset_x().narrow(0, 2 * c.rank(), 2), Y = dataset_y().narrow(0, 2 * c.rank(), 2);
    // Rank 1 runs its blocks in reverse: same sizes, different units; the first pass checks every
    // request, so the forward stops at the first block.
    at::Tensor h = zero::call(
        *net->in, [&](const at::Tensor& v) { return at::tanh(net->in->forward(v)); }, X);
    std::string fwd_error = testing::error_of<Error>([&] {
      for (int i = 0; i < 3; ++i) {
        auto lin = std::dynamic_pointer_cast<torch::nn::LinearImpl>(
            net->blocks[c.rank() == 0 ? i : 2 - i]);
        h = zero::call(
            *lin, [lin](const at::Tensor& v) { return at::tanh(lin->forward(v)); }, h);
      }
    });
    (void)Y;
    EXPECT_NE(fwd_error.find("ran different stage-3 units at the same point"), std::string::npos)
        << fwd_error;
    EXPECT_NE(fwd_error.find(c.rank() == 0 ? "ran 'blocks.0' while another ran 'blocks.2'"
                                           : "ran 'blocks.2' while another ran 'blocks.0'"),
              std::string::npos)
        << fwd_error;
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
}

// A GPT of 2 blocks x 32 wide: its c_attn/c_fc/c_proj weights and wte are at least 100 elements.
models::GPTConfig small_gpt() {
  models::GPTConfig gc;
  gc.vocab_size = 16;
  gc.block_size = 8;
  gc.n_layer = 2;
  gc.n_head = 2;
  gc.n_embd = 32;
  return gc;
}

// zero::Init builds the GPT already sharded: every unit's large parameters hold no memory once
// the constructor returns, and after initialize() the model is the one a normal build makes.
// With offload_param nvme the units' fp32 shards wait in an (unlinked) spill file, not in memory
// (NOTE [spilled shards]), and the model is the same.
TEST(EngineZero3, InitBuildsTheModelShardedWithTheSameValues) {
  testing::TempDir dir;
  const models::GPTConfig gc = small_gpt();
  const std::string nvme = "{\"device\": \"nvme\", \"nvme_path\": \"" + dir.path() + "\"";
  // In memory; spilled with every shard on disk (max_in_cpu 0) and with every shard kept in
  // memory by the engine (max_in_cpu 1e9: the spill is read back into memory).
  for (const std::string max_in_cpu : {"", "0", "1000000000"}) {
    const bool spilled = !max_in_cpu.empty();
    const std::string cfg = config_json(
        4, 2,
        kAdamW + zero3(", \"stage3_param_persistence_threshold\": 100" +
                       (spilled ? ", \"offload_optimizer\": " + nvme +
                                      "}, \"offload_param\": " + nvme +
                                      ", \"max_in_cpu\": " + max_in_cpu + "}"
                                : std::string())));
    models::GPT reference(gc, 11);
    std::vector<at::Tensor> got(2);
    auto errors = run_thread_ranks(2, [&](Communicator& c) {
      auto comm = std::shared_ptr<Communicator>(&c, [](Communicator*) {});
      models::GPT model(nullptr);
      {
        zero::Init init(comm, models::GPTImpl::zero_units(), Config::parse(cfg));
        model = models::GPT(gc, 11);
      }
      // Whether this rank's spill file is open (unlinked: only /proc/self/fd still names it).
      auto spill_open = [&] {
        const std::string name = "dscpp_init_rank" + std::to_string(c.rank()) + "_";
        for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
          std::error_code ec;
          if (std::filesystem::read_symlink(e.path(), ec).string().find(name) != std::string::npos)
            return true;
        }
        return false;
      };
      EXPECT_EQ(spill_open(), spilled);
      if (spilled) {
        EXPECT_EQ(zero::presharded_bytes_in_memory(), 0);
        EXPECT_TRUE(dir.entries().empty()) << "the spill file is unlinked while open";
      } else {
        EXPECT_GT(zero::presharded_bytes_in_memory(), 0);
      }
      for (const auto& item : model->named_parameters()) {
        const bool sharded = item.value().numel() >= 100 && item.key().rfind("wpe", 0) != 0 &&
                             item.key().rfind("ln_f", 0) != 0;
        EXPECT_EQ(item.value().storage().nbytes() == 0, sharded) << item.key();
      }
      InitOptions opts = borrowed(c);
      opts.zero_units = models::GPTImpl::zero_units();
      auto engine = initialize(model.ptr(), cfg, opts);
      EXPECT_FALSE(spill_open()) << "closed once the engine adopted every unit";
      zero::GatheredParameters whole(*model);
      std::vector<at::Tensor> flat;
      for (auto& p : model->parameters()) flat.push_back(p.detach().reshape({-1}).clone());
      got[c.rank()] = at::cat(flat);
    });
    for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
    std::vector<at::Tensor> flat;
    for (auto& p : reference->parameters()) flat.push_back(p.detach().reshape({-1}));
    EXPECT_TRUE(at::equal(got[0], at::cat(flat))) << "max_in_cpu " << max_in_cpu;
    EXPECT_TRUE(at::equal(got[1], got[0])) << "max_in_cpu " << max_in_cpu;
  }
}

// A model zero::Init sharded needs stage 3 and the same unit policy.
TEST(EngineZero3, InitNeedsStage3AndTheSamePolicy) {
  const models::GPTConfig gc = small_gpt();
  const std::string cfg3 =
      config_json(2, 2, kAdamW + zero3(", \"stage3_param_persistence_threshold\": 100"));
  auto errors = run_thread_ranks(1, [&](Communicator& c) {
    auto comm = std::shared_ptr<Communicator>(&c, [](Communicator*) {});
    auto build = [&] {
      zero::Init init(comm, models::GPTImpl::zero_units(), Config::parse(cfg3));
      return models::GPT(gc, 1);
    };
    models::GPT a = build();
    std::string msg = testing::error_of<ConfigError>([&] {
      initialize(a.ptr(), config_json(2, 2, kAdamW + ", \"zero_optimization\": {\"stage\": 2}"),
                 borrowed(c));
    });
    EXPECT_NE(msg.find("was sharded by zero::Init, which needs ZeRO stage 3"), std::string::npos)
        << msg;
    models::GPT b = build();
    InitOptions opts = borrowed(c);
    opts.zero_units = zero::UnitPolicy{{"h.*"}};  // not wte
    msg = testing::error_of<ConfigError>([&] { initialize(b.ptr(), cfg3, opts); });
    EXPECT_NE(msg.find("parameter 'wte.weight' was sharded by zero::Init but is in no unit"),
              std::string::npos)
        << msg;
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
}

// zero::load_weights at stage 3: each rank reads only its shards' bytes, into its shards and
// (bf16) its fp32 master weights; the whole model is then the file's.
// offload_param nvme (NOTE [stage 3 parameter offload]): with the units' shards on disk, read
// ahead of their all-gathers and written back by the step, training is the same bit for bit as
// with them in memory, at worlds 1 and 2, in fp32 (the optimizer's fp32 weights on disk too) and
// bf16 (master weights in memory, or on disk), with every shard on disk or only those past
// max_in_cpu, one read-ahead buffer or five, and zero::checkpoint recomputing the blocks.
TEST(EngineZero3, ParametersOnDiskTrainBitForBitAsInMemory) {
  testing::TempDir dir;
  const std::string nvme = "{\"device\": \"nvme\", \"nvme_path\": \"" + dir.path() + "\"";
  const std::string opt_nvme = ", \"sub_group_size\": 100, \"offload_optimizer\": " + nvme +
                               ", \"pipeline_read\": true, \"pipeline_write\": true}";
  struct Precision {
    std::string name, cfg, optimizer;
  };
  for (const Precision& prec :
       {Precision{"fp32, optimizer on disk", "", opt_nvme},
        Precision{"bf16", ", \"bf16\": {\"enabled\": true}", ""},
        Precision{"bf16, optimizer on disk", ", \"bf16\": {\"enabled\": true}", opt_nvme}}) {
    for (int world : {1, 2}) {
      for (const auto& [param, checkpoint] : std::vector<std::pair<std::string, bool>>{
               {", \"max_in_cpu\": 0}", false},
               {", \"max_in_cpu\": 300, \"buffer_count\": 1}", true}}) {
        const std::string what =
            prec.name + " world " + std::to_string(world) + " offload_param" + param;
        const std::string base =
            kAdamW + prec.cfg +
            zero3(", \"stage3_param_persistence_threshold\": 0" + prec.optimizer);
        auto ref = run_stack(world, 10, config_json(8, 8 / world, base), kEverything, checkpoint);
        auto got = run_stack(
            world, 10,
            config_json(8, 8 / world,
                        kAdamW + prec.cfg +
                            zero3(", \"stage3_param_persistence_threshold\": 0" + prec.optimizer +
                                  ", \"offload_param\": " + nvme + param)),
            kEverything, checkpoint);
        for (int r = 0; r < world; ++r) {
          EXPECT_EQ(got[r].losses, ref[r].losses) << what;
          EXPECT_EQ(got[r].grad_norms, ref[r].grad_norms) << what;
          EXPECT_TRUE(at::equal(got[r].params, ref[r].params)) << what;
          EXPECT_LT(got[r].memory.params, ref[r].memory.params) << what;
          EXPECT_GT(got[r].memory.offload_buffers, 0) << what;
        }
        EXPECT_TRUE(dir.entries().empty()) << what << ": the swap files are unlinked while open";
      }
    }
  }
}

// Both offloads on nvme (NOTE [gradients on disk]): the gradient shard is summed on disk
// instead of in memory, and training is the same bit for bit as with everything in memory
// (losses, gradient norms, final weights), in fp32 and bf16, at worlds 1 and 2, GAS 1 and 2,
// with a gradient_predivide_factor (the piece then added in one operation), clipped (the norm
// taken as the shard is written).
TEST(EngineZero3, GradientsOnDiskTrainBitForBitAsInMemory) {
  testing::TempDir dir;
  const std::string nvme = "{\"device\": \"nvme\", \"nvme_path\": \"" + dir.path() + "\"";
  const std::string offload = ", \"sub_group_size\": 100, \"offload_optimizer\": " + nvme +
                              ", \"pipeline_read\": true}, \"offload_param\": " + nvme +
                              ", \"max_in_cpu\": 0}";
  for (const std::string prec : {std::string(""), std::string(", \"bf16\": {\"enabled\": true}")}) {
    for (int world : {1, 2}) {
      for (int gas : {1, 2}) {
        for (const std::string more :
             {std::string(""), std::string(", \"gradient_predivide_factor\": 2.0")}) {
          const std::string what = (prec.empty() ? "fp32" : "bf16") + std::string(" world ") +
                                   std::to_string(world) + " GAS " + std::to_string(gas) + more;
          const std::string base =
              kAdamW + prec + more + zero3(", \"stage3_param_persistence_threshold\": 0");
          const int micro = 8 / world / gas;
          auto ref = run_stack(world, 6, config_json(8, micro, base), kEverything);
          auto got = run_stack(
              world, 6,
              config_json(8, micro,
                          kAdamW + prec + more +
                              zero3(", \"stage3_param_persistence_threshold\": 0" + offload)),
              kEverything);
          for (int r = 0; r < world; ++r) {
            EXPECT_EQ(got[r].losses, ref[r].losses) << what;
            EXPECT_EQ(got[r].grad_norms, ref[r].grad_norms) << what;
            EXPECT_TRUE(at::equal(got[r].params, ref[r].params)) << what;
            EXPECT_EQ(got[r].memory.grads, 0) << what << ": the shard is on disk";
            EXPECT_GT(ref[r].memory.grads, 0) << what;
          }
          EXPECT_TRUE(dir.entries().empty()) << what << ": the swap files are unlinked while open";
        }
      }
    }
  }
}

// A window flushed before its boundary (flush_accumulation at an epoch's ragged end) with the
// gradient shard on disk: no backward of it took the blocks' sums, so the norm is read back from
// the disk, with the same bits as in memory (and clipping acts on it alike).
TEST(EngineZero3, GradientsOnDiskFlushLikeInMemory) {
  testing::TempDir dir;
  const std::string nvme = "{\"device\": \"nvme\", \"nvme_path\": \"" + dir.path() + "\"";
  const std::string bf16 = ", \"bf16\": {\"enabled\": true}";
  const std::string threshold = ", \"stage3_param_persistence_threshold\": 0";
  const std::vector<std::string> cfgs{
      config_json(12, 2, kAdamW + bf16 + zero3(threshold)),  // GAS 3 at world 2
      config_json(12, 2,
                  kAdamW + bf16 +
                      zero3(threshold + ", \"offload_optimizer\": " + nvme +
                            "}, \"offload_param\": " + nvme + ", \"max_in_cpu\": 0}"))};
  std::vector<std::vector<double>> norms(2);
  std::vector<at::Tensor> params(2);
  for (size_t which = 0; which < cfgs.size(); ++which) {
    auto errors = run_thread_ranks(2, [&](Communicator& c) {
      StackNet net = make_stack_net(100 + c.rank());
      InitOptions opts = borrowed(c);
      opts.zero_units = kEverything;
      auto engine = initialize(net.ptr(), cfgs[which], opts);
      auto X = dataset_x().narrow(0, 2 * c.rank(), 2).to(at::kBFloat16);
      auto Y = dataset_y().narrow(0, 2 * c.rank(), 2);
      for (int k = 0; k < 5; ++k) {  // a whole window of 3 micro-steps, then 2 and the flush
        engine->backward(at::mse_loss(net->forward(X).to(at::kFloat), Y));
        engine->step();
        if (k == 2 && c.rank() == 0) norms[which].push_back(engine->last_step().grad_norm);
      }
      engine->flush_accumulation();
      EXPECT_EQ(engine->global_steps(), 2);
      if (c.rank() == 0) norms[which].push_back(engine->last_step().grad_norm);
      zero::GatheredParameters whole(*net);
      std::vector<at::Tensor> flat;
      for (auto& p : net->parameters()) flat.push_back(p.detach().reshape({-1}).to(at::kFloat));
      if (c.rank() == 0) params[which] = at::cat(flat);
    });
    for (auto& e : errors) EXPECT_FALSE(e) << error_text(e);
  }
  ASSERT_EQ(norms[0].size(), 2u);
  EXPECT_GT(norms[0][1], 0);
  EXPECT_EQ(norms[1], norms[0]);
  EXPECT_TRUE(at::equal(params[1], params[0]));
}

// offload_param cpu of a model on a device (NOTE [shards off the device]), the device being the
// tests' stand-in for a GPU: every unit's shard waits in host memory and goes up for its
// all-gathers, read ahead on the recorded order (buffer_count 1 and 5); with the fp32 weights on
// the device (bf16) or in host memory (offload_optimizer cpu, fp32 and bf16), and with the shards
// on disk behind the link (nvme). Bit for bit as in memory, at worlds 1 and 2, with activation
// checkpointing in one case.
TEST(EngineZero3, ParametersInHostMemoryTrainBitForBitAsInMemory) {
  testing::TempDir dir;
  const std::string bf16 = ", \"bf16\": {\"enabled\": true}";
  const std::string opt_cpu =
      ", \"sub_group_size\": 100, \"offload_optimizer\": {\"device\": \"cpu\"}";
  struct Case {
    std::string name, precision, optimizer, param;
    bool checkpoint;
  };
  const std::string cpu = "{\"device\": \"cpu\", \"pin_memory\": true}";
  for (const Case& c :
       {Case{"bf16", bf16, "", cpu, false},
        Case{"bf16, optimizer in host memory, 1 buffer", bf16, opt_cpu,
             "{\"device\": \"cpu\", \"buffer_count\": 1}", true},
        Case{"fp32, optimizer in host memory", "", opt_cpu, cpu, false},
        Case{"bf16, shards on disk", bf16, opt_cpu,
             "{\"device\": \"nvme\", \"max_in_cpu\": 0, \"nvme_path\": \"" + dir.path() + "\"}",
             false},
        Case{"fp32, optimizer and shards on disk", "",
             ", \"sub_group_size\": 100, \"offload_optimizer\": {\"device\": \"nvme\", "
             "\"nvme_path\": \"" + dir.path() + "\", \"pipeline_read\": true}",
             "{\"device\": \"nvme\", \"max_in_cpu\": 0, \"nvme_path\": \"" + dir.path() + "\"}",
             false}}) {
    for (int world : {1, 2}) {
      const std::string what = c.name + " world " + std::to_string(world);
      const std::string base = kAdamW + c.precision +
                               zero3(", \"stage3_param_persistence_threshold\": 0" + c.optimizer);
      auto ref = run_stack(world, 6, config_json(8, 8 / world, base), kEverything, c.checkpoint);
      std::vector<std::unique_ptr<testing::StandInLink>> links;
      for (int r = 0; r < world; ++r)
        links.push_back(std::make_unique<testing::StandInLink>(
            testing::StandInOptions{std::chrono::microseconds(50)}));
      auto got = run_stack(
          world, 6,
          config_json(8, 8 / world,
                      kAdamW + c.precision +
                          zero3(", \"stage3_param_persistence_threshold\": 0" + c.optimizer +
                                ", \"offload_param\": " + c.param)),
          kEverything, c.checkpoint,
          [&](InitOptions& o) { o.device_link = links.at(o.comm->rank()).get(); });
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(got[r].losses, ref[r].losses) << what;
        EXPECT_EQ(got[r].grad_norms, ref[r].grad_norms) << what;
        EXPECT_TRUE(at::equal(got[r].params, ref[r].params)) << what;
        EXPECT_LT(got[r].memory.params, ref[r].memory.params) << what;
        // Every shard went up for its unit's gather at least once a step; in host memory they
        // count in `host`, not in `params`.
        const int64_t shards = ref[r].memory.params - got[r].memory.params;
        EXPECT_GE(links[r]->bytes(false), 6 * shards) << what;
        if (c.param.find("nvme") == std::string::npos)
          EXPECT_GE(got[r].memory.host, shards) << what;
      }
    }
  }
}

TEST(EngineZero3, LoadWeightsReadsOnlyThisRanksShards) {
  testing::TempDir dir;
  const std::string path = dir.file("w.safetensors");
  {
    StackNet net = make_stack_net(5);
    safetensors::TensorList tensors;
    int k = 0;
    for (const auto& item : net->named_parameters()) {
      tensors.emplace_back(
          item.key(),
          at::arange(item.value().numel(), at::kFloat).reshape(item.value().sizes()) * 0.001 + k++);
    }
    safetensors::save(path, tensors);
  }
  testing::TempDir swap;
  // The last: bf16 with every shard on disk (offload_param), read and written back once per unit.
  for (const std::string prec :
       {std::string(""), std::string(", \"bf16\": {\"enabled\": true}"),
        std::string(", \"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 3, "
                    "\"stage3_param_persistence_threshold\": 0, \"offload_param\": "
                    "{\"device\": \"nvme\", \"max_in_cpu\": 0, \"nvme_path\": \"") +
            swap.path() + "\"}}"}) {
    std::vector<at::Tensor> got(2);
    auto errors = run_thread_ranks(2, [&](Communicator& c) {
      StackNet net = make_stack_net(1);
      InitOptions opts = borrowed(c);
      opts.zero_units = kEverything;
      const std::string zero = prec.find("offload_param") != std::string::npos
                                   ? ""
                                   : ", \"zero_optimization\": {\"stage\": 3, "
                                     "\"stage3_param_persistence_threshold\": 0}";
      auto engine = initialize(
          net.ptr(),
          config_json(
              4, 2, ", \"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0}}" + prec + zero),
          opts);
      zero::load_weights(*net, path);
      zero::UnitEntry e;
      ASSERT_TRUE(zero::registry::find(net.get(), &e));
      // 1092 elements in units padded to even lengths: half of them per rank, 4 bytes each.
      EXPECT_EQ(zero::registry::owner(e.owner)->last_load_bytes(), 4u * 1092 / 2);
      // A step at lr 0 republishes the master weights: they carry the file's values too.
      auto X = dataset_x().narrow(0, 2 * c.rank(), 2), Y = dataset_y().narrow(0, 2 * c.rank(), 2);
      engine->backward(
          at::mse_loss(net->forward(X.to(net->in->weight.scalar_type())).to(at::kFloat), Y));
      engine->step();
      zero::GatheredParameters whole(*net);
      std::vector<at::Tensor> flat;
      for (auto& p : net->parameters()) flat.push_back(p.detach().reshape({-1}).to(at::kFloat));
      got[c.rank()] = at::cat(flat);
    });
    for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
    auto file = safetensors::load(path);
    std::vector<at::Tensor> flat;
    for (auto& [name, t] : file.tensors) flat.push_back(t.reshape({-1}));
    at::Tensor want = at::cat(flat);
    if (prec.find("bf16") != std::string::npos) want = want.to(at::kBFloat16).to(at::kFloat);
    EXPECT_TRUE(at::equal(got[0], want)) << prec;
    EXPECT_TRUE(at::equal(got[1], want)) << prec;
  }
}

}  // namespace
}  // namespace dscpp
