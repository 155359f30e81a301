// dscpp train: trains the built-in GPT through the engine, the project's main job. Run it on
// several processes with `dscpp launch`. Data: the built-in reversal task (no --data; ends by
// printing held-out accuracy), the bytes of a text file (--data FILE.txt, vocab 256), or raw
// little-endian uint16 tokens (--data FILE.bin). The batches follow the data contract in
// include/dscpp/data.h, so another framework can reproduce a run (--no_shuffle).
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <signal.h>
#include <torch/cuda.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>

#include "dscpp/data.h"
#include "dscpp/device_link.h"
#include "dscpp/engine.h"
#include "dscpp/error.h"
#include "dscpp/models/gpt.h"
#include "dscpp/process_env.h"
#include "dscpp/safetensors.h"
#include "dscpp/zero.h"
#include "engine/check_supported.h"
#include "engine/estimate.h"
#include "tools.h"
#include "util/log.h"
#include "util/memory.h"

namespace dscpp::tools {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kMiB = 1 << 20;

struct TrainArgs {
  std::string config, data, init, save_final, metrics, level, device = "cpu", save_dir;
  int64_t save_interval = 0;
  bool resume = false;
  int64_t n_layer = 2, n_head = 4, n_embd = 64, block_size = 0, vocab_size = 0;
  int64_t steps = 300, eval_problems = 2000;
  uint64_t seed = 1234;
  bool no_shuffle = false;
  bool checkpoint_activations = false;
};

// The signal that asked this process to stop (SIGTERM, SIGUSR1), or 0. Set by the handler; read
// at each optimizer-step boundary.
std::atomic<int> g_stop_signal{0};
void on_stop_signal(int sig) { g_stop_signal.store(sig); }

// With --save_dir, SIGTERM and SIGUSR1 (how Slurm and Kubernetes announce preemption) ask for a
// checkpoint at the next optimizer-step boundary instead of ending the process.
void catch_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGTERM, SIGUSR1}) ::sigaction(sig, &sa, nullptr);
}

// Whether any rank was asked to stop: one tiny all-reduce, so every rank saves at the same step.
bool any_rank_asked_to_stop(comm::Communicator& comm, const at::Device& device) {
  at::Tensor flag =
      at::full({1}, g_stop_signal.load() != 0 ? 1.0f : 0.0f, at::TensorOptions().device(device));
  comm.all_reduce(flag)->wait();
  return flag.item<float>() > 0;
}

std::string fmt_eta(double s) {
  int t = static_cast<int>(s + 0.5);
  return t >= 60 ? fmt::format("{}m{:02d}s", t / 60, t % 60) : fmt::format("{}s", t);
}

void add_options(CLI::App& app, TrainArgs& a) {
  app.add_option("--config", a.config, "DeepSpeed JSON config (file or JSON text)")->required();
  app.add_option("--n_layer", a.n_layer, "transformer blocks")->capture_default_str();
  app.add_option("--n_head", a.n_head, "attention heads")->capture_default_str();
  app.add_option("--n_embd", a.n_embd, "embedding width")->capture_default_str();
  app.add_option("--block_size", a.block_size,
                 "sequence length T (default: the task's, or 64 for --data)");
  app.add_option("--vocab_size", a.vocab_size, "vocabulary (default: the data's)");
  app.add_option("--data", a.data,
                 "FILE.txt (bytes) or FILE.bin (uint16 tokens); none: built-in task");
  app.add_option("--steps", a.steps,
                 "optimizer steps (0 with --save_final: write the initial weights)")
      ->capture_default_str();
  app.add_option("--seed", a.seed, "model init, data generation and shuffling")
      ->capture_default_str();
  app.add_flag("--no_shuffle", a.no_shuffle, "step s trains on samples (s*B + i) mod num_samples");
  app.add_flag("--checkpoint_activations", a.checkpoint_activations,
               "recompute each block in backward instead of keeping its activations");
  app.add_option("--init", a.init, "initial weights (safetensors, by parameter name)");
  app.add_option("--save_final", a.save_final,
                 "write the final weights as fp32 safetensors (rank 0)");
  app.add_option("--metrics", a.metrics, "JSON lines, one per optimizer step (rank 0)");
  app.add_option("--save_dir", a.save_dir,
                 "checkpoint folder: saved every --save_interval steps, at the end, and at the "
                 "next step after SIGTERM or SIGUSR1 (then the run exits 0)");
  app.add_option("--save_interval", a.save_interval,
                 "optimizer steps between checkpoints (0: none but the last)")
      ->capture_default_str();
  app.add_flag("--resume", a.resume,
               "continue from the checkpoint --save_dir/latest names, if there is one");
  app.add_option("--eval_problems", a.eval_problems,
                 "held-out problems for the built-in task's accuracy");
  app.add_option("--log_level", a.level, "debug|info|warning|error");
  app.add_option("--device", a.device, "cpu, or cuda (cuda:LOCAL_RANK), or cuda:N")
      ->capture_default_str();
}

