// The engine-checkpoint tests' model, training loop and configs (engine_checkpoint_test.cpp,
// background_save_test.cpp): ranks as threads over the shared data contract.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include <functional>
#include <string>
#include <vector>

#include "dscpp/engine.h"
#include "engine/test_net.h"
#include "support/errors.h"
#include "support/thread_ranks.h"

namespace dscpp::ckpttest {

// A model of element-wise operations only (libtorch 1.13 has CPU fp16 kernels for those), with
// parameter sizes that do not divide by 3 or 4, a frozen parameter and a buffer that forward
// updates: all of it must come back from a checkpoint.
struct CkptNetImpl : torch::nn::Module {
  explicit CkptNetImpl(double shift = 0) {
    w = register_parameter("w", at::linspace(-0.5, 0.7, 8) + shift);
    b = register_parameter("b", at::linspace(0.1, -0.2, 8) - shift);
    v = register_parameter("v", at::linspace(0.3, -0.4, 8).reshape({4, 2}));
    u = register_parameter("u", at::linspace(0.2, 0.9, 7));
    frozen =
        register_parameter("frozen", at::linspace(1.0, 1.5, 4) + shift, /*requires_grad=*/false);
    seen = register_buffer("seen", at::zeros({2}) + shift);
  }
  at::Tensor forward(const at::Tensor& x) {  // x [n, 8] -> [n, 4]
    {
      at::NoGradGuard no_grad;
      seen.add_(at::ones({2}, seen.options()));
    }
    at::Tensor h = x * w + b;
    at::Tensor y = (h * h).reshape({-1, 4, 2}).mul(v).sum(-1);
    return y * frozen + u.narrow(0, 0, 4) * u.narrow(0, 3, 4);
  }
  at::Tensor w, b, v, u, frozen, seen;
};
TORCH_MODULE(CkptNet);

struct Record {
  std::vector<double> losses, norms, scales;
  at::Tensor state;  // every parameter and buffer, flat fp32, after the last step
  int64_t skipped = 0, global_steps = 0, global_samples = 0;
};

// Trains optimizer steps [from, to) on the data contract's no-shuffle order; at step s, rank
// `overflow_rank(s)` (-1: none) feeds an input whose fp16 gradients overflow.
inline void train_steps(Engine& e, CkptNet& net, int from, int to, Record& rec,
                        const std::function<int(int)>& overflow_rank = nullptr) {
  const int B = e.train_batch_size(), b = e.train_micro_batch_size_per_gpu();
  const int gas = e.gradient_accumulation_steps(), world = e.world_size(), rank = e.rank();
  auto X = enginetest::dataset_x(), Y = enginetest::dataset_y();
  for (int s = from; s < to; ++s) {
    for (int k = 0; k < gas; ++k) {
      std::vector<int64_t> idx;
      for (int i = 0; i < b; ++i)
        idx.push_back((s * B + (k * world + rank) * b + i) % enginetest::kSamples);
      auto ix = at::tensor(idx, at::kLong);
      at::Tensor x = X.index_select(0, ix);
      if (overflow_rank && overflow_rank(s) == rank) x = x * 300.0;
      at::Tensor out = net->forward(x.to(net->w.scalar_type()));
      e.backward(at::mse_loss(out.to(at::kFloat), Y.index_select(0, ix)));
      e.step();
    }
    rec.losses.push_back(e.last_step().loss);
    rec.norms.push_back(e.last_step().grad_norm);
    rec.scales.push_back(e.loss_scale());
  }
  std::vector<at::Tensor> flat;
  for (auto& p : net->parameters()) flat.push_back(p.detach().reshape({-1}).to(at::kFloat));
  for (auto& t : net->buffers()) flat.push_back(t.detach().reshape({-1}).to(at::kFloat));
  rec.state = at::cat(flat);
  rec.skipped = e.skipped_steps();
  rec.global_steps = e.global_steps();
  rec.global_samples = e.global_samples();
}

inline const std::string kOpt =
    ", \"gradient_clipping\": 0.5, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, "
    "\"weight_decay\": 0.1}}, \"scheduler\": {\"type\": \"WarmupLR\", \"params\": "
    "{\"warmup_min_lr\": "
    "0.001, \"warmup_max_lr\": 0.01, \"warmup_num_steps\": 6, \"warmup_type\": \"linear\"}}";

inline std::string stage_cfg(int stage) {
  return ", \"zero_optimization\": {\"stage\": " + std::to_string(stage) +
         (stage == 3 ? ", \"stage3_param_persistence_threshold\": 0}" : "}");
}

inline std::string dtype_cfg(const std::string& dtype) {
  if (dtype == "bf16") return ", \"bf16\": {\"enabled\": true}";
  if (dtype == "fp16") {
    return ", \"fp16\": {\"enabled\": true, \"initial_scale_power\": 8, \"hysteresis\": 2, "
           "\"loss_scale_window\": 3}";
  }
  return "";
}

// Runs `fn(comm)` on `world` thread ranks; fails the test on any rank's error.
// `per_host` > 0: the ranks on simulated hosts of that many ranks each (the hierarchy).
inline void on_ranks(int world, const std::function<void(comm::Communicator&)>& fn,
                     const std::string& what, int per_host = 0) {
  auto errors = per_host > 0
                    ? testing::run_thread_ranks_with(testing::on_hosts(per_host), world, fn)
                    : testing::run_thread_ranks(world, fn);
  for (size_t r = 0; r < errors.size(); ++r)
    ASSERT_FALSE(errors[r]) << what << ": rank " << r << ": " << testing::error_text(errors[r]);
}

}  // namespace dscpp::ckpttest
