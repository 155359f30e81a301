// ParamFetcher: stage 3's gather and release of a unit's full parameters, from pooled buffers.
//
// NOTE [unit storage]: a unit's parameters are views into one flat tensor `full` [padded] whose
// storage has memory only while the unit is gathered. Releasing swaps the storage's memory out
// (null data, 0 bytes): the parameters keep their shapes, and the views autograd saved in forward
// stay valid. Gathering swaps a pooled block in and all-gathers the ranks' shards into it. The
// communicator writes through the data pointer, which bumps no version counter, so backward
// accepts the re-gathered values as the ones it saved (FSDP frees storage the same way; gathering
// through param.copy_ would bump the counters and break backward). Blocks come from a pool keyed
// by size and are reused, so a gather never faults fresh pages in (on the CPU a fresh page costs
// more than the copy into it; docs/zero.md).
//
// In debug mode (DSCPP_DEBUG_SYNC=1) a released unit keeps its block, filled with NaN, so a
// parameter read outside its unit's call gives NaN instead of reading freed memory.
//
// Threading: called from the training thread and from backward (the autograd thread of the
// parameters' device), never both at once.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dscpp/comm.h"

namespace dscpp::zero {

// One unit's storage, as the fetcher sees it.
struct FetchUnit {
  std::string name;  // the unit's module path, for messages
  at::Tensor full;   // [padded], training dtype; the parameters are views of it
  at::Tensor shard;  // [padded / world] this rank's shard: persistent, or (shard on disk)
                     // brought in for an all-gather and dropped once it is done
  bool shard_on_disk = false;
  at::Tensor block;       // the pool block swapped in while gathered (or gathering)
  comm::WorkHandle work;  // the all-gather in flight, if any
  bool gathered = false;  // memory swapped in (the all-gather may still be running: work)
  // Gathered through int8 (zero_quantized_weights): `full` holds the dequantized values, not
  // the shards' own; `codes` and `scales` receive the ranks' int8 codes and block scales, and
  // `scale_work` is the scales' all-gather in flight.
  bool quantized = false;
  at::Tensor codes, scales;
  comm::WorkHandle scale_work;
};

class ParamFetcher {
 public:
  // `quantize_weights`: gathers send block-wise int8 codes and scales (NOTE [block-wise quantization])
  // instead of the training dtype, unless gather() is asked for the exact values.
  ParamFetcher(comm::Communicator& comm, bool debug_nan, bool quantize_weights = false);
  // Makes `full`'s storage empty (a new unit, or at set-up).
  static void swap_out(FetchUnit& u);
  // A unit set up released: its storage empty, or in debug mode a NaN-filled block.
  void park(FetchUnit& u);
  // Swaps a block in and launches the all-gather of the shards into it; returns at once.
  // `exact`: the shards' own values even when quantizing (GatheredParameters, which may write
  // them back).
  void gather(FetchUnit& u, bool exact = false);
  // Waits for u's all-gather (if any) and dequantizes a quantized one into `full`, then drops a
  // shard brought in from disk. Throws CommError if it failed.
  void wait(FetchUnit& u);
  // Swaps u's memory out (debug: fills it with NaN and keeps it) and returns the block to the
  // pool. Waits for an all-gather still in flight first.
  void release(FetchUnit& u);
  // Bytes of gathered units now, the most at once so far, and of every pooled block.
  int64_t live_bytes() const { return live_; }
  int64_t peak_live_bytes() const { return peak_; }
  int64_t pool_bytes() const { return pool_; }
  bool debug_nan() const { return debug_nan_; }

 private:
  // A pooled tensor of n elements of `options` from `pool` (new if none is free).
  at::Tensor take(std::map<int64_t, std::vector<at::Tensor>>& pool, int64_t n,
                  const at::TensorOptions& options);

  comm::Communicator& comm_;
  bool debug_nan_;
  bool quantize_;
  std::map<int64_t, std::vector<at::Tensor>> free_;  // free blocks by element count
  // int8 codes and float scales of quantized gathers, by element count
  std::map<int64_t, std::vector<at::Tensor>> free_codes_, free_scales_;
  int64_t live_ = 0, peak_ = 0, pool_ = 0;
};

}  // namespace dscpp::zero
