// The DeepSpeed JSON config as typed structs: Config::parse() reads a ds_config.json (or JSON
// text) strictly, with DeepSpeed's key names, defaults and meaning, and resolve_batch() settles
// the batch triangle against the data-parallel world size. Torch-free. See docs/config.md.
//
// NOTE [config field names]: every field is spelled exactly like its DeepSpeed JSON key, so a
// key from a user's config can be grepped straight into the code; a nested section is a nested
// struct with the section's key name (zero_optimization.offload_optimizer.pin_memory).
// Defaults are DeepSpeed's (deepspeed/runtime/constants.py, zero/config.py, ...).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

namespace dscpp {

// ---------------------------------------------------------------------------------------------
// optimizer: {"type": ..., "params": {...}}. Only the params struct of `type` is meaningful.

// params of "Adam" and "AdamW" (DeepSpeed's FusedAdam / DeepSpeedCPUAdam).
struct AdamParams {
  // Learning rate. Default 1e-3. >= 0.
  double lr = 1e-3;
  // Coefficients of the running averages of the gradient and its square. Default [0.9, 0.999].
  // Each in [0, 1).
  std::array<double, 2> betas = {0.9, 0.999};
  // Added to the denominator for numerical stability. Default 1e-8. >= 0.
  double eps = 1e-8;
  // Weight decay. Default 0. >= 0.
  double weight_decay = 0.0;
  // Divide the moments by (1 - beta^t). Default true.
  bool bias_correction = true;
  // Decoupled weight decay (AdamW) instead of L2 added to the gradient. DeepSpeed's default is
  // true even for type "Adam"; type "AdamW" always uses it (false is ignored with a warning).
  bool adam_w_mode = true;
  // The AMSGrad variant. Default false; true is an error (DeepSpeed's fused Adam rejects it).
  bool amsgrad = false;
  // DeepSpeed: use torch.optim.Adam instead of its fused kernel. Accepted for compatibility;
  // dscpp always runs its own kernel (same update). Default false.
  bool torch_adam = false;
};

// params of "SGD" (torch.optim.SGD).
struct SgdParams {
  // Learning rate. Default 1e-3 (torch 2.x). >= 0.
  double lr = 1e-3;
  // Momentum factor. Default 0. >= 0.
  double momentum = 0.0;
  // Dampening for momentum. Default 0.
  double dampening = 0.0;
  // L2 penalty. Default 0. >= 0.
  double weight_decay = 0.0;
  // Nesterov momentum; needs momentum > 0 and dampening 0. Default false.
  bool nesterov = false;
};

// params of "Adagrad" (torch.optim.Adagrad / DeepSpeedCPUAdagrad).
struct AdagradParams {
  // Learning rate. Default 1e-2. >= 0.
  double lr = 1e-2;
  // Learning-rate decay. Default 0. >= 0.
  double lr_decay = 0.0;
  // L2 penalty. Default 0. >= 0.
  double weight_decay = 0.0;
  // Initial value of the sum of squares. Default 0. >= 0.
  double initial_accumulator_value = 0.0;
  // Added to the denominator. Default 1e-10. >= 0.
  double eps = 1e-10;
};

// params of "Lamb" (DeepSpeed's FusedLamb).
struct LambParams {
  // Learning rate. Default 1e-3. >= 0.
  double lr = 1e-3;
  // Default true.
  bool bias_correction = true;
  // Default [0.9, 0.999]. Each in [0, 1).
  std::array<double, 2> betas = {0.9, 0.999};
  // Default 1e-8. >= 0.
  double eps = 1e-8;
  // Add eps inside the square root. Default false.
  bool eps_inside_sqrt = false;
  // Default 0. >= 0.
  double weight_decay = 0.0;
  // Global gradient-norm clip inside the optimizer; 0 disables. Default 0. >= 0.
  double max_grad_norm = 0.0;
  // Upper and lower bound of the trust ratio. Defaults 10.0 and 0.01.
  double max_coeff = 10.0;
  double min_coeff = 0.01;
  // Default false; true is an error (FusedLamb rejects it).
  bool amsgrad = false;
};

// params of "Lion" (DeepSpeed's FusedLion).
struct LionParams {
  // Learning rate. Default 1e-3. >= 0.
  double lr = 1e-3;
  // Default [0.9, 0.999]. Each in [0, 1).
  std::array<double, 2> betas = {0.9, 0.999};
  // Default 0. >= 0.
  double weight_decay = 0.0;
};

// params of "Muon" (DeepSpeed 0.17.6+'s MuonWithAuxAdam): momentum orthogonalised by
// Newton-Schulz for the weight matrices, Adam for every other parameter (which parameter goes
// where: docs/optim.md). Keys and defaults are DeepSpeed's; each half also has its own LR
// schedule, as DeepSpeed schedules each param group from its own lr.
struct MuonParams {
  // The learning rate both halves share unless muon_lr / adam_lr is set. Unset: the Muon half
  // 0.02, the Adam half 3e-4 (MuonWithAuxAdam's defaults). >= 0.
  std::optional<double> lr;
  // The Muon half's learning rate, overriding lr. >= 0.
  std::optional<double> muon_lr;
  // The Adam half's learning rate, overriding lr. >= 0.
  std::optional<double> adam_lr;
  // The Muon half's momentum (nesterov). Default 0.95. In [0, 1).
  double momentum = 0.95;
  // Decoupled weight decay of both halves. Default 0. >= 0.
  double weight_decay = 0.0;
  // The Adam half's betas. Default [0.9, 0.95]. Each in [0, 1).
  std::array<double, 2> betas = {0.9, 0.95};
  // The Adam half's eps. Default 1e-10. >= 0.
  double eps = 1e-10;
  // The Newton-Schulz iteration: "gram" (default; iterates on the smaller Gram matrix of a
  // rectangular one) or "standard".
  std::string ns_method = "gram";
  // The Adam half's weight decay decoupled (AdamW, default) or added to the gradient (L2).
  bool adam_w_mode = true;