void check_args(const TrainArgs& a) {
  DSCPP_CHECK(a.steps > 0 || (a.steps == 0 && !a.save_final.empty() && !a.resume), ConfigError,
              "--steps must be > 0 (0 only with --save_final and no --resume: it writes the "
              "initial weights, for another framework to start from)");
  DSCPP_CHECK(a.save_interval >= 0, ConfigError, "--save_interval must be >= 0");
  DSCPP_CHECK(!a.save_dir.empty() || (!a.resume && a.save_interval == 0), ConfigError,
              "--resume and --save_interval need --save_dir. HINT: --save_dir DIR");
}

// --device: cpu, cuda:N, or cuda (cuda:LOCAL_RANK modulo the GPUs this host has).
at::Device choose_device(const std::string& name) {
  at::Device device(name);
  DSCPP_CHECK(device.is_cpu() || (device.is_cuda() && at::hasCUDA()), ConfigError, "--device ",
              name, " is not available in this build or on this host. HINT: --device cpu");
  if (device.is_cuda() && !device.has_index()) {
    // One GPU per local rank (the launcher sets LOCAL_RANK and, with --include, the visible
    // devices).
    const int gpus = static_cast<int>(torch::cuda::device_count());
    device = at::Device(at::kCUDA,
                        static_cast<c10::DeviceIndex>(detect_process_env().local_rank % gpus));
  }
  // DSCPP_GPU_MEMORY_LIMIT: a smaller GPU emulated (the pre-flight check's budget, and the
  // caching allocator's cap).
  if (device.is_cuda()) {
    if (const char* limit = std::getenv("DSCPP_GPU_MEMORY_LIMIT"); limit && *limit)
      offload::cap_gpu_memory(device, engine::available_gpu_memory(-1));
  }
  return device;
}

// The training data, opened first: it fixes the vocabulary and, for the built-in task, the block
// size (both written into `a` when not given).
struct TrainData {
  std::shared_ptr<data::TokenStream> stream;
  std::shared_ptr<data::ReverseTask> task;  // the built-in task; null with --data
};
TrainData open_data(TrainArgs& a) {
  std::shared_ptr<data::TokenStream> stream;
  std::shared_ptr<data::ReverseTask> task;
  if (a.data.empty()) {
    data::ReverseTaskOptions to;
    to.seed = a.seed;
    task = std::make_shared<data::ReverseTask>(to);
    stream = task;
    if (a.block_size == 0) a.block_size = task->block_size();
    DSCPP_CHECK(a.block_size == task->block_size(), ConfigError, "--block_size ", a.block_size,
                " does not fit the built-in task, whose problems are ", task->block_size(),
                " tokens long. HINT: leave --block_size out, or train on --data");
  } else {
    stream = data::open_token_file(a.data, a.vocab_size);
    if (a.block_size == 0) a.block_size = 64;
  }
  if (a.vocab_size == 0) a.vocab_size = stream->vocab_size();
  DSCPP_CHECK(a.vocab_size >= stream->vocab_size(), ConfigError, "--vocab_size ", a.vocab_size,
              " is smaller than the data's vocabulary ", stream->vocab_size());

  return {stream, task};
}

