// The memory and disk a rank needs at each ZeRO stage, with and without offload: what `dscpp
// estimate` prints and what initialize()'s pre-flight check holds against the memory and disk
// actually available. The model states follow the ZeRO paper's formulas (DeepSpeed's
// estimate_zero2_model_states_mem_needs / estimate_zero3_model_states_mem_needs_all_live), taken
// from the real config: training dtype, the optimizer's number of states, offload, sub-group
// size and buffer count; beside them the engine's buffers, the units stage 3 keeps gathered, the
// activations (when the model is known) and the program itself, so that peak() bounds each
// rank's peak RSS (NOTE [a bound on the peak]). tests/engine/estimate_test.cpp holds the parts
// against Engine::memory_stats(); bench/estimate_check.sh the whole against measured peaks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "dscpp/config.h"

namespace dscpp::models {
struct GPTConfig;
}

namespace dscpp::engine {

// Stage 3's units: their elements, and the order forward requests them (indices into sizes; a
// unit may come twice, as the GPT's tied wte does); backward requests them in reverse.
struct StageThreeUnits {
  std::vector<int64_t> sizes;
  std::vector<int> forward;
};

struct EstimateInput {
  int64_t params = 0;        // trainable elements (Psi)
  int64_t largest_unit = 0;  // stage 3: elements of the largest unit (0: unknown)
  int world = 1;
  int local = 0;  // ranks on this host (0: world, every rank on one host)
  // The model is on a GPU: host memory is a tier of its own ("cpu" offload moves bytes there).
  bool on_gpu = false;
  // With the parameters on nvme: the model will be built under zero::Init, whose spill file
  // (NOTE [spilled shards]) takes 4 bytes per element of the part during set-up (dscpp train's
  // GPT); and the bytes such a spill holds on disk already (the engine's check after the build).
  bool spill_coming = false;
  int64_t spilled = 0;
  // Stage 3: the units (the built-in GPT's: gpt_units in step_time.h). None: unknown, and the
  // largest unit is counted as the only one gathered.
  StageThreeUnits units;
  // The activations of a rank's micro-batch, bytes (models::GPTConfig::activation_bytes); -1:
  // unknown (a model of the user's own), not counted, and the estimate says so.
  int64_t activations = -1;
  // What the process holds resident besides the model when the estimate is made (libtorch and
  // its libraries, the runtime's threads, the data): every rank's own share of its peak.
  int64_t process = 0;
};

// NOTE [gathered units]: stage 3's schedule (NOTE [stage 3 prefetch order] in
// src/zero/stage3.h) replayed on the units' sizes: requests in forward order then in reverse,
// each unit gathered when requested, the next requests' units gathered ahead within
// stage3_prefetch_bucket_size (and stage3_max_live_parameters), and a unit released after its
// request unless its next request comes within stage3_max_reuse_distance elements; in backward
// not before its gradients are all in, after its last request (NOTE [stage 3 backward]). A gather
// ahead counts as in flight until its unit is requested (the engine stops counting it once its
// all-gather completes), so the replay gathers at least as far ahead as a step does. Returns
// the most elements gathered at once.
int64_t gathered_peak(const StageThreeUnits& units, const ZeroConfig& z);

// NOTE [a bound on the peak]: beside what the estimate counts part by part, training takes
// - the runtime: libtorch's kernels paged in as they first run, the thread pools, the
//   communicator's and the engine's bookkeeping: dscpp train's peak RSS less its RSS before the
//   model was built was 21 MiB with a 7,664-parameter GPT (2026-12-05); 48 MiB is counted;
// - the allocator's share: glibc keeps freed heap memory for reuse while training (NOTE
//   [allocator for training] in src/util/memory.h), so fragments of freed activations,
//   temporaries and buffers stay resident: over the measured matrix (docs/offload.md, "The
//   estimate and the pre-flight check") the peaks came 0-4% above the parts, the 3B GPT at 2
//   ranks (docs/moonshot.md) 5%; 7% of them is counted.
constexpr int64_t kRuntimeBytes = int64_t{48} << 20;
constexpr int64_t kSlackPercent = 7;

// Bytes per rank.
struct Estimate {
  int stage = 0;
  bool on_gpu = false;
  std::string offload_optimizer = "none";  // "none", "cpu" (a GPU model) or "nvme"
  std::string offload_param = "none";      // likewise (stage 3)
  int64_t params = 0, grads = 0, master = 0, optimizer_state = 0;
  // Stage 3: the most unit parameters gathered whole at once (NOTE [gathered units]; the
  // largest unit when the units are unknown).
  int64_t gathered = 0;
  // The activations of the configured micro-batch (EstimateInput::activations; 0 when unknown,
  // and activations_known false).
  int64_t activations = 0;
  bool activations_known = false;
  // Ranks sharing a host: the shared-memory segment of the collectives (2 slots per local rank,
  // mapped by every rank) and each rank's fp32 sums of a slot (NOTE [shared-memory
  // collectives] in src/comm/shm.h).
  int64_t comm_buffers = 0;
  // The program itself (EstimateInput::process), and what training adds to it beyond the
  // model: libtorch's kernels paged in as they first run, the thread pools, the communicator's
  // and the engine's bookkeeping (kRuntimeBytes).
  int64_t process = 0;
  int64_t runtime = 0;
  int64_t slack = 0;  // the allocator's share of memory() and the runtime (kSlackPercent)
  // Stages 2-3: the gradient staging slots (NOTE [stage 2 slots]): one, or two with
  // overlap_comm, of the largest bucket (MemoryStats::staging).
  int64_t staging = 0;
  int64_t swap_buffers = 0;  // offload: the swap pipelines' and the copies' buffers
  // Mixed precision: the step's fp32 gradient buffer (a sub-group with the optimizer on nvme, a
  // 4M-element piece in memory unless the optimizer takes bf16 gradients itself), allocated
  // at the first step.
  int64_t step_scratch = 0;
  int64_t disk = 0;          // offload_optimizer: its swap file
  int64_t param_disk = 0;    // offload_param: its swap file
  int64_t grad_disk = 0;     // both on nvme (a CPU model): the gradient shard's swap file
  int64_t spill_disk = 0;    // offload_param nvme: zero::Init's spill file during set-up
                             // (NOTE [spilled shards]); it empties as the optimizer's file fills
  // The most disk the swap files (and the spill) take at once, in one folder.
  int64_t peak_disk() const { return param_disk + grad_disk + std::max(disk, spill_disk); }
  // Of memory(), the bytes in host memory while the model is on a GPU (what "cpu" offload moved
  // there, and the swap files' buffers).
  int64_t host_part = 0;
  int64_t model_states() const { return params + grads + master + optimizer_state; }
  // The model states, the engine's buffers, the gathered units and the activations (on the GPU
  // for a model there, but for host_part).
  int64_t memory() const {
    return model_states() + gathered + staging + swap_buffers + step_scratch + comm_buffers +
           activations + slack;
  }
  // A bound on each rank's peak resident memory, set-up and training (NOTE [a bound on the
  // peak]): memory(), the program and its runtime (a model on a GPU: host() + process is the host's
  // part). (Set-up holds less: a model built whole below stage 3 is at most the fp32 parameters and
  // their flat copy, under the model states of training; zero::Init's build is the shards and one
  // unit.)
  int64_t peak() const { return memory() + process + runtime; }
  // Where memory() and the runtime lie: on the GPU (0 for a model on the CPU) and in host memory
  // (what the pre-flight check holds against the memory left: the program is running already).
  int64_t gpu() const { return on_gpu ? memory() - host_part : 0; }
  int64_t host() const { return (on_gpu ? host_part : memory()) + runtime; }
  // "stage 2, optimizer on nvme", "stage 3, optimizer and parameters on cpu"
  std::string describe() const;
};

// The dtype `config` trains in (bf16, fp16 or fp32), and the one its gradients are reduced in at
// `stage` (communication_data_type; unset: the training dtype; with torch_autocast at stages 1-3
// its dtype, that of the gradients of its lower-precision-safe modules, as DeepSpeed 0.19.8's
// ZeRO optimizers reduce them; at stage 0 its engine's all-reduce does not look at autocast).
at::ScalarType training_dtype(const Config& config);
at::ScalarType communication_dtype(const Config& config, int stage);
// The dtype the gradients accumulate in at `stage`: fp32 at stage 1 in bf16 with
// data_types.grad_accum_dtype "fp32" and no optimizer offload (DeepSpeed 0.19.8's BF16
// optimizer); the training dtype otherwise (check_supported says where the key does nothing).
at::ScalarType gradient_dtype(const Config& config, int stage);
// torch_autocast's dtype on `device` (NOTE [autocast] in src/precision/autocast.h): the config's,
// else libtorch's default there (bf16 on the CPU, fp16 on a GPU).
at::ScalarType autocast_dtype(const Config& config, c10::DeviceType device);

// The micro-batch and gradient accumulation steps `config` resolves to at `world` ranks (with
// elasticity, the elastic batch's); one sample, no accumulation when the config names no batch
// size (dscpp estimate without one).
struct ConfiguredBatch {
  int64_t micro = 1;
  int64_t gas = 1;
};
ConfiguredBatch configured_batch(const Config& config, int world);

// The estimate's input for the built-in GPT trained with `config` at `world` ranks: its
// parameters, stage 3's units, the activations of the configured micro-batch (with or without
// activation checkpointing), built under zero::Init at stage 3 (dscpp train).
EstimateInput gpt_estimate_input(const models::GPTConfig& gpt, const Config& config, int world,
                                 bool on_gpu, bool checkpointing);

// The estimate at `stage` with `offload_optimizer` and `offload_param` ("none", "nvme", or
// "cpu", which moves something only for a model on a GPU; at stage 0 no offload, parameters at
// stage 3 only), everything else as `config` says (dtype, optimizer, sub_group_size, buffer
// counts, pipeline, max_in_cpu). Parameter offload's buffers need in.largest_unit.
Estimate estimate(const EstimateInput& in, const Config& config, int stage,
                  const std::string& offload_optimizer, const std::string& offload_param = "none");
// The estimate of what `config` itself asks for.
Estimate estimate(const EstimateInput& in, const Config& config);
// Every stage, without offload and (stages 1-3) with the optimizer on nvme, and at stage 3 with
// the parameters on nvme too; for a model on a GPU instead the optimizer on cpu (stages 1-3) and
// at stage 3 the optimizer on cpu with the parameters on cpu or nvme, and both on nvme.
std::vector<Estimate> estimate_all(const EstimateInput& in, const Config& config);

// Bytes of memory this process may still take: MemAvailable, lowered to what the cgroup's
// memory.max leaves (containers), or DSCPP_MEMORY_LIMIT when set (bytes, or with a K/M/G/T
// suffix: emulates a smaller machine). `source` says which.
int64_t available_memory(std::string* source = nullptr);

// The memory a GPU model's rank may take on its device: DSCPP_GPU_MEMORY_LIMIT when set (bytes,
// or with a K/M/G/T suffix: a smaller GPU emulated; `dscpp train` also caps its caching
// allocator there), else `free` (what the device reports free; -1: unknown, no check).
int64_t available_gpu_memory(int64_t free, std::string* source = nullptr);

// NOTE [pre-flight]: throws ConfigError when what training `config` asks for does not fit,
// before anything is allocated: the estimate's host part (all but the program, which runs
// already: the model states, buffers, gathered units, activations when known, the runtime and
// the allocator's share) less `held` bytes (what the model's parameters hold already in host
// memory, which the engine reuses), times `local` ranks on this host (assumed alike), against
// available_memory(); for a model on a GPU its device part less
// `held` against `gpu_available` (-1: unknown, unchecked); and the swap files against the free
// space of nvme_path. The message names the bytes and lists the settings that would fit.
// DSCPP_SKIP_MEMORY_CHECK=1 turns it off (a warning says so).
void check_fits(const EstimateInput& in, const Config& config, int64_t held, int local,
                int64_t gpu_available = -1);

// dscpp train's and dscpp check's pre-flight for the built-in GPT before it is built: `in`
// (gpt_estimate_input) with this process and the `local` ranks on this host filled in, the
// estimate logged (info), then check_fits with nothing held yet.
void check_gpt_fits(EstimateInput in, const Config& config, int local, int64_t gpu_available);

// "1.50 GiB", or "12.7 MiB" below 1 GiB
std::string format_bytes(int64_t bytes);

}  // namespace dscpp::engine
