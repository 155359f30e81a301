// EngineImpl: the state behind dscpp::Engine and the order of events of a training step.
//   setup.cpp   the constructor's steps, in order (check_supported, resolve the batch, lay out
//               the parameters for the ZeRO stage, start every rank from rank 0's weights, build
//               the optimizer and LR schedule)
//   step.cpp    backward(), step(), flush_accumulation(): the step's order of events
//   checkpoint.cpp  save_checkpoint(), load_checkpoint() (docs/checkpoint.md)
//   every_rank.cpp  on_every_rank(): a step whose failure on any rank every rank learns
// The ZeRO stage itself is a zero::Strategy (src/zero/strategy.h); where the part's fp32 values
// live is a precision::PartStore (src/precision/part_store.h), the loss scaler in src/precision/.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>

#include "checkpoint/live_snapshot.h"
#include "checkpoint/manifest.h"
#include "dscpp/async_io.h"
#include "dscpp/engine.h"
#include "dscpp/lr_schedule.h"
#include "dscpp/optim.h"
#include "dscpp/safetensors.h"
#include "monitor/monitor.h"
#include "precision/autocast.h"
#include "precision/loss_scaler.h"
#include "precision/part_store.h"
#include "profiling/flops_profiler.h"
#include "profiling/op_times.h"
#include "zero/muon_matrices.h"
#include "zero/strategy.h"

namespace dscpp::offload {
class DeviceLink;
class GradSwapper;
class ParamSwapper;
}

namespace dscpp::engine {

// Zeros [n] as doubles on `device`: small values travel between ranks so (every communicator
// moves doubles, and integers below 2^53 such as byte counts, CRCs and characters are exact).
at::Tensor rank_values(int64_t n, const at::Device& device);

class EngineImpl {
 public:
  EngineImpl(std::shared_ptr<torch::nn::Module> model, Config config, InitOptions options);
  ~EngineImpl();

  void backward(const at::Tensor& loss);
  void step();
  void flush_accumulation();
  void enter_no_sync();
  void leave_no_sync() { --no_sync_depth_; }
  MemoryStats memory_stats();
  std::string save_checkpoint(const std::string& dir, const std::string& tag,
                              const nlohmann::json& client_state);
  LoadResult load_checkpoint(const std::string& dir, const std::string& tag,
                             const LoadOptions& options);
  std::string wait_for_checkpoint();
  bool is_gradient_accumulation_boundary() const;
  double get_lr() const;
  double loss_scale() const { return scaler_ ? scaler_->scale() : 1.0; }
  int gradient_accumulation_steps() const { return config_.batch.gradient_accumulation_steps; }
  int train_batch_size() const { return config_.batch.train_batch_size; }
  at::ScalarType dtype() const { return dtype_; }
  at::Device device() const { return device_; }

  std::shared_ptr<torch::nn::Module> model_;
  Config config_;
  std::shared_ptr<comm::Communicator> comm_;
  int64_t micro_steps_ = 0;
  int64_t global_steps_ = 0;
  int64_t skipped_steps_ = 0;
  int64_t global_samples_ = 0;
  int64_t tokens_per_sample_ = 0;
  StepStats last_step_;
  // torch_autocast (NOTE [autocast] in src/precision/autocast.h): what Engine::autocast() puts in
  // force (unset: torch_autocast disabled), the scopes opened since the last backward, and
  // whether the warning about a program's own autocast was given.
  std::optional<precision::AutocastState> autocast_;
  int64_t autocast_scopes_ = 0;
  bool warned_outer_autocast_ = false;