  double muon_lr_or_default() const { return muon_lr ? *muon_lr : lr ? *lr : 0.02; }
  double adam_lr_or_default() const { return adam_lr ? *adam_lr : lr ? *lr : 3e-4; }
};

struct OptimizerConfig {
  // Canonical name: "Adam", "AdamW", "SGD", "Adagrad", "Lamb", "Lion" or "Muon"; matched
  // case-insensitively in the JSON. Empty: no "optimizer" section (the program brings one).
  // Required when the section is present; "auto" is an error (it has no default).
  std::string type;
  AdamParams adam;  // type "Adam" or "AdamW"
  SgdParams sgd;
  AdagradParams adagrad;
  LambParams lamb;
  LionParams lion;
  MuonParams muon;
};

// ---------------------------------------------------------------------------------------------
// scheduler: {"type": ..., "params": {...}} (deepspeed/runtime/lr_schedules.py). Only the
// params struct of `type` is meaningful. Steps count optimizer steps (GAS boundaries).

// warmup_type values: "log" (default) or "linear".
struct WarmupLRParams {
  // LR at step 0. Default 0. >= 0.
  double warmup_min_lr = 0.0;
  // LR reached after warmup. Unset (default): the optimizer's lr (DeepSpeed >= 0.10; older
  // versions defaulted to 0.001). >= warmup_min_lr when set.
  std::optional<double> warmup_max_lr;
  // Steps from warmup_min_lr to warmup_max_lr. Default 1000. >= 0 (DeepSpeed uses max(2, n)).
  int64_t warmup_num_steps = 1000;
  // Shape of the warmup curve: "log" or "linear". Default "log".
  std::string warmup_type = "log";
  // Index of the last step taken, for resuming. Default -1 (start). >= -1.
  int64_t last_batch_iteration = -1;
};

struct WarmupDecayLRParams {
  // Total steps of the schedule: warmup, then linear decay to 0 at this step. Required (no
  // default). > 0.
  int64_t total_num_steps = 0;
  double warmup_min_lr = 0.0;         // default 0; >= 0
  double warmup_max_lr = 0.001;       // default 0.001; >= warmup_min_lr
  int64_t warmup_num_steps = 1000;    // default 1000; >= 0
  std::string warmup_type = "log";    // "log" (default) or "linear"
  int64_t last_batch_iteration = -1;  // default -1 (start); >= -1
};

struct WarmupCosineLRParams {
  // Total steps: warmup, then cosine decay to cos_min_ratio * lr. Required. > 0.
  int64_t total_num_steps = 0;
  // Fraction of the optimizer's lr at step 0. Default 0. In [0, 1].
  double warmup_min_ratio = 0.0;
  int64_t warmup_num_steps = 1000;  // default 1000; >= 0
  // Fraction of the optimizer's lr at the end. Default 0.0001. In [0, 1].
  double cos_min_ratio = 0.0001;
  std::string warmup_type = "log";    // "log" (default) or "linear"
  int64_t last_batch_iteration = -1;  // default -1 (start); >= -1
};

struct OneCycleParams {
  // Lower and upper LR of the cycle. Required. >= 0, cycle_max_lr >= cycle_min_lr.
  double cycle_min_lr = 0.0;
  double cycle_max_lr = 0.0;
  // LR decay rate after the cycle. Default 0 (no decay).
  double decay_lr_rate = 0.0;
  // Steps of the rising half. Default 2000. > 0.
  int64_t cycle_first_step_size = 2000;
  // Steps of the falling half. Unset (default): cycle_first_step_size.
  std::optional<int64_t> cycle_second_step_size;
  // Stairs in the first half; 0 (default) is a continuous ramp.
  int64_t cycle_first_stair_count = 0;
  // Stairs in the second half. Unset (default): cycle_first_stair_count.
  std::optional<int64_t> cycle_second_stair_count;
  // Steps between decays after the cycle. Default 0 (no decay).
  int64_t decay_step_size = 0;
  // Cycle momentum (beta1) inversely to the LR. Default true.
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8;         // default 0.8
  double cycle_max_mom = 0.9;         // default 0.9
  double decay_mom_rate = 0.0;        // default 0
  int64_t last_batch_iteration = -1;  // default -1 (start); >= -1
};

struct LRRangeTestParams {
  // Starting LR. Default 1e-3. >= 0.
  double lr_range_test_min_lr = 1e-3;
  // Steps per LR increase. Default 2000. > 0.
  int64_t lr_range_test_step_size = 2000;
  // Scale of each increase. Default 1.0. >= 0.
  double lr_range_test_step_rate = 1.0;
  // Increase in stairs instead of continuously. Default false.
  bool lr_range_test_staircase = false;
  int64_t last_batch_iteration = -1;  // default -1 (start); >= -1
};

struct SchedulerConfig {
  // "WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle" or "LRRangeTest" (exact
  // spelling, as DeepSpeed). Empty: no "scheduler" section. Required when the section is
  // present; "auto" is an error.
  std::string type;
  WarmupLRParams warmup_lr;
  WarmupDecayLRParams warmup_decay_lr;
  WarmupCosineLRParams warmup_cosine_lr;
  OneCycleParams one_cycle;
  LRRangeTestParams lr_range_test;
};

// ---------------------------------------------------------------------------------------------
// Mixed precision. fp16.enabled and bf16.enabled both true is a ConfigError.

struct Fp16Config {
  // Train with fp16 weights/activations and fp32 master weights. Default false.
  bool enabled = false;
  // Cast inputs to fp16 automatically. Default false.
  bool auto_cast = false;
  // Static loss scale; 0 (default) means dynamic loss scaling. >= 0.
  double loss_scale = 0.0;
  // Dynamic scaling starts at 2^initial_scale_power. Default 16. In [0, 64).
  int initial_scale_power = 16;
  // Overflow-free steps before the dynamic scale is raised. Default 1000. > 0.
  int loss_scale_window = 1000;
  // Overflows tolerated before the scale is lowered (DeepSpeed's delayed shift). Default 2. >= 1.
  int hysteresis = 2;
  // Refill hysteresis after every overflow-free step. Default false.
  bool consecutive_hysteresis = false;
  // Floor of the dynamic scale. Default 1. > 0.
  double min_loss_scale = 1.0;
};

// "bf16" (also accepted under its old DeepSpeed name "bfloat16"; giving both is an error).
struct Bf16Config {
  // Train with bf16 weights/activations and fp32 master weights. Default false.
  bool enabled = false;
  // DeepSpeed's BF16 optimizer (stage 1 with data_types.grad_accum_dtype "fp32") adds each
  // gradient into its fp32 buffer as autograd brings it, instead of after backward: what dscpp's
  // fp32 accumulation always does (NOTE [accumulation dtype]). Elsewhere DeepSpeed does not read
  // it (check_supported warns). Default false.
  bool immediate_grad_update = false;
  // DeepSpeed 0.18.3+: no fp32 master weights: the optimizer updates the bf16 parameters
  // themselves (each piece widened to fp32 and rounded back once), 4 bytes per parameter fewer.
  // ZeRO stages 1-3. Default false.
  bool bf16_master_weights_and_grads = false;
  // DeepSpeed 0.19.1+: the optimizer's states in bf16 too (needs bf16_master_weights_and_grads):
  // each piece widened to fp32 for the step and rounded back once, 2 bytes per state element
  // instead of 4. Default false.
  bool bf16_optimizer_states = false;
};

// ---------------------------------------------------------------------------------------------
// zero_optimization (deepspeed/runtime/zero/config.py, offload_config.py).

struct OffloadOptimizerConfig {
  // Where the optimizer state lives: "none" (default, device memory), "cpu" or "nvme".
  // Optimizer math runs on the CPU for "cpu" and "nvme". Ignored (with a warning) at stage 0.
  std::string device = "none";
  // Folder for the swap files. Required when device is "nvme".
  std::optional<std::string> nvme_path;
  // Swap buffers in the pool (nvme); at least the optimizer's states per parameter. Default 4.
  // >= 0.
  int64_t buffer_count = 4;
  // Page-locked CPU buffers. Default false.
  bool pin_memory = false;
  // Overlap reading the next sub-group / writing the previous one with the optimizer step
  // (nvme). Defaults false.
  bool pipeline_read = false;
  bool pipeline_write = false;
  // Fast optimizer initialisation when offloading to nvme. Default false.
  bool fast_init = false;
  // Fraction of the optimizer state offloaded. Default 1.0. In [0, 1]; < 1 only at stage 3.
  double ratio = 1.0;
};

struct OffloadParamConfig {
  // Where parameters live: "none" (default), "cpu" or "nvme". Stage 3 only; ignored with a
  // warning at other stages.
  std::string device = "none";
  // Folder for the swap files. Required when device is "nvme".
  std::optional<std::string> nvme_path;
  // Swap buffers in the pool (nvme). Default 5. >= 0.
  int64_t buffer_count = 5;
  // Elements per swap buffer (nvme). Default 1e8. >= 0.
  int64_t buffer_size = 100000000;
  // Parameter elements kept in CPU memory when offloading to nvme. Default 1e9. >= 0.
  int64_t max_in_cpu = 1000000000;
  // Page-locked CPU buffers. Default false.
  bool pin_memory = false;
};

// zero_optimization.leaf_module (deepspeed/runtime/zero/leaf_module_config.py): which submodules
// are stage-3 units. DeepSpeed gathers a "leaf module"'s whole subtree at once, which is what a
// dscpp unit is; dscpp adds these to InitOptions::zero_units (include/dscpp/zero.h). Each key takes
// a string or an array of strings. Every entry must match a module of the model (DeepSpeed only
// warns). Only stage 3 reads it, as DeepSpeed.
struct ZeroLeafModuleConfig {
  // Module types: torch::nn::Module::name() whole ("dscpp::models::BlockImpl") or after its last
  // "::" ("BlockImpl"), as DeepSpeed takes a class's qualified or bare name, TORCH_MODULE's
  // "Impl" optional ("Block", "dscpp::models::Block"). Default empty
  // (DeepSpeed's defaults name Hugging Face Python classes, which a libtorch model cannot be).
  std::vector<std::string> classes;
  // Module paths as named_modules() spells them ("h.0"). Default empty.
  std::vector<std::string> names;
  // Module paths ending with one of these ("attn"). Default empty.
  std::vector<std::string> name_suffixes;
  bool empty() const { return classes.empty() && names.empty() && name_suffixes.empty(); }
};

struct ZeroConfig {
  // 0: off (gradients all-reduced), 1: optimizer state sharded, 2: + gradients sharded,
  // 3: + parameters sharded. Default 0. In 0..3.
  int stage = 0;
  // Copy gradients into one contiguous buffer as they are produced. Default true.
  bool contiguous_gradients = true;
  // Overlap gradient reduction with backward. DeepSpeed's default depends on the stage: true
  // at stage 3, false otherwise (describe() marks it).
  bool overlap_comm = false;
  // Reduce-scatter (or reduce) gradients instead of all-reduce. Default true.
  bool reduce_scatter = true;
  // Elements reduced per bucket. Default 5e8. > 0.
  int64_t reduce_bucket_size = 500000000;
  // All-gather updated parameters (instead of a series of broadcasts). Default true.
  bool allgather_partitions = true;
  // Elements all-gathered per bucket. Default 5e8. > 0 and a multiple of 2 (DeepSpeed asserts).
  int64_t allgather_bucket_size = 500000000;
  // Stage 1/2 with CPU offload: spread gradient copies across ranks. Default false.
  bool round_robin_gradients = false;
  // Elements per optimizer sub-group (tile) in offloaded steps. Default 1e9. > 0.
  int64_t sub_group_size = 1000000000;
  // Stage 3: parameter elements fetched ahead of use. Default 5e7. >= 0 (0: no prefetch).
  // Alias: prefetch_bucket_size.
  int64_t stage3_prefetch_bucket_size = 50000000;
  // Stage 3: DeepSpeed all-gathers parameters one at a time and sets the prefetch bucket size
  // to 1 (one unit ahead in dscpp, whose gathers stay one per unit: the same values and peak).
  // Default false. Alias: allgather_sequential.
  bool stage3_allgather_sequential = false;
  // Stage 3: parameters with fewer elements stay whole on every rank. Default 1e5. >= 0.
  // Alias: param_persistence_threshold.
  int64_t stage3_param_persistence_threshold = 100000;
  // Stage 3: most gathered parameter elements alive at once per rank. Default 1e9. >= 0.
  // Alias: max_live_parameters.
  int64_t stage3_max_live_parameters = 1000000000;
  // Stage 3: keep a gathered parameter if reused within this many elements. Default 1e9. >= 0.
  // Alias: max_reuse_distance.
  int64_t stage3_max_reuse_distance = 1000000000;
  // Stage 3 (ZeRO++ qwZ): forward's and backward's parameter all-gathers send block-wise int8
  // codes and scales instead of the training dtype (NOTE [block-wise quantization]). Default false; no
  // effect below stage 3 (as in DeepSpeed).
  bool zero_quantized_weights = false;
  // Stage 3 (ZeRO++ qgZ): the units' gradient reduce-scatter sends what crosses hosts as
  // block-wise int4 codes and scales, all-to-all (NOTE [quantized reduce-scatter]); exact inside
  // a host and on one host. Default false; no effect below stage 3 (as in DeepSpeed).
  bool zero_quantized_gradients = false;
  // Stage 3 (ZeRO++ hpZ): ranks in the secondary partition, a copy of the weights sharded inside
  // each host that backward gathers from (NOTE [secondary partition]). 0 and 1: off (default
  // 1); otherwise it must equal the ranks per host of hierarchical collectives (checked when the
  // engine starts). >= 0. No effect below stage 3 (as in DeepSpeed).
  int64_t zero_hpz_partition_size = 1;
  // Stage 3: gather full 16-bit weights when the model is saved. Default false.
  // Aliases: gather_16bit_weights_on_model_save, stage3_gather_fp16_weights_on_model_save
  // (deprecated).
  bool stage3_gather_16bit_weights_on_model_save = false;
  // Ignore parameters that get no gradient instead of failing. Default true.
  bool ignore_unused_parameters = true;
  ZeroLeafModuleConfig leaf_module;
  OffloadOptimizerConfig offload_optimizer;
  OffloadParamConfig offload_param;
};

// aio: asynchronous disk I/O for nvme offload (deepspeed/runtime/swap_tensor/constants.py).
struct AioConfig {
  // Bytes per I/O request. Default 1048576. > 0.
  int64_t block_size = 1048576;
  // Requests in flight. Default 8. > 0.
  int64_t queue_depth = 8;
  // I/O threads. Default 1. > 0.
  int64_t thread_count = 1;
  // Submit requests one at a time instead of in batches. Default false.
  bool single_submit = false;
  // Overlap submission and completion. Default true.
  bool overlap_events = true;
};

// checkpoint (deepspeed/runtime/constants.py).
// checkpoint.writer (DeepSpeed's deepspeed/runtime/model_checkpointing): how a save's files are
// written. Absent: save_checkpoint() writes them before it returns. decoupled: it copies what
// the next step would change and returns; a thread writes the files while training goes on and
// the checkpoint is published at a later step (docs/checkpoint.md, "Saving in the background").
struct CheckpointWriterConfig {
  bool given = false;         // the section is present
  std::string type = "FAST";  // FAST (dscpp's writer); PYTHON and MOCK are refused
  bool decoupled = false;     // write in the background
  // Bytes copied from the training state and written per piece; bounds how long a step waits
  // for the piece in flight. Default 64 MiB (DeepSpeed's); >= 1 MiB.
  int64_t io_buffer_size = int64_t{64} << 20;
  // FastPersist's two staging buffers (DeepSpeed's default when absent: true). Given true:
  // a warning (dscpp's writer fills one buffer at a time); false matches what dscpp does.
  std::optional<bool> io_buffer_double;
  bool show_statistics = false;  // every rank logs its write's bytes, seconds and stall
  std::string data_parallel;     // "" (unset); REPLICA, SOCKET or MACHINE are refused
  int64_t io_multiplier = 1;     // FastPersist's I/O multiplier; other than 1 is refused
};

// activation_checkpointing: DeepSpeed's settings of its checkpointing module, here of
// zero::checkpoint (include/dscpp/zero.h). The section's other keys are verdicts (docs/config.md).
struct ActivationCheckpointingConfig {
  // A checkpointed unit's inputs, kept for its recomputation in backward, are kept in host memory
  // (copied back for the recomputation); nothing changes for a model in host memory. Default
  // false.
  bool cpu_checkpointing = false;
};

// data_types (the section's other keys are verdicts, docs/config.md).
struct DataTypesConfig {
  // The dtype gradients accumulate in: "fp32", "fp16" or "bf16" (DeepSpeed's spellings, such
  // as "float32" or "torch.bfloat16", are read as these); unset: the training dtype. DeepSpeed
  // 0.19.8 acts on it at ZeRO stage 1 with bf16 and "fp32" (its BF16 optimizer: fp32 gradient
  // accumulation), and refuses a dtype other than the training one at stage 0; dscpp does both,
  // and check_supported says where else it has no effect.
  std::optional<std::string> grad_accum_dtype;
};

// torch_autocast (DeepSpeed 0.17.2+): the parameters stay in fp32 and the forward runs under
// libtorch's autocast (matrix products in `dtype`), inside Engine::autocast(); the gradients of
// the parameters of the lower-precision-safe modules are reduced over ranks in `dtype`, the rest
// in fp32 (NOTE [autocast] in src/engine/autocast.h).
struct TorchAutocastConfig {
  bool enabled = false;
  // "bf16" (DeepSpeed's spellings read as in data_types); unset: the device's autocast default
  // (bf16 on the CPU, fp16 on a GPU). fp16 is refused: it needs a gradient scaler.
  std::optional<std::string> dtype;
  // Class names of the modules whose parameters' gradients are reduced in `dtype`; unset:
  // Linear and Conv1d/2d/3d. Python's torch.nn names (torch.nn.modules.linear.Linear) name
  // libtorch's modules; a C++ module's class is named as Module::name() gives it, with or without
  // its "Impl" suffix. An entry that names no module of the model is an error.
  std::optional<std::vector<std::string>> lower_precision_safe_modules;
};

struct CheckpointConfig {
  // What to do when ranks save under different tags: "Ignore", "Warn" (default) or "Fail";
  // matched case-insensitively, stored in this spelling.
  std::string tag_validation = "Warn";
  CheckpointWriterConfig writer;
};

// elasticity (deepspeed/elasticity/constants.py): the batch triple chosen so that one
// train_batch_size is valid at many world sizes (src/config/elasticity.h). When enabled it sets
// the batch triple at resolve_batch(); the three batch keys must then be absent unless
// ignore_non_elastic_batch_info.
struct ElasticityConfig {
  bool enabled = false;
  // The largest train_batch_size acceptable. Default 2000; >= every micro batch size. Required
  // when enabled.
  int64_t max_train_batch_size = 2000;
  // The micro batch sizes a rank may run. Default [2, 4, 6]; each > 0. Required when enabled.
  std::vector<int64_t> micro_batch_sizes = {2, 4, 6};
  // The range of world sizes (GPUs; ranks here) the job may run at. Defaults 1 and 10000;
  // 1 <= min_gpus <= max_gpus.
  int64_t min_gpus = 1;
  int64_t max_gpus = 10000;
  // Ranks per node: version 0.2 scales by whole nodes. Default 1; >= 1.
  int64_t num_gpus_per_node = 1;
  // Model parallelism inside the elastic world. Default 1; dscpp has none, so only 1.
  int64_t model_parallel_size = 1;
  // Minutes a resource scheduler should let the job run before rescaling it; read by
  // schedulers, not by the engine (as in DeepSpeed), so giving it is a warning. Default 0; >= 0.
  double min_time = 0;
  // Among batch sizes valid at equally many world sizes, the larger one. Default true.
  bool prefer_larger_batch = true;
  // Batch keys given beside an enabled elasticity section: false (default) refuses them, true
  // ignores them (DeepSpeed's rule).
  bool ignore_non_elastic_batch_info = false;
  // The algorithm: 0.1 or 0.2 (default; node-level scaling, and a world size outside the valid
  // list still trains, with a batch size of its own).
  double version = 0.2;
};

// comms_logger (deepspeed/comm/constants.py).
struct CommsLoggerConfig {
  // Time and log collectives. Default false.
  bool enabled = false;
  // Log every collective as it happens. Default false.
  bool verbose = false;
  // Profile all collectives (else only prof_ops). Default true.
  bool prof_all = true;
  // Add the caller's name to each record. Default false.
  bool debug = false;
  // Collectives to profile when prof_all is false ("all_reduce", ...). Default empty.
  std::vector<std::string> prof_ops;
};

// flops_profiler (deepspeed/profiling/constants.py).
struct FlopsProfilerConfig {
  // Default false. (DeepSpeed also turns on wall_clock_breakdown when this is true.)
  bool enabled = false;
  // Global step at which to profile. Default 1. >= 0.
  int64_t profile_step = 1;
  // Depth of the module tree shown; -1 (default) is all. >= -1.
  int64_t module_depth = -1;
  // Number of top modules shown. Default 1. >= 0.
  int64_t top_modules = 1;
  // Per-module detail. Default true.
  bool detailed = true;
  // File for the report; unset (default) prints to stdout.
  std::optional<std::string> output_file;
};

// csv_monitor and tensorboard (deepspeed/monitor/config.py).
struct MonitorConfig {
  // Default false.
  bool enabled = false;
  // Folder for the output; "" (default): under the launch directory.
  std::string output_path;
  // Sub-folder name for this job. Default "DeepSpeedJobName".
  std::string job_name = "DeepSpeedJobName";
};

// The batch triangle after resolve_batch() (NOTE [batch triangle] in src/config/batch.cpp).
struct BatchSizes {
  // Samples per optimizer step over all data-parallel ranks.
  int train_batch_size = 0;
  // Samples per forward/backward on one rank.
  int train_micro_batch_size_per_gpu = 0;
  // Micro-batches accumulated per optimizer step.
  int gradient_accumulation_steps = 0;
  // The data-parallel world size used, and where it came from ("WORLD_SIZE set by dscpp
  // launch"). 0 until resolve_batch() has run.
  int world_size = 0;
  std::string world_source;

