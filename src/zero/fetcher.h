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
  // ZeRO++ hpZ (NOTE [secondary partition]): this rank's share of `full` inside its host group,
  // [padded / R], kept from a training forward's gather until backward is done with the unit;
  // `keep_secondary`: the gather in flight refreshes it when done.
  at::Tensor secondary;
  bool keep_secondary = false;
};

// What a gather is for, which decides where its values come from.
enum class Gather {
  kPlain,     // every rank's shard (int8 codes under qwZ)
  kForward,   // kPlain; with hpZ this rank also keeps its secondary shard of the result
  kBackward,  // from the host group's secondary shards when the unit has them (hpZ), else kPlain
  kExact,     // every rank's shard in the training dtype, never quantized (GatheredParameters,
              // which may write the values back)
};

// NOTE [secondary partition] (ZeRO++ hpZ, zero_hpz_partition_size = R, the ranks per host):
// a training forward gathers a unit from every rank's shard, across hosts, as without hpZ; when
// that gather is done each rank copies its 1/R share of the result (rank h*R + l keeps
// elements [l, l+1) x padded/R) into `secondary`. Backward then gathers the unit from its host's
// R secondary shards through shared memory, so no byte of backward's parameter gathers leaves
// a host. Under qwZ the secondary holds the dequantized values forward computed with, and
// backward gathers them exactly, so both passes see the same weights; without qwZ the values are
// the shards' own and training is plain stage 3 bit for bit. The secondaries cost padded/R
// elements per rank for the units between their forward and their backward (DeepSpeed keeps its
// secondary tensors for the whole run); they are dropped as backward releases each unit, and
// refreshed by the next forward, so an update never leaves a stale one.
class ParamFetcher {
 public:
  // `quantize_weights`: gathers send block-wise int8 codes and scales (NOTE [block-wise
  // quantization]) instead of the training dtype, except exact ones. `secondary_group`: hpZ's R
  // (the communicator's host group), 1 for none.
  ParamFetcher(comm::Communicator& comm, bool debug_nan, bool quantize_weights = false,
               int secondary_group = 1);
  // Makes `full`'s storage empty (a new unit, or at set-up).
  static void swap_out(FetchUnit& u);
  // A unit set up released: its storage empty, or in debug mode a NaN-filled block.
  void park(FetchUnit& u);
  // Swaps a block in and launches the all-gather into it that `kind` says; returns at once.
  void gather(FetchUnit& u, Gather kind = Gather::kPlain);
  // Whether gather(u, kind) takes u from its host's secondary shards (no shard of its own read).
  static bool from_host(const FetchUnit& u, Gather kind) {
    return kind == Gather::kBackward && u.secondary.defined();
  }
  // Waits for u's all-gather (if any), dequantizes a quantized one into `full`, keeps the
  // secondary shard when asked, then drops a shard brought in from disk. Throws CommError if it
  // failed.
  void wait(FetchUnit& u);
  // hpZ: returns u's secondary shard to the pool (backward is done with u).
  void drop_secondary(FetchUnit& u);
  int secondary_group() const { return secondary_group_; }
  // Bytes of secondary shards held now (hpZ).
  int64_t secondary_bytes() const { return secondary_; }
  // Swaps u's memory out (debug: fills it with NaN and keeps it) and returns the block to the
  // pool. Waits for an all-gather still in flight first.
  void release(FetchUnit& u);
  // Bytes of gathered units now, the most at once so far (with the secondary shards held then),
  // and of every pooled block.
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
  int secondary_group_;
  std::map<int64_t, std::vector<at::Tensor>> free_;  // free blocks by element count
  // int8 codes and float scales of quantized gathers, by element count
  std::map<int64_t, std::vector<at::Tensor>> free_codes_, free_scales_;
  std::map<int64_t, std::vector<at::Tensor>> free_secondary_;  // hpZ's, by element count
  int64_t live_ = 0, peak_ = 0, pool_ = 0, secondary_ = 0;
};

}  // namespace dscpp::zero
