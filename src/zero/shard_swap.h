// ShardSwap: where stage 3 keeps the unit shards that do not stay in memory (offload_param nvme,
// NOTE [stage 3 parameter offload] in stage3.h). Stage 3 asks for a shard before its unit's
// all-gather (take, read ahead on the recorded order) and hands back shards written outside the
// step (store); the step's updated values stream in through ParamSink. zero/ owns the interface;
// offload/param_swapper.h implements it over a swap file, so zero/ never includes offload/.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "zero/strategy.h"

namespace dscpp::zero {

// What the shard swap did since the last take_stats().
struct ShardSwapStats {
  int64_t bytes_read = 0, bytes_written = 0;
  int64_t reads = 0, reads_ahead = 0;  // shards read, and of them read ahead of their request
  double wait_seconds = 0;             // the training thread blocked on reads and writes
};

class ShardSwap : public ParamSink {
 public:
  // Elements of every shard together.
  virtual int64_t numel() const = 0;
  // Memory held for shards in transit (buffers in use or free).
  virtual int64_t buffer_bytes() const = 0;
  // Host memory holding the shards themselves while the model is on a device (offload_param cpu
  // of a model on a GPU, offload/device_shards.h); 0 otherwise.
  virtual int64_t host_bytes() const { return 0; }
  // Where the shards are, for the step line: "on disk", "in host memory".
  virtual const char* where() const { return "on disk"; }
  // Starts bringing shard i in unless it is coming already; false when no more may be in
  // flight (nothing started).
  virtual bool read_ahead(int i) = 0;
  // Shard i in memory, [numel] in the training dtype, writable: the read ahead (waited for) or a
  // read now.
  virtual at::Tensor take(int i) = 0;
  // Stores fp32 or training-dtype `values` [numel] as shard i and waits (set-up, load,
  // GatheredParameters).
  virtual void store(int i, const at::Tensor& values) = 0;
  virtual ShardSwapStats take_stats() = 0;
};

}  // namespace dscpp::zero
