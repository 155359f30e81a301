// A user's own trainer: a small MLP learns y = sin(3x) + x/2 through dscpp's public API only,
// with the optimizer, schedule, batch sizes and gradient accumulation all from a DeepSpeed JSON
// config. Each rank draws its own micro-batches; the engine averages gradients over ranks.
//   dscpp launch --num_procs 2 ./my_trainer ds_config.json
//   ./my_trainer ds_config.json --check 8     # what initialize() would refuse on 8 ranks, then
//   exit
#include <ATen/ATen.h>
#include <dscpp/engine.h>
#include <dscpp/error.h>
#include <torch/nn/modules/linear.h>

#include <cmath>
#include <iostream>

struct Net : torch::nn::Module {
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(1, 64));
    fc2 = register_module("fc2", torch::nn::Linear(64, 64));
    out = register_module("out", torch::nn::Linear(64, 1));
  }
  at::Tensor forward(const at::Tensor& x) {  // [b, 1] -> [b, 1]
    return out->forward(at::tanh(fc2->forward(at::tanh(fc1->forward(x)))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, out{nullptr};
};

at::Tensor target(const at::Tensor& x) { return at::sin(3 * x) + x / 2; }

int main(int argc, char** argv) {
  const std::string config = argc > 1 ? argv[1] : R"({
    "train_batch_size": 64, "train_micro_batch_size_per_gpu": 16, "steps_per_print": 100,
    "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.0}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 20}}})";
  try {
    auto model = std::make_shared<Net>();
    // --check N: the pre-flight for a job of N ranks (the config, the batch, the model, memory),
    // without joining one.
    if (argc > 3 && std::string(argv[2]) == "--check") {
      for (const auto& w : dscpp::check(model, config, std::stoi(argv[3])))
        std::cout << "warning: " << w << std::endl;
      std::cout << "initialize() would accept this config on " << argv[3] << " ranks" << std::endl;
      return 0;
    }
    auto engine = dscpp::initialize(model, config);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + engine->rank());
    for (int step = 0; step < 600; ++step) {
      for (int k = 0; k < engine->gradient_accumulation_steps(); ++k) {
        auto x = at::rand({engine->train_micro_batch_size_per_gpu(), 1}, gen) * 4 - 2;
        engine->backward(at::mse_loss(model->forward(x), target(x)));
        engine->step();
      }
    }
    auto x = at::linspace(-2, 2, 101).unsqueeze(1);
    double mse = at::mse_loss(model->forward(x), target(x)).item<double>();
    if (engine->rank() == 0) {
      std::cout << "trained " << engine->global_steps() << " steps on " << engine->world_size()
                << " ranks (GAS " << engine->gradient_accumulation_steps()
                << "): test MSE " << mse << std::endl;
    }
    // The untrained net's MSE is about 0.8; learning means well below that.
    return mse < 0.05 ? 0 : 3;
  } catch (const dscpp::Error& e) {
    std::cerr << e.what() << std::endl;
    return 1;
  }
}