 private:
  // ----- set-up steps (setup.cpp), in the order the constructor runs them
  void resolve_batch();
  // Throws ConfigError on every rank when the ranks' models differ (parameter names, shapes,
  // dtypes, trainability): one small all-reduce, before any collective that would pair them up.
  void check_same_model_on_every_rank();
  void choose_precision();
  // The pre-flight check (NOTE [pre-flight]): throws ConfigError on every rank when the memory
  // this config asks for does not fit the memory (or swap disk) this host has left.
  void check_memory_fits();
  // Lays the trainable parameters out for the stage (the strategy), the part's fp32 values
  // handed to the store on the way.
  void build_strategy();
  // build_strategy's pieces: the strategy's bucket and reduction settings from the config
  // (buckets capped, NOTE [bucket cap]), and the "cpu" offload devices checked against the
  // model's device.
  zero::StrategyOptions strategy_options(const zero::FlatLayout& layout) const;
  void check_offload_devices();
  // zero_hpz_partition_size against the ranks the collectives put on one host: the secondary
  // partition's size (1: none). Refuses a size hpZ cannot use, saying why.
  int secondary_partition_size() const;
  // Every rank starts from rank 0's weights, frozen parameters and buffers.
  void broadcast_initial_state(bool trainable_broadcast_done);
  void cast_the_rest();
  // offload_optimizer nvme: this rank's swap file for a part of `part_numel` elements (its fp32
  // values when `with_values`, then the optimizer's states), checked on every rank.
  std::unique_ptr<offload::OptimizerSwapper> build_swapper(int64_t part_numel, bool with_values);
  // The config optimizer's states, each name with its starting value, in checkpoint order.
  std::vector<std::pair<std::string, float>> optimizer_state_starts() const;
  // offload_param nvme (stage 3): this rank's parameter swap file for shards of `numels`
  // elements, checked on every rank.
  std::unique_ptr<offload::ParamSwapper> build_param_swapper(const std::vector<int64_t>& numels,
                                                             at::ScalarType dtype);
  // Both offloads on nvme (stage 3, a model on the CPU): this rank's gradient shard of `numel`
  // elements on disk (NOTE [gradients on disk]), next to the optimizer's swap file, checked on
  // every rank.
  std::unique_ptr<offload::GradSwapper> build_grad_swapper(int64_t numel, at::ScalarType dtype);
  // Checks that the `key` folder `dir` can hold swap files (exists, is a folder; warns on tmpfs)
  // and makes the engine's AsyncIo if it has none.
  void prepare_swap_dir(const std::string& key, const std::string& dir);
  void build_optimizer();
  // tensorboard / csv_monitor: rank 0's writers, their folders made (every rank learns whether
  // that failed).
  void open_monitors();
  void dump_state() const;

  // ----- the step (step.cpp)
  // The gradients to step on (averaged over ranks), and the window's statistics over all ranks.
  struct Reduced {
    std::vector<zero::Part> parts;  // this rank's part, in the training dtype
    double loss_sum = 0, micro_batches = 0;
    double grad_sq_norm = 0;      // of the averaged gradient, summed over every rank's part
    std::string nonfinite_ranks;  // ranks that saw a non-finite loss, "0,2"
    std::string failed_ranks;     // ranks whose backward() threw before its gradients were done
  };
  // This rank's window flags for the statistics: 1 non-finite loss, 2 failed backward.
  int window_flags() const;
  // For a non-finite gradient norm: which ranks' own gradients were non-finite, and in which
  // parameter first (one small all-reduce, on every rank at once).
  std::string nonfinite_origin();
  Reduced reduce_window();
  // Sums this rank's window statistics (and `part_sq_norm`) over ranks into `r`.
  void reduce_stats(Reduced& r, double part_sq_norm);
  // fp16 overflow: drops the window, lowers the loss scale (or throws at the minimum).
  void skip_step(double loss, double lr);
  // The boundary's update: reduce, check, clip, optimizer, publish (see step()). On a
  // non-finite loss or gradient it drops the window's gradients and throws.
  void apply_step();
  // Runs the optimizer on this rank's part (the store's step, or the client optimizer), leaving
  // the training-dtype parameters updated.
  void run_optimizer(const Reduced& red, double unscale, double clip_coef, double lr);
  // run_optimizer; when files are involved (swap files), every rank learns whether it failed
  // anywhere before the parameters are published.
  void update_parameters(const Reduced& red, double unscale, double clip_coef, double lr);
  // Throws the error that stopped this engine, if one did.
  void check_usable() const;
  // Zeroes the gradients and resets the window's counters and timers.
  void abandon_window();
  // Writes this rank's window statistics where the gradient all-reduce sums them.
  void write_side_channel();
  void log_step();
  // Logs a detailed line at detail_log_level_.
  void log_detail(const std::string& text) const;
  // After every optimizer step, applied or skipped: last_step_ (and, with wall_clock_breakdown,
  // the window's timers) to the monitors (NOTE [monitor events]).
  void write_monitors();
  // flops_profiler, rank 0: starts profiling the window that begins when global_steps_ reaches
  // profile_step (DeepSpeed's moment), and at that window's end prints (or writes) the report.
  void start_profiler_if_due();
  void start_op_times();
  void finish_profiler();
  // A profiled window that failed: no report.
  void drop_profiler();

