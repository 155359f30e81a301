// The training engine: what a C++ program gets from dscpp::initialize(). It owns the data-parallel
// gradient path (gradients averaged over ranks in buckets while backward runs: at
// gradient-accumulation boundaries at ZeRO stages 0-1, in every backward into a gradient shard
// at stage 2), the optimizer (on this rank's shard at stages 1-2) and LR schedule built from
// the DeepSpeed config, mixed precision (bf16, fp16 with loss scaling, fp32 master weights),
// gradient clipping, and step logging. docs/engine.md and docs/zero.md describe each part.
//
//   auto model = std::make_shared<MyNet>();
//   auto engine = dscpp::initialize(model, "ds_config.json");
//   for (auto& batch : loader) {
//     auto loss = model->forward(batch);   // the mean loss of this micro-batch
//     engine->backward(loss);
//     engine->step();                      // applies the update only at the GAS boundary
//   }
//
// Threading: call the engine from one thread (the training loop). Collectives run on the
// communicator's own thread, overlapped with backward.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dscpp/comm.h"
#include "dscpp/config.h"
#include "dscpp/log.h"
#include "dscpp/zero.h"

namespace dscpp {

namespace engine {
class EngineImpl;
}
namespace io {
class FileSystem;  // include/dscpp/file_system.h
class AsyncIo;     // include/dscpp/async_io.h
}  // namespace io
namespace precision {
class AutocastScope;
}
namespace offload {
class DeviceLink;  // include/dscpp/device_link.h
}  // namespace offload

struct InitOptions {
  // The communicator; null: dscpp::comm::init_from_env() with the config's comms_logger.
  std::shared_ptr<comm::Communicator> comm;
  // A client optimizer instead of the config's `optimizer` section (DeepSpeed's "client
  // optimizer"). With ZeRO it needs zero_allow_untested_optimizer. Its parameters must be the
  // model's parameters.
  std::shared_ptr<torch::optim::Optimizer> optimizer;
  // A client LR scheduler instead of the config's `scheduler` section; stepped after each
  // applied optimizer step.
  std::shared_ptr<torch::optim::LRScheduler> lr_scheduler;
  // ZeRO stage 3: which submodules are units (include/dscpp/zero.h), with the config's
  // zero_optimization.leaf_module and DSCPP_ZERO_UNIT's types added; none: the whole model is one
  // unit. Every pattern must match a module. Ignored below stage 3.
  zero::UnitPolicy zero_units;
  // The file system save_checkpoint / load_checkpoint go through (tests inject faults); null:
  // the POSIX one. Not owned; must outlive the engine.
  io::FileSystem* file_system = nullptr;
  // The asynchronous direct I/O the offload swap files go through (tests inject faults); null:
  // io_uring (or its thread-pool fallback) with the config's aio settings. Not owned; must
  // outlive the engine.
  io::AsyncIo* async_io = nullptr;
  // The copies between the model's device and host memory that offload to CPU memory goes
  // through (offload_optimizer.device "cpu"); null: a copy stream each way for a model on a GPU,
  // none for a model on the CPU (whose state is in host memory already: nothing moves). The tests
  // pass a stand-in that makes the CPU act as a device. Not owned; must outlive the engine.
  offload::DeviceLink* device_link = nullptr;
  // The level of rank 0's step line, logged every steps_per_print steps (step, loss, lr,
  // grad_norm, throughput, memory; with wall_clock_breakdown where the time went). `dscpp train`
  // passes debug (unless the config asks for wall_clock_breakdown) and prints its own progress
  // line.
  LogLevel detail_log_level = LogLevel::info;
  // The level of rank 0's dump of the resolved config at set-up (every value in force, ~55
  // lines): debug, so a failing job's last lines are its error, not the config; info (or
  // DSCPP_LOG_LEVEL=debug) shows it.
  LogLevel config_log_level = LogLevel::debug;
  // The bytes one micro-batch's forward and backward keep for activations on a rank, when you
  // know them (e.g. from a measured peak): the pre-flight memory check (NOTE [pre-flight]) counts
  // them. -1 (the default): unknown; the check counts none and its refusal says so.
  int64_t activation_bytes = -1;
};

// DeepSpeed's load_checkpoint options (docs/checkpoint.md).
struct LoadOptions {
  // Restore the optimizer state (Adam's moments, ...). false: the engine keeps the state it has
  // (a freshly built engine: its optimizer's initial state), as DeepSpeed does; the fp32 values
  // are loaded either way.
  bool load_optimizer_states = true;
  // Restore the LR schedule's position. false: the schedule starts over.
  bool load_lr_scheduler_states = true;
  // Only the model's values: no optimizer state, schedule, loss scaler, counters or RNG.
  bool load_module_only = false;
  // Every trainable parameter, frozen parameter and buffer must be in the checkpoint and every
  // one of the checkpoint's in the model (all differences listed at once). false: parameters
  // the checkpoint lacks keep their values and its extra ones are ignored. A shape mismatch is
  // an error either way.
  bool load_module_strict = true;
};

// What load_checkpoint() returns: the folder it loaded (DIR/TAG) and the client_state given to
// that save_checkpoint().
struct LoadResult {
  std::string path;
  nlohmann::json client_state = nlohmann::json::object();
};

// What happened at the last applied optimizer step (the GAS boundary).
struct StepStats {
  int64_t step = 0;      // global_steps() after the step
  double loss = 0;       // mean of the micro-batch losses over the global batch
  double lr = 0;         // the learning rate the step used
  double grad_norm = 0;  // global L2 norm of the averaged gradient, before clipping
  double samples_per_s = 0;
  double seconds = 0;     // wall time of this optimizer step's window (all its micro-steps)
  double loss_scale = 1;  // fp16: the loss scale the window's backward passes used
  bool skipped = false;   // fp16: the gradients overflowed and the update was skipped
};

// The engine's own accounting of what it holds on this rank, in bytes (ZeRO's model states and
// the communication buffers beside them). See docs/zero.md for the formulas.
struct MemoryStats {
  int64_t params = 0;           // the model's parameters in the training dtype (flat buffer)
  // Gradients held between steps (full buffer, or stages 2-3's shard; 0 when the shard is on disk
  // with both offloads on nvme).
  int64_t grads = 0;
  int64_t master = 0;           // fp32 master weights (mixed precision; fp32: the params are)
  int64_t optimizer_state = 0;  // this rank's optimizer state
  int64_t staging = 0;          // stages 2-3's gradient staging buffers (contiguous_gradients)
  // Stage 3: the most bytes of gathered unit parameters held at once so far (live units, and
  // with zero_hpz_partition_size the secondary shards), beyond the model states.
  int64_t gathered = 0;
  // offload_optimizer nvme: the aligned buffers the swap pipeline cycles through (the master
  // weights and optimizer state themselves are on disk, so master and optimizer_state are 0).
  // offload_optimizer cpu of a model on a device: the host buffers the gradients come down to and
  // the parameters go up from. Both offloads on nvme: also the gradient shard's blocks being
  // written and the step's two read buffers.
  int64_t offload_buffers = 0;
  // Bytes in host memory while the model is on a device (offload to "cpu"): the optimizer's
  // (master, optimizer_state and its copy buffers, counted above too) and stage 3's parameter
  // shards (offload_param cpu; not in params, which counts device memory); 0 for a model on the
  // CPU.
  int64_t host = 0;
  int64_t model_states() const { return params + grads + master + optimizer_state; }
};

class Engine {
 public:
  // Builds the engine: checks that the config asks for nothing dscpp would not honour, resolves
  // the batch sizes against the world size, lays the model's parameters out for the ZeRO stage,
  // makes every rank start from rank 0's weights, and builds the optimizer and LR schedule.
  // Throws ConfigError naming the key and what to do when the config or model cannot be used.
  Engine(std::shared_ptr<torch::nn::Module> model, Config config, InitOptions options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Backpropagates `loss` (the mean loss of this rank's micro-batch) scaled by 1/GAS. At a GAS
  // boundary the gradients are averaged over ranks, bucket by bucket, as backward produces
  // them, and this call returns once they all are. Throws on a non-finite loss only at the
  // boundary (see step()).
  void backward(const at::Tensor& loss);

  // Counts a micro-step; at a GAS boundary also: checks that no rank saw a non-finite loss or
  // gradient (else throws Error on every rank), clips by the global norm, runs the optimizer,
  // zeroes the gradients, ticks the LR schedule and logs every steps_per_print steps.
  void step();

  // At the end of an epoch whose micro-batches do not fill the last accumulation window:
  // averages what was accumulated over the micro-batches actually taken on all ranks (ranks may
  // have taken different numbers) and applies one optimizer step; no step when no rank took
  // any. A collective: every rank must call it at the same point. At ZeRO stage 2 every
  // backward is itself a collective, so there every rank must have taken the same number of
  // micro-steps (DSCPP_DEBUG_SYNC=1 names a mismatch at once instead of at the timeout).
  void flush_accumulation();

  // RAII scope in which backward() does not average gradients over ranks, even at a boundary
  // (DDP's no_sync). Calling step() at a boundary inside it is an error, as in DeepSpeed; a
  // boundary backward inside it followed by step() outside averages at the step. Refused at
  // ZeRO stage 2, whose gradients are partitioned as backward runs (DeepSpeed's rule).
  class NoSync {
   public:
    explicit NoSync(Engine& e);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    Engine& engine_;
  };
  NoSync no_sync() { return NoSync(*this); }

  // RAII scope to run the model's forward in (DeepSpeed's engine runs its own forward in one).
  // With torch_autocast enabled it turns on libtorch's autocast for the model's device in the
  // configured dtype (NOTE [autocast] in src/precision/autocast.h), and backward() refuses a loss
  // whose micro-step opened none; disabled, autocast is off inside (a program's own autocast
  // around it is switched off, with one warning, as DeepSpeed does). Call backward() after the
  // scope ends:
  //     at::Tensor loss;
  //     { auto autocast = engine->autocast(); loss = model->forward(batch); }
  //     engine->backward(loss);
  class Autocast {
   public:
    explicit Autocast(Engine& e);
    ~Autocast();
    Autocast(const Autocast&) = delete;
    Autocast& operator=(const Autocast&) = delete;

   private:
    std::unique_ptr<precision::AutocastScope> scope_;
  };
  Autocast autocast() { return Autocast(*this); }

  // Saves a checkpoint (docs/checkpoint.md) under DIR/TAG (empty tag: "global_step<N>") and
  // then points DIR/latest at it; a collective, on every rank between optimizer steps (not in
  // the middle of a gradient-accumulation window: refused). Every rank writes its slice of the
  // fp32 values and optimizer state in parallel; rank 0 writes the manifest last, once every
  // rank's file is durable. `client_state` (a JSON object) comes back from load_checkpoint().
  // Throws CheckpointError or IoError naming the path on every rank when any rank fails;
  // `latest` then still names the previous complete checkpoint. Returns DIR/TAG.
  // With checkpoint.writer.decoupled the files are written in the background: the call returns
  // once the write has started, and DIR/latest moves to DIR/TAG at the end of the first
  // optimizer step by which every rank's file is durable (step() then throws a failed write's
  // error, after the step itself is done). A save while another is in flight waits for it first.
  std::string save_checkpoint(const std::string& dir, const std::string& tag = "",
                              const nlohmann::json& client_state = nlohmann::json::object());
  // checkpoint.writer.decoupled: waits for the save in flight and publishes it (a collective).
  // Returns its DIR/TAG, or "" when none is in flight. The destructor does the same, so a program
  // that ends normally never leaves a checkpoint half-published; call this first to see errors.
  std::string wait_for_checkpoint();
  // Loads the checkpoint DIR/TAG (empty tag: the one DIR/latest names), saved at any world
  // size and ZeRO stage: each rank reads only the byte ranges it now holds. A collective. Every
  // file's size and CRC-32C are checked first; a damaged, torn or mismatched checkpoint is a
  // CheckpointError naming the path and every problem, with nothing loaded, and never a
  // fallback to another tag.
  LoadResult load_checkpoint(const std::string& dir, const std::string& tag = "",
                             const LoadOptions& options = {});

  // Bytes this rank holds for the model states (see MemoryStats).
  MemoryStats memory_stats();
  // fp16: optimizer steps skipped because the gradients overflowed.
  int64_t skipped_steps() const;
  // fp16: the loss scale in force (1 without fp16).
  double loss_scale() const;

  // True when the next backward()/step() completes an accumulation window.
  bool is_gradient_accumulation_boundary() const;
  int64_t global_steps() const;
  int64_t micro_steps() const;
  int64_t global_samples() const;
  double get_lr() const;
  int train_batch_size() const;
  int train_micro_batch_size_per_gpu() const;
  int gradient_accumulation_steps() const;
  const StepStats& last_step() const;
  const Config& config() const;
  comm::Communicator& communicator();
  int rank() const;
  int world_size() const;
  torch::nn::Module& module();
  // The dtype the model computes in: bf16 or fp16 when the config enables them (the engine cast
  // the model's floating parameters and buffers), else fp32.
  at::ScalarType dtype() const;
  // A model input as the model now computes: a floating tensor cast to dtype() and moved to the
  // model's device, any other (token ids, masks) moved only. Inputs a program builds in fp32 must
  // go through this (or a cast of its own) under bf16 / fp16: libtorch does not cast them.
  at::Tensor cast_input(const at::Tensor& x) const;

  // Tokens per sample, so the step log can show tokens/s (0: not shown).
  void set_tokens_per_sample(int64_t tokens);

 private:
  std::unique_ptr<engine::EngineImpl> impl_;
};

// Parses the config (file path or JSON text), joins the job and builds the engine.
std::shared_ptr<Engine> initialize(std::shared_ptr<torch::nn::Module> model,
                                   const std::string& config_path_or_json,
                                   InitOptions options = {});

// What initialize() would refuse for this model and config in a job of `world` ranks
// (`local_ranks` of them on this host, sharing its memory; 0: the launcher's LOCAL_WORLD_SIZE, 1
// without a launcher), decided here without
// joining a job or building anything: the config's settings and batch, the model's (trainable
// parameters fp32 on one device, stage 3's units, torch_autocast's safe modules,
// offload_param.buffer_size against the largest shard on disk) and the pre-flight memory check
// (NOTE [pre-flight] in src/engine/estimate.h) against this host. world 0: this process's job
// as the launcher describes it (detect_process_env(): WORLD_SIZE and LOCAL_WORLD_SIZE, 1 and 1
// without a launcher); zero_hpz_partition_size is judged with every host running local_ranks.
// `options` as initialize() would get them (a client optimizer, zero_units,
// device_link, activation_bytes; the communicator and file systems are not used). Throws the
// ConfigError initialize() would throw, with its text (a batch error names dscpp::check() as where
// the world size came from); returns every warning it would log (the
// parser logs its own as it reads the config, as it does for initialize()). A model built for
// its shapes only (zero::ShapesOnly) is judged as the model it describes.
std::vector<std::string> check(std::shared_ptr<torch::nn::Module> model,
                               const std::string& config_path_or_json, int world = 0,
                               const InitOptions& options = {}, int local_ranks = 0);

}  // namespace dscpp