// The GPT on `device`, with --init's weights (below stage 3; stage 3 reads them after the engine
// is set up, zero::load_weights). `in`: the GPT's estimate input (engine::gpt_estimate_input).
models::GPT build_model(const TrainArgs& a, const models::GPTConfig& gc, const Config& config,
                        engine::EstimateInput in, const std::shared_ptr<comm::Communicator>& comm,
                        const at::Device& device) {
  // The pre-flight check (NOTE [pre-flight] in src/engine/estimate.h) before the model exists:
  // a GPT too large for this config fails here in a second, not after minutes of building it.
  engine::check_gpt_fits(std::move(in), config, std::max(1, detect_process_env().local_world_size),
                         offload::gpu_free_memory(device));
  // At ZeRO stage 3 the GPT is built already sharded (zero::Init): each block is sharded as soon
  // as it exists, so no rank ever holds the whole model.
  const bool stage3 = config.zero_optimization.stage == 3;
  models::GPT model(nullptr);
  {
    std::optional<zero::Init> sharded_build;
    if (stage3) sharded_build.emplace(comm, models::GPTImpl::zero_units(), config, device);
    model = models::GPT(gc, a.seed);
  }
  model->to(device);
  model->set_activation_checkpointing(a.checkpoint_activations);
  if (stage3) {
    DSCPP_LOG_INFO("built the GPT sharded (zero::Init): peak RSS so far {:.1f} MiB",
                   peak_rss_bytes() / kMiB);
  }
  // Below stage 3 only rank 0 reads --init (the file may exist on its host alone) and the engine
  // broadcasts rank 0's weights; at stage 3 every rank reads its own shards after set-up.
  if (!a.init.empty() && comm->rank() == 0 && !stage3) safetensors::load_into(*model, a.init);
  return model;
}

// NOTE [train progress]: with --save_dir, rank 0 records the last optimizer step it finished
// in DIR/train_progress (a plain overwrite, not durable: a hint, never loaded as state), so a
// resumed run can say how many steps since the checkpoint it trains again.
const char* const kProgressFile = "/train_progress";

void record_progress(const std::string& save_dir, int64_t step) {
  std::ofstream(save_dir + kProgressFile, std::ios::trunc) << step << "\n";
}

// ": steps S+1..P trained again (the run before reached P; restart R)", or "" when nothing was
// lost or nothing is known.
std::string steps_trained_again(const std::string& save_dir, int64_t resumed_at) {
  int64_t reached = -1;
  std::ifstream(save_dir + kProgressFile) >> reached;
  const char* restart = std::getenv("DSCPP_RESTART_COUNT");
  const std::string which =
      restart && std::string(restart) != "0" ? std::string("; restart ") + restart : "";
  if (reached <= resumed_at) return which;
  return fmt::format(
      "; steps {}..{} are trained again: {} step(s) since the checkpoint were lost "
      "(the run before reached step {}{})",
      resumed_at + 1, reached, reached - resumed_at, reached, which);
}

