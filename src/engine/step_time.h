// The time of one training step across hosts, network included: what `dscpp estimate --hosts`
// prints, and the scaling table in docs/benchmarks.md.
//
// NOTE [step-time model]
// Bytes, exact: each per-step collective puts a number of bytes on each host's link that its
// algorithm fixes (docs/comm.md, "Across hosts"). For a reduce-scatter or all-gather of n bytes,
// a flat ring over all P = H x R ranks in rank order sends (P-1)/P n over each host's link (the
// ring crosses each host boundary once); the hierarchy sends (H-1)/H n, spread over its R
// columns; an all-reduce is both. qwZ's gathers carry 1 byte and 4/2048 of a scale per element;
// qgZ's reduce-scatter sends each host's sum (the hierarchy; flat, each rank's contribution),
// (H-1)/H of it, at 0.5 bytes and 4/512 of a scale per element; hpZ's backward gathers stay in
// the host. Per micro-batch: stage 3 gathers every unit in forward, again in backward those not
// kept (a unit is kept when the elements gathered between its forward and its backward stay
// within stage3_max_reuse_distance, as Stage3::reused_soon decides), and reduce-scatters the
// units' gradients; stages 2-3 reduce-scatter the rest (stage 2 every micro-batch, stage 1 once
// a step); every stage 1-3 all-gathers what is not a unit after the step; stage 0 all-reduces.
// Time: each collective takes bytes / link bandwidth plus one latency per step between hosts
// (the hierarchy's reduce-scatter log2 H when H is a power of two, NOTE [tree order], else H-1,
// its all-gather H-1; flat rings P-1; an all-reduce is both), plus, in the hierarchy, a pass
// over the buffer through shared memory. What runs during forward and backward (stage 3's gathers and
// reduce-scatter, stage 2's reduce-scatter under overlap_comm), M seconds of it, hides behind
// compute C, but only `overlap` x C of it (communication needs CPU time and memory bandwidth of
// its own, and prefetching runs only so far ahead):
//   waited = max(0, M - overlap C)
// What runs after backward (overlap_comm false) or after the step is waited for whole.
// Quantizing costs CPU time per element on top. `overlap` and the quantizer's cost are measured,
// not derived: docs/benchmarks.md gives the calibration run and checks the predictions against
// the other measured 2- and 4-host runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dscpp::models {
struct GPTConfig;
}

namespace dscpp::engine {

struct StageThreeUnits;  // estimate.h

// The hosts and their network.
struct Cluster {
  int hosts = 1;
  int per_host = 1;
  double net_bytes_per_s = 125e6;  // each host's link, each direction (1 Gbit/s)
  double net_latency_s = 0;        // one message between hosts
  double shm_bytes_per_s = 4e9;    // one rank's copies through shared memory
  bool hierarchy = true;           // hierarchical collectives (dscpp's default with R >= 2)
  int world() const { return hosts * per_host; }
};

// One step of training, as the config and the model make it.
struct StepWork {
  int stage = 0;
  int item_bytes = 4;       // the training dtype's bytes per element
  int grad_wire_bytes = 4;  // the gradients' reductions' (communication_data_type)
  int gas = 1;
  // Stage 3: each unit's sharded elements in forward order; `other` = every trainable element
  // not in a unit (stage 3's resident group; every element below stage 3).
  std::vector<int64_t> units;
  int64_t other = 0;
  bool overlap_comm = false;
  int64_t reduce_bucket_size = 500000000;  // elements (ring latency per bucket)
  int64_t max_reuse_distance = 1000000000;
  bool quantized_weights = false;    // qwZ
  bool quantized_gradients = false;  // qgZ
  bool secondary_partition = false;  // hpZ
  // Forward, backward and optimizer of one step on one rank, communication aside (seconds).
  double compute_s = 0;
  double overlap = 0.49;  // the share of the compute time communication can hide behind
  // qwZ / qgZ: this rank's CPU time per element it quantizes or dequantizes (0.63 ns measured at
  // 4 ranks on this 2-core machine, where a rank trains at 45 GFLOP/s: about 28 flops' time).
  double quantize_s_per_element = 0.63e-9;
  int64_t elements() const;
};

struct StepTime {
  // Bytes each host sends to other hosts per step, by where they come from.
  double gather_bytes = 0;    // stage 3: forward's unit gathers
  double regather_bytes = 0;  // stage 3: backward's unit gathers (0 under hpZ)
  double reduce_bytes = 0;    // the gradients' reduce-scatter (stage 0: all-reduce)
  double after_bytes = 0;     // the all-gather after the step
  double between_hosts() const {
    return gather_bytes + regather_bytes + reduce_bytes + after_bytes;
  }
  double hidden_comm_s = 0;   // communication that can run during forward and backward
  double exposed_comm_s = 0;  // communication the step waits for
  double quantize_s = 0;
  double compute_s = 0;
  double step_s = 0;
  int64_t units_regathered = 0;  // stage 3: units released between forward and backward
};

StepTime model_step(const Cluster& cluster, const StepWork& work);

// The built-in GPT's stage-3 units (GPTImpl::zero_units(): wte, then the blocks) into
// work->units, each parameter below stage3_param_persistence_threshold `threshold` staying whole
// (work->other, with wpe and ln_f).
void add_gpt_units(const models::GPTConfig& gpt, int64_t threshold, StepWork* work);
// The same units for the memory estimate, with forward's requests: wte, each block, wte again
// (the tied output projection).
StageThreeUnits gpt_units(const models::GPTConfig& gpt, int64_t threshold);

}  // namespace dscpp::engine