  // ----- checkpoints (checkpoint.cpp)
  // Throws CheckpointError unless the engine is between optimizer steps and its state is
  // dscpp's own (no client optimizer or LR scheduler); `what` names the call.
  void check_checkpointable(const char* what) const;
  // Rank 0's tag, and whether every rank gave the same one (checkpoint.tag_validation).
  std::string agree_on_tag(const std::string& tag);
  // What this rank's file holds: its slice of every group's fp32 values and optimizer states,
  // its RNG states, and on rank 0 the frozen parameters and buffers.
  // What the store keeps on disk (the swap file's fp32 values and optimizer states) is streamed
  // from it as the rank file is written. With `live` (a background save) the values and states
  // held in CPU memory are read from that memory as the file is written (LiveSnapshot); the
  // rest is copied now.
  std::vector<safetensors::StreamedTensor> checkpoint_tensors(checkpoint::LiveSnapshot* live);
  // The manifest of a save at this step (rank 0 writes it), but for the files' sizes and CRCs.
  checkpoint::Manifest describe_checkpoint(const std::string& tag,
                                           const nlohmann::json& client_state);
  // A save whose rank file is written, or being written (checkpoint.writer.decoupled), and not
  // yet published. NOTE [background save] in checkpoint.cpp.
  struct WrittenFile {
    safetensors::FileDigest digest;
    double seconds = 0;      // how long the write took
    double cpu_seconds = 0;  // of which the writing thread ran on a core (a background write
                             // takes these from training when every core trains)
  };
  struct PendingSave {
    std::string dir, folder;
    checkpoint::Manifest manifest;  // rank 0's
    std::unique_ptr<checkpoint::LiveSnapshot> live;
    std::future<WrittenFile> write;
    std::chrono::steady_clock::time_point started;
    double stall_s = 0;        // seconds training waited for this save so far
    int64_t copied_bytes = 0;  // copied before a step changed what was not written yet
    bool released = false;     // the write reads no live memory any more
  };
  // Steps 2-3 of a save once every rank's file is durable: the ranks agree on the files, rank 0
  // writes the manifest and points `latest` at the tag. Returns the folder.
  std::string publish_checkpoint(PendingSave& save, const WrittenFile& mine);
  // A background save: before the parameters or optimizer states change, what it has not
  // written yet is copied (a no-op once its write is done or it was copied).
  void release_live_state();
  // A background save: at an optimizer step's end, published when every rank's file is durable
  // (one small all-reduce per step while a write is in flight).
  void publish_written_checkpoint();
  // Waits for the write in flight on every rank and publishes it. Returns its folder.
  std::string finish_pending_save();
  // The engine's destructor: a save in flight is finished and published, or, when an exception
  // is unwinding, its write is waited for and left unpublished.
  void finish_pending_save_at_exit() noexcept;

  // load_checkpoint's steps, in order. 1-2 change nothing: the checkpoint found (rank 0
  // resolves the tag for all), its manifest read and checked against this model and optimizer
  // (check_checkpoint_fits), every file proven whole; then 3 this rank's state read from the
  // files that hold it, 4 the parameters cast from it, 5 the counters, schedule and loss scale.
  struct LoadSource {
    std::string dir, folder;  // the save directory, and the checkpoint's folder in it
    checkpoint::Manifest manifest;
  };
  LoadSource find_checkpoint(const std::string& dir, const std::string& tag,
                             const LoadOptions& opts);
  void check_checkpoint_fits(const LoadSource& src, const LoadOptions& opts);
  void check_whole(const LoadSource& src);
  uint64_t read_rank_state(const LoadSource& src, const LoadOptions& opts);  // bytes read
  void publish_loaded_values();
  void restore_counters(const checkpoint::Manifest& m, const LoadOptions& opts);