  bool resolved() const { return world_size > 0; }
};

// ---------------------------------------------------------------------------------------------
struct Config {
  // ----- batch: as given in the JSON; unset when absent or "auto". The values in force are in
  // `batch` after resolve_batch(). Each given value is > 0.
  std::optional<int> train_batch_size;
  std::optional<int> train_micro_batch_size_per_gpu;
  std::optional<int> gradient_accumulation_steps;
  // Filled by resolve_batch(); zeros before.
  BatchSizes batch;

  // Clip gradients to this global L2 norm; 0 disables. Default 1.0, as in DeepSpeed 0.19.8
  // (before it, 0). >= 0.
  double gradient_clipping = 1.0;
  // The engine's step line every this many optimizer steps. Unset (default, as in DeepSpeed
  // 0.19.8): none. > 0.
  std::optional<int64_t> steps_per_print;
  // Log the time of forward, backward and step. Default false.
  bool wall_clock_breakdown = false;
  // Divide gradients by the world size before the all-reduce instead of after. Default false.
  bool prescale_gradients = false;
  // Divide gradients by this before the all-reduce and by world_size / this after. Default 1.0.
  // > 0.
  double gradient_predivide_factor = 1.0;
  // "mean" (default): the data-parallel gradients are averaged over ranks; "sum": summed, with
  // neither prescale_gradients nor gradient_predivide_factor applied (DeepSpeed 0.19.8's
  // gradient_allreduce_op; any case).
  std::string gradient_allreduce_op = "mean";
  // Allow ZeRO with an optimizer DeepSpeed has not tested with it. Default false.
  bool zero_allow_untested_optimizer = false;
  // Data type of gradient collectives: "fp16", "bf16" or "fp32" (case-insensitive; DeepSpeed's
  // old spelling "bfp16" is read as "bf16"). Unset (default): the training precision.
  std::optional<std::string> communication_data_type;
  // Print the engine state after initialisation. Default false.
  bool dump_state = false;
  // The log level initialize() sets (dscpp::set_log_level): "debug", "info", "warning", "error"
  // or "critical" (read as "error"), any case, as DeepSpeed's engine sets its logger's. Unset
  // (default): the level in force.
  std::optional<std::string> log_level;
  // dscpp extension (not a DeepSpeed key; DeepSpeed ignores it): seed for parameter init and
  // data order. Unset (default): the program's own seeding. >= 0.
  std::optional<int64_t> seed;

  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  Fp16Config fp16;
  Bf16Config bf16;
  ZeroConfig zero_optimization;
  AioConfig aio;
  CheckpointConfig checkpoint;
  ActivationCheckpointingConfig activation_checkpointing;
  DataTypesConfig data_types;
  TorchAutocastConfig torch_autocast;
  ElasticityConfig elasticity;
  CommsLoggerConfig comms_logger;
  FlopsProfilerConfig flops_profiler;
  MonitorConfig csv_monitor;
  MonitorConfig tensorboard;

