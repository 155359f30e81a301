// A user's own trainer for the fault suite (tests/faults/fault_suite.py), on dscpp's public API
// only: an element-wise model (libtorch 1.13 has no CPU fp16 matmul or tanh) fits y = sin(3x)
// on every rank, with one misuse of the engine API or one numerical fault placed on one rank.
//
//   fault_trainer CONFIG MODE RANK STEP STEPS
//
// MODE (RANK is the rank it happens on; STEP is a 0-based optimizer step):
//   none    trains STEPS optimizer steps
//   skip    RANK skips the first micro-step of optimizer step STEP (no forward, backward or
//           step() for it), so its collectives fall one micro-step behind the others
//   save    only RANK calls save_checkpoint (into CONFIG's folder), after optimizer step STEP:
//           the mistake `if (rank == 0) engine->save_checkpoint(...)`
//   wider   RANK's model is one unit wider
//   double  RANK's model is in float64
//   nan     RANK's gradient of w2 turns NaN in optimizer step STEP (the loss stays finite)
// Rank 0 prints "step N loss L scale S skipped K" after each optimizer step, and every rank
// prints "rank R: done, skipped_steps K" at the end. Exit status: 0 trained, 1 a dscpp::Error
// (printed), 2 bad arguments.
#include <ATen/ATen.h>
#include <dscpp/engine.h>
#include <dscpp/error.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <string>

namespace {

struct Net : torch::nn::Module {
  Net(int64_t width, at::ScalarType dtype) {
    auto opt = at::TensorOptions().dtype(dtype);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
    w1 = register_parameter("w1", at::randn({width}, gen).to(opt));
    b1 = register_parameter("b1", (at::rand({width}, gen) * 4 - 2).to(opt));
    w2 = register_parameter("w2", (at::randn({width}, gen) * 0.1).to(opt));
    w3 = register_parameter("w3", (at::randn({width}, gen) * 0.1).to(opt));
  }
  at::Tensor forward(const at::Tensor& x) {  // [b, 1] -> [b]
    at::Tensor h = x * w1 + b1;
    return (h * h * w2 + h * w3).sum(1);
  }
  at::Tensor w1, b1, w2, w3;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::cerr << "usage: fault_trainer CONFIG MODE RANK STEP STEPS\n";
    return 2;
  }
  const std::string config = argv[1], mode = argv[2];
  const int fault_rank = std::atoi(argv[3]);
  const int64_t fault_step = std::atoll(argv[4]), steps = std::atoll(argv[5]);
  if (mode != "none" && mode != "skip" && mode != "save" && mode != "wider" && mode != "double" &&
      mode != "nan") {
    std::cerr << "fault_trainer: unknown mode '" << mode << "'\n";
    return 2;
  }
  try {
    // The rank is known only after initialize(); the model is built first, so the launcher's
    // RANK says which rank this is.
    const char* env_rank = std::getenv("RANK");
    const bool faulty = env_rank && std::atoi(env_rank) == fault_rank;
    auto model = std::make_shared<Net>(mode == "wider" && faulty ? 33 : 32,
                                       mode == "double" && faulty ? at::kDouble : at::kFloat);
    bool poison = false;
    model->w2.register_hook([&poison](const at::Tensor& g) {
      return poison ? g * std::numeric_limits<double>::quiet_NaN() : g;
    });
    auto engine = dscpp::initialize(model, config);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + engine->rank());
    const auto dtype = model->w1.scalar_type();
    for (int64_t step = 0; step < steps; ++step) {
      poison = mode == "nan" && faulty && step == fault_step;
      for (int k = 0; k < engine->gradient_accumulation_steps(); ++k) {
        if (mode == "skip" && faulty && step == fault_step && k == 0) continue;
        auto x = at::rand({engine->train_micro_batch_size_per_gpu(), 1}, gen) * 4 - 2;
        auto y = at::sin(3 * x).squeeze(1);
        auto loss = (model->forward(x.to(dtype)).to(at::kFloat) - y).pow(2).mean();
        engine->backward(loss);
        engine->step();
      }
      if (mode == "save" && faulty && step == fault_step) {
        const size_t slash = config.find_last_of('/');
        engine->save_checkpoint((slash == std::string::npos ? "." : config.substr(0, slash)) +
                                "/ckpt");
      }
      if (engine->rank() == 0) {
        std::printf("step %lld loss %.6f scale %g skipped %lld\n",
                    static_cast<long long>(engine->global_steps()), engine->last_step().loss,
                    engine->last_step().loss_scale,
                    static_cast<long long>(engine->skipped_steps()));
        std::fflush(stdout);
      }
    }
    std::printf("rank %d: done, skipped_steps %lld\n", engine->rank(),
                static_cast<long long>(engine->skipped_steps()));
    return 0;
  } catch (const dscpp::Error& e) {
    std::cerr << e.what() << std::endl;
    return 1;
  }
}