// --resume: the step the checkpoint in --save_dir continues from (0 when there is none yet),
// after checking it was trained on the same data in the same order. Rank 0 looks for
// DIR/latest and tells every rank, so all of them load or none.
int64_t resume(Engine& engine, const TrainArgs& a, const nlohmann::json& data_state,
               comm::Communicator& comm, const at::Device& device) {
  const int rank = comm.rank();
  bool have_checkpoint = false;
  if (!a.save_dir.empty()) {
    at::Tensor found =
        at::full({1}, rank == 0 && std::ifstream(a.save_dir + "/latest").good() ? 1.0f : 0.0f,
                 at::TensorOptions().device(device));
    comm.broadcast(found, 0)->wait();
    have_checkpoint = found.item<float>() > 0;
  }
  DSCPP_CHECK(a.resume || !have_checkpoint, ConfigError, "--save_dir ", a.save_dir,
              " already holds checkpoints of a run; saving into it would replace them step by "
              "step. HINT: pass --resume to continue that run, or choose another --save_dir");
  int64_t first_step = 0;
  if (a.resume) {
    if (have_checkpoint) {
      LoadResult got = engine.load_checkpoint(a.save_dir);
      const nlohmann::json saved = got.client_state.value("dscpp_train", nlohmann::json::object());
      for (const auto& [key, value] : data_state.items()) {
        DSCPP_CHECK(!saved.contains(key) || saved[key] == value, ConfigError, "--resume from ",
                    got.path, ": it was trained with ", key, " ",
                    saved.contains(key) ? saved[key].dump() : "", ", this run has ", value.dump(),
                    ", so the data would not continue where it stopped. HINT: resume with the "
                    "same data, seed, shuffling, block size and train_batch_size");
      }
      first_step = engine.global_steps();
      DSCPP_LOG_INFO("loaded the checkpoint: peak RSS so far {:.1f} MiB", peak_rss_bytes() / kMiB);
      if (rank == 0) {
        std::cout << fmt::format("resumed from {} at step {}{}", got.path, first_step,
                                 steps_trained_again(a.save_dir, first_step))
                  << std::endl;
      }
    } else if (rank == 0) {
      std::cout << fmt::format("--resume: no checkpoint in {} yet; starting from step 0",
                               a.save_dir)
                << std::endl;
    }
  }
  return first_step;
}

// --metrics on rank 0: a JSON line per optimizer step. A resumed run continues the metrics of the
// run it resumes, from the checkpoint's step: lines of steps after it (trained again now) are
// dropped.
std::ofstream open_metrics(const std::string& path, int64_t first_step) {
  std::ofstream metrics;
  if (path.empty()) return metrics;
  if (first_step > 0) {
    std::ifstream in(path);
    std::string line, kept;
    while (std::getline(in, line)) {
      try {
        if (nlohmann::json::parse(line).at("step").get<int64_t>() <= first_step)
          kept += line + "\n";
      } catch (const std::exception&) {
        // a torn last line of a killed run
      }
    }
    std::ofstream(path, std::ios::trunc) << kept;
  }
  metrics.open(path, first_step > 0 ? std::ios::app : std::ios::trunc);
  DSCPP_CHECK(metrics.good(), IoError, "cannot write --metrics file ", path);
  return metrics;
}

// One JSON line of --metrics, flushed: a stopped run loses no line.
void write_metrics(std::ofstream& metrics, const StepStats& st, int64_t block_size) {
  metrics << fmt::format(
                 "{{\"step\": {}, \"loss\": {:.9g}, \"lr\": {:.9g}, \"grad_norm\": {:.9g}, "
                 "\"samples_per_s\": {:.6g}, \"tokens_per_s\": {:.6g}, \"loss_scale\": {}, "
                 "\"skipped\": {}}}",
                 st.step, st.loss, st.lr, st.grad_norm, st.samples_per_s,
                 st.samples_per_s * block_size, st.loss_scale, st.skipped)
          << std::endl;
}

// A stop signal reached some rank: the checkpoint just saved, and how to continue.
void say_stopped(const TrainArgs& a, int64_t step) {
  const int sig = g_stop_signal.load();
  std::cout << fmt::format(
                   "stop requested ({}): saved checkpoint {}/global_step{} after "
                   "step {} of {}; exiting 0. Continue with --resume",
                   sig == SIGTERM   ? "SIGTERM"
                   : sig == SIGUSR1 ? "SIGUSR1"
                                    : "on another rank",
                   a.save_dir, step, step, a.steps)
            << std::endl;
}