  // Where the config came from: the file path, or "<json text>" / "<json object>".
  std::string source;
  // Collected warnings (DeepSpeed keys dscpp does not act on, deprecated spellings, settings that
  // have no effect) and notes ("auto" resolutions); each was also logged (warning / info level).
  std::vector<std::string> warnings;
  // JSON path -> how dscpp chose a value the JSON did not give verbatim: "auto -> default",
  // "derived: ...", "default for stage 3". describe() prints these next to the values.
  std::map<std::string, std::string> origins;

  // Parses a config. Text whose first non-blank character is '{' is JSON; anything else is a
  // file path. Comments (// and /* */) are allowed; duplicate keys are an error (as DeepSpeed).
  // Throws IoError naming the path when the file cannot be read, ConfigError for malformed JSON
  // (with line and column), unknown keys (with the nearest known key), wrong types and
  // out-of-range values. The batch triangle is not resolved yet: call resolve_batch().
  static Config parse(const std::string& path_or_json);
  // As parse(), from a JSON value.
  static Config from_json(const nlohmann::json& j);

  // Resolves train_batch_size / train_micro_batch_size_per_gpu / gradient_accumulation_steps
  // against the data-parallel world size exactly as DeepSpeed's
  // DeepSpeedConfig._set_batch_related_parameters and _batch_assertion do, filling `batch`.
  // `world_source` says where world_size came from and appears in errors. Throws ConfigError
  // showing the arithmetic when the triple is missing, not positive or inconsistent. May be
  // called again (for another world size); each call starts from the values given.
  void resolve_batch(int world_size, const std::string& world_source);
  // resolve_batch() with elasticity enabled: the elastic batch (src/config/elasticity.h).
  void resolve_elastic_batch(int world_size, const std::string& world_source);

  // Multi-line, human-readable: every value in force, one "path = value" per line, derived
  // values marked "(derived: ...)" and "auto"-resolved ones "(auto -> default)".
  std::string describe() const;
};

}  // namespace dscpp
