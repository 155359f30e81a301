// A user's own model at ZeRO stage 3 in bf16: an MLP of Linear + LayerNorm + GELU blocks, each
// block a stage-3 unit through one line (DSCPP_ZERO_UNIT instead of TORCH_MODULE), inputs cast to
// the training dtype by the engine, a checkpoint saved half-way and resumed. Units are released
// after use and one block is gathered ahead, so at most two blocks' parameters are whole at once.
//   dscpp launch --num_procs 2 ./my_blocks CKPT_DIR            trains 60 steps, saves at step 30
//   dscpp launch --num_procs 2 ./my_blocks CKPT_DIR --resume   loads step 30, trains to 60
// Both print the same loss at step 60: the resumed run continues bit for bit. The checkpoint goes
// through the program's own io::FileSystem (the public seam, include/dscpp/file_system.h), here
// one that counts what is written. --width W,
// --blocks B and --steps N change the model's size and the run's length (docs/benchmarks.md
// measures stage 3's memory with them).
#include <ATen/ATen.h>
#include <dscpp/engine.h>
#include <dscpp/error.h>
#include <dscpp/file_system.h>
#include <dscpp/zero_unit.h>
#include <sys/resource.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cstdint>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t width) {
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
    fc = register_module("fc", torch::nn::Linear(width, width));
  }
  at::Tensor forward(const at::Tensor& x) { return x + at::gelu(fc->forward(norm->forward(x))); }
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear fc{nullptr};
};
DSCPP_ZERO_UNIT(Block);  // every Block is a stage-3 unit; block(x) runs it as one

struct Mlp : torch::nn::Module {
  Mlp(int64_t width, int depth) {
    in = register_module("in", torch::nn::Linear(16, width));
    for (int i = 0; i < depth; ++i)
      blocks.push_back(register_module("block" + std::to_string(i), Block(width)));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
    out = register_module("out", torch::nn::Linear(width, 1));
  }
  at::Tensor forward(const at::Tensor& x) {  // [b, 16] -> [b, 1]
    at::Tensor h = in->forward(x);
    for (auto& block : blocks) h = block(h);  // through the holder: a unit at stage 3
    return out->forward(norm->forward(h));
  }
  torch::nn::Linear in{nullptr}, out{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  std::vector<Block> blocks;
};

// A fixed task: y = sum of sin over the inputs. Each (step, micro-step, rank) draws its own
// micro-batch from a generator of its own, so a resumed run sees the same data.
std::pair<at::Tensor, at::Tensor> batch(int64_t step, int k, int rank, int size) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100000 * step + 100 * k + rank);
  at::Tensor x = at::rand({size, 16}, gen) * 2 - 1;
  return {x, at::sin(3 * x).sum(1, /*keepdim=*/true) / 4};
}

// The POSIX file system, counting the bytes written through it: where a program routes or meters
// checkpoint I/O (an object store, a quota) it implements io::FileSystem the same way.
class CountingFileSystem final : public dscpp::io::FileSystem {
 public:
  int64_t written = 0;
  std::unique_ptr<dscpp::io::RandomAccessFile> open_for_read(const std::string& p) override {
    return posix_.open_for_read(p);
  }
  std::unique_ptr<dscpp::io::WritableFile> open_for_write(const std::string& p) override {
    return std::make_unique<Counted>(posix_.open_for_write(p), written);
  }
  std::unique_ptr<dscpp::io::WritableFile> open_for_append(const std::string& p) override {
    return std::make_unique<Counted>(posix_.open_for_append(p), written);
  }
  void rename_file(const std::string& from, const std::string& to) override {
    posix_.rename_file(from, to);
  }
  void remove_file(const std::string& p) override { posix_.remove_file(p); }
  void sync_dir(const std::string& d) override { posix_.sync_dir(d); }
  void create_dirs(const std::string& d) override { posix_.create_dirs(d); }
  bool exists(const std::string& p) override { return posix_.exists(p); }
  uint64_t file_size(const std::string& p) override { return posix_.file_size(p); }
  std::vector<std::string> list_dir(const std::string& d) override { return posix_.list_dir(d); }