// The wall clock of the training loop.
struct Timing {
  Clock::time_point start, steady_start, end;
  int64_t warmup_steps = 0;  // excluded from the steady-state throughput
};

// After training: memory, fp16's skipped steps, throughput and train time.
void report(Engine& engine, const TrainArgs& a, const models::GPTConfig& gc, int rank,
            int64_t first_step, const Timing& t) {
  const double steady_s = std::chrono::duration<double>(t.end - t.steady_start).count();
  const int64_t warmup_steps = t.warmup_steps;
  const auto start = t.start, end = t.end;
  const MemoryStats mem = engine.memory_stats();
  std::cout << fmt::format(
                   "rank {}: peak RSS {:.1f} MiB; model states {:.2f} MiB (params {:.2f}, "
                   "grads {:.2f}, fp32 master {:.2f}, optimizer {:.2f}), gradient staging "
                   "{:.2f} MiB; {} parameters",
                   rank, peak_rss_bytes() / kMiB, mem.model_states() / kMiB, mem.params / kMiB,
                   mem.grads / kMiB, mem.master / kMiB, mem.optimizer_state / kMiB,
                   mem.staging / kMiB, gc.num_parameters())
            << (mem.offload_buffers > 0
                    ? fmt::format("; offloaded to disk through {:.2f} MiB of swap buffers",
                                  mem.offload_buffers / kMiB)
                    : std::string())
            << std::endl;
  if (engine.skipped_steps() > 0 && rank == 0) {
    std::cout << fmt::format(
                     "fp16: {} of {} steps skipped for gradient overflow; final loss scale {}",
                     engine.skipped_steps(), a.steps, engine.loss_scale())
              << std::endl;
  }
  if (rank == 0 && a.steps == 0) {
    std::cout << fmt::format("--steps 0: nothing trained; the initial weights go to {}",
                             a.save_final)
              << std::endl;
  } else if (rank == 0 && first_step >= a.steps) {
    std::cout << fmt::format("nothing left to train: the checkpoint is at step {} of --steps {}",
                             first_step, a.steps)
              << std::endl;
  } else if (rank == 0) {
    std::cout << fmt::format(
                     "throughput: {:.1f} tokens/s over steps {}..{} (after {} warm-up steps)",
                     (a.steps - first_step - warmup_steps) * engine.train_batch_size() *
                         a.block_size / steady_s,
                     first_step + warmup_steps + 1, a.steps, warmup_steps)
              << std::endl;
    // The training loop's wall time, warm-up included (what a user's epoch costs).
    std::cout << fmt::format("train time: {:.2f} s for {} samples ({} steps)",
                             std::chrono::duration<double>(end - start).count(),
                             (a.steps - first_step) * engine.train_batch_size(),
                             a.steps - first_step)
              << std::endl;
  }
  if (mem.gathered > 0) {
    std::cout << fmt::format(
                     "rank {}: ZeRO stage 3 held at most {:.2f} MiB of gathered unit "
                     "parameters at once",
                     rank, mem.gathered / kMiB)
              << std::endl;
  }
}

// The held-out accuracy of the built-in task, and --save_final.
void evaluate_and_save(models::GPT& model, const TrainArgs& a, const models::GPTConfig& gc,
                       const TrainData& d, int rank) {
  const auto& task = d.task;
  if (!(task && a.eval_problems > 0) && a.save_final.empty()) return;
  // Every rank's parameters whole for the evaluation and the save (at ZeRO stage 3 a collective
  // that gathers every unit, so only when asked for: a model trained because it does not fit
  // would not fit gathered; below stage 3 nothing happens).
  zero::GatheredParameters whole(*model);
  if (rank == 0 && task) {
    auto held_out = data::ReverseTask(task->options().held_out_set(a.eval_problems));
    auto acc = data::accuracy(*model, held_out, a.eval_problems);
    std::cout << fmt::format(
                     "held-out accuracy: {:.2f}% of answer tokens, {:.2f}% of whole "
                     "answers ({} problems)",
                     100 * acc.token_accuracy, 100 * acc.sequence_accuracy, acc.problems)
              << std::endl;
  }
  if (rank == 0 && !a.save_final.empty()) safetensors::save(*model, a.save_final, gc.to_metadata());
}

}  // namespace