  // ----- agreement (every_rank.cpp)
  // Runs `fn` on this rank, then every rank learns whether it failed on any: the failing rank
  // rethrows its own error, the others throw CheckpointError (checkpoint_error) or Error naming
  // it. `what` says what failed.
  void on_every_rank(const std::string& what, const std::function<void()>& fn,
                     bool checkpoint_error = true);

  // The swap files' I/O (offload): declared before everything that holds a swap file open.
  std::unique_ptr<io::AsyncIo> own_async_io_;
  io::AsyncIo* async_io_ = nullptr;
  // The copies between the model's device and host memory (offload to CPU memory of a model on
  // a device); null when nothing is copied. Declared before the store that issues them.
  std::unique_ptr<offload::DeviceLink> own_device_link_;
  offload::DeviceLink* device_link_ = nullptr;
  // Where this rank's part of the fp32 values (and with offload the optimizer's states) lives.
  std::unique_ptr<precision::PartStore> store_;
  std::unique_ptr<zero::Strategy> strategy_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<LRSchedule> lr_schedule_;
  // Muon: which rank orthogonalises each matrix (NOTE [Muon across ranks]), and its Adam half's
  // LR schedule (DeepSpeed schedules each param group from its own lr); null otherwise.
  std::unique_ptr<zero::MuonMatrices> muon_matrices_;
  std::unique_ptr<LRSchedule> adam_lr_schedule_;
  std::shared_ptr<torch::optim::Optimizer> client_optimizer_;
  std::shared_ptr<torch::optim::LRScheduler> client_lr_scheduler_;
  zero::UnitPolicy zero_units_;
  io::FileSystem* file_system_ = nullptr;          // checkpoints' file access; null: POSIX
  at::Device device_ = at::kCPU;                   // the trainable parameters' device
  at::ScalarType dtype_ = at::kFloat;              // training dtype of parameters and gradients
  std::unique_ptr<precision::LossScaler> scaler_;  // fp16 only
  std::string store_report_;  // what the store's disk did in this window, for the step log
  // Set when a failure left the ranks' states apart (an offloaded step that failed on some
  // rank): every later call throws it.
  std::string broken_;

  int64_t window_micro_steps_ = 0;  // micro-steps backpropagated in the current window
  double window_loss_sum_ = 0;      // sum of this rank's micro-batch losses in the window
  int window_nonfinite_ = 0;        // of which non-finite
  bool window_failed_ = false;      // a backward threw before its gradients were complete
  bool window_reduced_ = false;     // the boundary backward averaged gradients over ranks
  int no_sync_depth_ = 0;
  std::chrono::steady_clock::time_point window_start_;
  // wall_clock_breakdown: seconds in the current window; the optimizer's time is the boundary's
  // reductions (reduce_window), the update, and the all-gather of the updated parameters.
  double t_backward_ = 0, t_reduce_wait_ = 0, t_optimizer_ = 0;
  double t_boundary_ = 0, t_gather_ = 0;
  zero::Strategy::FetchStats fetch_;  // stage 3: this window's parameter gathers
  // The level of the step line (InitOptions::detail_log_level) and of the resolved-config dump
  // (InitOptions::config_log_level).
  LogLevel detail_log_level_ = LogLevel::info;
  LogLevel config_log_level_ = LogLevel::debug;
  int64_t activation_bytes_ = -1;  // InitOptions::activation_bytes (-1: unknown)
  std::vector<std::unique_ptr<monitor::Writer>> monitors_;  // rank 0 only
  std::unique_ptr<profiling::FlopsProfiler> profiler_;      // rank 0, the profiled window only
  // wall_clock_breakdown on rank 0 of a CPU model: the op table of each step log line, over the
  // time since the previous one (NOTE [op times]).
  std::unique_ptr<profiling::OpTimes> op_times_;
  std::chrono::steady_clock::time_point op_times_since_;
  // A background save not yet published; last, so it goes before the state its write reads.
  std::optional<PendingSave> pending_save_;
};

}  // namespace dscpp::engine