 private:
  struct Counted final : dscpp::io::WritableFile {
    Counted(std::unique_ptr<dscpp::io::WritableFile> f, int64_t& n) : f(std::move(f)), n(n) {}
    void append(const void* data, size_t size) override {
      f->append(data, size);
      n += static_cast<int64_t>(size);
    }
    void sync() override { f->sync(); }
    void close() override { f->close(); }
    const std::string& path() const override { return f->path(); }
    std::unique_ptr<dscpp::io::WritableFile> f;
    int64_t& n;
  };
  dscpp::io::FileSystem& posix_ = dscpp::io::default_file_system();
};

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024;  // KiB on Linux
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: my_blocks CKPT_DIR [--resume] [--width W] [--blocks B] [--steps N]"
              << std::endl;
    return 2;
  }
  const std::string dir = argv[1];
  bool resume = false;
  int64_t width = 512;
  int depth = 3, steps = 60;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--resume") {
      resume = true;
    } else if (i + 1 < argc && (a == "--width" || a == "--blocks" || a == "--steps")) {
      const int v = std::stoi(argv[++i]);
      if (a == "--width") width = v;
      if (a == "--blocks") depth = v;
      if (a == "--steps") steps = v;
    } else {
      std::cerr << "my_blocks: unknown argument '" << a << "'" << std::endl;
      return 2;
    }
  }
  // Units released after use (reuse distance 0) and one block gathered ahead.
  const int64_t block = width * width;
  const std::string config = R"({
    "train_batch_size": 32, "train_micro_batch_size_per_gpu": 8, "steps_per_print": 1000,
    "gradient_clipping": 1.0, "bf16": {"enabled": true},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
    "zero_optimization": {"stage": 3, "stage3_max_reuse_distance": 0,
                          "stage3_prefetch_bucket_size": )" +
                             std::to_string(block) + R"(, "stage3_max_live_parameters": )" +
                             std::to_string(2 * block) + "}}";
  try {
    at::manual_seed(0);  // rank 0's initial weights are every rank's: seeded, a run repeats
    auto model = std::make_shared<Mlp>(width, depth);
    CountingFileSystem files;
    dscpp::InitOptions options;
    options.file_system = &files;  // must outlive the engine
    auto engine = dscpp::initialize(model, config, options);
    if (resume) engine->load_checkpoint(dir);
    double loss = 0, first = -1;
    while (engine->global_steps() < steps) {
      for (int k = 0; k < engine->gradient_accumulation_steps(); ++k) {
        auto [x, y] = batch(engine->global_steps(), k, engine->rank(),
                            engine->train_micro_batch_size_per_gpu());
        // bf16: the model computes in engine->dtype(); the loss in fp32. The forward runs in
        // the engine's autocast scope, which torch_autocast needs (and which does nothing
        // without it).
        at::Tensor out;
        {
          auto autocast = engine->autocast();
          out = model->forward(engine->cast_input(x));
        }
        engine->backward(at::mse_loss(out.to(at::kFloat), y));
        engine->step();
      }
      loss = engine->last_step().loss;
      if (first < 0) first = loss;
      if (!resume && engine->global_steps() == steps / 2) {
        engine->save_checkpoint(dir);
        std::printf(
            "rank %d: checkpoint at step %lld: %lld bytes written through the program's "
            "file system\n",
            engine->rank(), static_cast<long long>(engine->global_steps()),
            static_cast<long long>(files.written));
        if (files.written == 0) return 4;  // the seam was not used
      }
    }
    const dscpp::MemoryStats m = engine->memory_stats();
    if (engine->rank() == 0) {
      int64_t n = 0;
      for (const auto& p : model->parameters()) n += p.numel();
      std::printf(
          "%s: loss at step %lld: %.6f (first step of this run: %.4f); %lld parameters, model "
          "states %.2f bytes per parameter per rank on %d ranks; gathered at most %.2f MiB at "
          "once (one block: %.2f MiB); peak RSS %.0f MiB\n",
          resume ? "resumed" : "trained", static_cast<long long>(engine->global_steps()), loss,
          first, static_cast<long long>(n), static_cast<double>(m.model_states()) / n,
          engine->world_size(), static_cast<double>(m.gathered) / (1 << 20),
          block * 2.0 / (1 << 20), peak_rss_mib());  // a block's fc.weight in bf16
    }
    // Learning, checked on a run from step 0 of 60 steps or more: at the default size the first
    // step's loss is 0.48 with this seed, step 60's 0.21.
    return resume || steps < 60 || loss < first ? 0 : 3;
  } catch (const dscpp::Error& e) {
    std::cerr << e.what() << std::endl;
    return 1;
  }
}
