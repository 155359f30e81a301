// The units zero::Init sharded while a model was built (include/dscpp/zero.h), waiting for
// dscpp::initialize at stage 3 to adopt them.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

#include "zero/partition.h"

namespace torch::nn {
class Module;
}

namespace dscpp::zero {

struct PreSharded {
  std::string path;
  std::vector<at::Tensor> params;  // its sharded parameters: views of an empty storage
  FlatLayout layout;               // over `params`, for the world size of the scope
  at::Tensor fp32_shard;           // [layout.shard] this rank's values, rank 0's originally
};

// The shards zero::Init made of `module`, removed from the registry; nullopt when there are none
// (or only stale ones of a module that no longer holds those parameters).
std::optional<PreSharded> take_presharded(const torch::nn::Module& module);
// Whether zero::Init sharded `param` (its values are no longer in it).
bool is_presharded(const at::Tensor& param);

}  // namespace dscpp::zero
