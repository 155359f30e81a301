// The memory and disk a rank needs for its model states at each ZeRO stage, with and without
// optimizer offload: what `dscpp estimate` prints and what initialize()'s pre-flight check holds
// against the memory and disk actually available. The formulas are the ZeRO paper's (DeepSpeed's
// estimate_zero2_model_states_mem_needs / estimate_zero3_model_states_mem_needs_all_live), taken
// from the real config: training dtype, the optimizer's number of states, offload, sub-group
// size and buffer count; tests/engine/estimate_test.cpp holds them against Engine::memory_stats().
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "dscpp/config.h"

namespace dscpp::engine {

struct EstimateInput {
  int64_t params = 0;        // trainable elements (Psi)
  int64_t largest_unit = 0;  // stage 3: elements of the largest unit (0: unknown)
  int world = 1;
  // The model is on a GPU: host memory is a tier of its own ("cpu" offload moves bytes there).
  bool on_gpu = false;
  // With the parameters on nvme: the model will be built under zero::Init, whose spill file
  // (NOTE [spilled shards]) takes 4 bytes per element of the part during set-up (dscpp train's
  // GPT); and the bytes such a spill holds on disk already (the engine's check after the build).
  bool spill_coming = false;
  int64_t spilled = 0;
};

// Bytes per rank.
struct Estimate {
  int stage = 0;
  bool on_gpu = false;
  std::string offload_optimizer = "none";  // "none", "cpu" (a GPU model) or "nvme"
  std::string offload_param = "none";      // likewise (stage 3)
  int64_t params = 0, grads = 0, master = 0, optimizer_state = 0;
  int64_t live_unit = 0;     // stage 3: the largest unit gathered whole
  // Stages 2-3: the gradient staging slots (NOTE [stage 2 slots]): one, or two with
  // overlap_comm, of the largest bucket (MemoryStats::staging).
  int64_t staging = 0;
  int64_t swap_buffers = 0;  // offload: the swap pipelines' and the copies' buffers
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
  int64_t memory() const { return model_states() + live_unit + staging + swap_buffers; }
  // Where memory() lies: on the GPU (0 for a model on the CPU) and in host memory.
  int64_t gpu() const { return on_gpu ? memory() - host_part : 0; }
  int64_t host() const { return on_gpu ? host_part : memory(); }
  // "stage 2, optimizer on nvme", "stage 3, optimizer and parameters on cpu"
  std::string describe() const;
};

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

// NOTE [pre-flight]: throws ConfigError when the model states `config` asks for do not fit
// before anything is allocated: the estimate's host part less `held` bytes (what the model's
// parameters hold already in host memory, which the engine reuses), times `local` ranks on this
// host (assumed alike), against available_memory(); for a model on a GPU its device part less
// `held` against `gpu_available` (-1: unknown, unchecked); and the swap files against the free
// space of nvme_path. The message names the bytes and lists the settings that would fit.
// DSCPP_SKIP_MEMORY_CHECK=1 turns it off (a warning says so).
void check_fits(const EstimateInput& in, const Config& config, int64_t held, int local,
                int64_t gpu_available = -1);

// "1.50 GiB", or "12.7 MiB" below 1 GiB
std::string format_bytes(int64_t bytes);

}  // namespace dscpp::engine
