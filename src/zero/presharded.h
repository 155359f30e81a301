// The units zero::Init sharded while a model was built (include/dscpp/zero.h), waiting for
// dscpp::initialize at stage 3 to adopt them.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "zero/partition.h"

namespace torch::nn {
class Module;
}

namespace dscpp::zero {

// NOTE [spilled shards]: with offload_param nvme, zero::Init writes each unit's fp32 shard to a
// spill file in offload_param.nvme_path as soon as the unit is built (unlinked at once, like the
// swap files), so set-up holds one unit's values at a time instead of the rank's fp32 shard of
// the whole model; the engine reads each back as it adopts the unit (into the optimizer's and
// the parameters' swap files), and the file goes with the last unit taken. Same values, same
// order: the model trains bit for bit as one whose shards stayed in memory. Each range read back
// is freed (a punched hole) while the optimizer's swap file reserves its blocks as set-up writes
// them (SwapperOptions::reserve_in_setup), so the disk holds about the swap files' final size,
// never both files whole.
class ShardSpill;

struct PreSharded {
  std::string path;
  std::vector<at::Tensor> params;  // its sharded parameters: views of an empty storage
  FlatLayout layout;               // over `params`, for the world size of the scope
  at::Tensor fp32_shard;           // [layout.shard] this rank's values, rank 0's originally;
                                   // undefined when spilled
  std::shared_ptr<ShardSpill> spill;
  int64_t spill_offset = 0;  // bytes into the spill file
  // This rank's fp32 values [layout.shard]: in memory, or read back from the spill file (on the
  // CPU), whose blocks are then freed: once. Throws IoError naming the file when the read fails.
  at::Tensor take_fp32();
};

// Bytes of fp32 shards zero::Init holds for units not yet adopted: in memory, and in spill files.
int64_t presharded_bytes_in_memory();
int64_t presharded_bytes_spilled();

// The shards zero::Init made of `module`, removed from the registry; nullopt when there are none
// (or only stale ones of a module that no longer holds those parameters).
std::optional<PreSharded> take_presharded(const torch::nn::Module& module);
// Whether zero::Init sharded `param` (its values are no longer in it).
bool is_presharded(const at::Tensor& param);

// Whether `param` was built inside a zero::ShapesOnly scope (include/dscpp/zero.h): its shape and
// dtype are the model's, its values one element broadcast to that shape. dscpp::check judges it;
// initialize() refuses it.
bool is_shapes_only(const at::Tensor& param);

}  // namespace dscpp::zero