int train_main(int argc, char** argv) {
  CLI::App app{"dscpp train: train the built-in GPT with a DeepSpeed config"};
  TrainArgs a;
  add_options(app, a);
  CLI11_PARSE(app, argc, argv);
  if (!a.level.empty()) set_log_level(parse_log_level(a.level));
  check_args(a);
  Config config = Config::parse(a.config);
  const at::Device device = choose_device(a.device);
  // The engine's decisions on the config first (initialize() repeats them and logs their
  // warnings): a refused setting stops the job here, as `dscpp check` stops it, before the
  // rendezvous, the data and the model.
  {
    engine::SupportContext support;
    support.model_on_device = !device.is_cpu();
    support.device = device.str();
    engine::check_supported(config, support);
  }
  // On the CPU "auto" means Gloo even on a host with CUDA.
  auto comm_options = comm::CommOptions::from_config(&config);
  if (comm_options.backend == "auto") comm_options.backend = device.is_cpu() ? "gloo" : "nccl";
  auto comm = comm::init_from_env(comm_options);
  const int rank = comm->rank();

  const TrainData d = open_data(a);
  // Enough data for one optimizer step, before the model is built (the loader says it again
  // with the engine's batch).
  {
    const engine::ConfiguredBatch b = engine::configured_batch(config, comm->world_size());
    data::Dataset(d.stream, a.block_size).check_holds_one_step(b.micro * b.gas * comm->world_size());
  }
  models::GPTConfig gc;
  gc.vocab_size = a.vocab_size;
  gc.block_size = a.block_size;
  gc.n_layer = a.n_layer;
  gc.n_head = a.n_head;
  gc.n_embd = a.n_embd;
  const engine::EstimateInput estimate_in = engine::gpt_estimate_input(
      gc, config, comm->world_size(), !device.is_cpu(), a.checkpoint_activations);
  models::GPT model = build_model(a, gc, config, estimate_in, comm, device);

  InitOptions io;
  io.comm = comm;
  io.zero_units = models::GPTImpl::zero_units();  // stage 3's units (ignored below)
  // The GPT's activations, so that the engine's own pre-flight check counts them too.
  io.activation_bytes = estimate_in.activations;
  // One progress line per print interval (below); the engine's resolved config and step line are
  // for debugging, or when the config asks for wall_clock_breakdown, which only that line shows.
  io.detail_log_level = config.wall_clock_breakdown ? LogLevel::info : LogLevel::debug;
  io.config_log_level = io.detail_log_level;
  Engine engine(model.ptr(), config, io);
  engine.set_tokens_per_sample(a.block_size);
  if (!a.init.empty() && config.zero_optimization.stage == 3) zero::load_weights(*model, a.init);
  data::BatchLayout layout{engine.train_batch_size(), engine.train_micro_batch_size_per_gpu(),
                           engine.world_size(), engine.gradient_accumulation_steps()};
  data::Loader loader(data::Dataset(d.stream, a.block_size), layout, !a.no_shuffle, a.seed);
  if (rank == 0) {
    DSCPP_LOG_INFO("training GPT ({} parameters; {}) on {} ({} samples of {} tokens) for {} steps",
                   gc.num_parameters(), gc.to_string(), d.stream->name(),
                   loader.dataset().num_samples(), a.block_size, a.steps);
  }

  // The data position is the optimizer step (NOTE [batch split]), which the checkpoint restores;
  // it also records what fixes the order, so a resume on other data is refused.
  const nlohmann::json data_state = {{"data", a.data.empty() ? "built-in task" : a.data},
                                     {"seed", a.seed},
                                     {"shuffle", !a.no_shuffle},
                                     {"train_batch_size", engine.train_batch_size()},
                                     {"block_size", a.block_size}};
  const int64_t first_step = resume(engine, a, data_state, *comm, device);
  if (!a.save_dir.empty()) catch_stop_signals();
  auto save = [&] { engine.save_checkpoint(a.save_dir, "", {{"dscpp_train", data_state}}); };
  std::ofstream metrics = rank == 0 ? open_metrics(a.metrics, first_step) : std::ofstream();

  Timing t;
  t.start = t.steady_start = Clock::now();
  // Steady-state throughput excludes the first steps (allocator and thread warm-up).
  t.warmup_steps = std::max<int64_t>(0, std::min<int64_t>(5, a.steps - first_step - 1));
  for (int64_t s = first_step; s < a.steps; ++s) {
    for (int64_t k = 0; k < engine.gradient_accumulation_steps(); ++k) {
      data::Batch b = loader.micro_batch(s, rank, k);
      at::Tensor loss;
      {
        auto autocast = engine.autocast();  // torch_autocast's scope (NOTE [autocast])
        loss = model->loss(b.inputs.to(device), b.targets.to(device));
      }
      engine.backward(loss);
      engine.step();
    }
    if (s + 1 - first_step == t.warmup_steps) t.steady_start = Clock::now();
    const StepStats& st = engine.last_step();
    if (metrics.is_open()) write_metrics(metrics, st, a.block_size);
    if (!a.save_dir.empty()) {
      if (rank == 0) record_progress(a.save_dir, s + 1);
      if (any_rank_asked_to_stop(*comm, device)) {
        save();
        engine.wait_for_checkpoint();  // checkpoint.writer.decoupled: published before exit
        if (rank == 0) say_stopped(a, s + 1);
        comm->barrier()->wait();
        return 0;
      }
      if ((a.save_interval > 0 && (s + 1) % a.save_interval == 0) || s + 1 == a.steps) save();
    }
    // The progress line every steps_per_print steps (DeepSpeed's key for its own step line; 10
    // when the config leaves it unset) and at the last step.
    const int64_t every = config.steps_per_print.value_or(10);
    if (rank != 0 || ((s + 1) % every != 0 && s + 1 != a.steps)) continue;
    const double elapsed = std::chrono::duration<double>(Clock::now() - t.start).count();
    const int64_t done = s + 1 - first_step;  // steps this run
    const double tok_s = done * engine.train_batch_size() * a.block_size / elapsed;
    std::cout << fmt::format(
                     "step {:>{}}/{} | loss {:.4f} | lr {:.3e} | {:.0f} tokens/s | ETA {} | "
                     "peak RSS {:.0f} MiB{}",
                     s + 1, std::to_string(a.steps).size(), a.steps, st.loss, st.lr, tok_s,
                     fmt_eta(elapsed / done * (a.steps - s - 1)), peak_rss_bytes() / kMiB,
                     st.skipped ? " | fp16 overflow: step skipped" : "")
              << std::endl;
  }
  t.end = Clock::now();
  // Training is over: the last checkpoint is published (checkpoint.writer.decoupled writes it in
  // the background), then a stop signal ends the process again, as without --save_dir.
  if (!a.save_dir.empty()) {
    engine.wait_for_checkpoint();
    for (int sig : {SIGTERM, SIGUSR1}) ::signal(sig, SIG_DFL);
  }
  report(engine, a, gc, rank, first_step, t);
  evaluate_and_save(model, a, gc, d, rank);
  comm->barrier()->wait();
  return 0;
}

}  // namespace dscpp::tools
