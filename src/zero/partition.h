// The flat partition: a group of parameters laid out in one flat buffer, and each rank's shard of
// that buffer.
//
// NOTE [flat partition]: the parameters of a group are concatenated in registration order into
// one buffer of the training dtype, padded with zeros to a multiple of the world size N. Each
// parameter becomes a view into the buffer, so nothing is copied per step. Rank r owns the
// contiguous shard [r * S, (r + 1) * S) with S = padded / N; a parameter may straddle shard
// boundaries. The padding's gradients are always zero, so the optimizer keeps it at zero.
// Stages 0-2 have one group, the whole model; stage 3 has one group per unit.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

namespace dscpp::zero {

// Where each parameter of a group lives in the group's flat buffer, and the shards.
struct FlatLayout {
  std::vector<std::pair<int64_t, int64_t>> segments;  // (offset, numel) of each parameter
  int64_t numel = 0;                                  // elements of the parameters
  int64_t padded = 0;  // numel rounded up to a multiple of the world size
  int64_t shard = 0;   // padded / world size: elements each rank owns

  static FlatLayout of(const std::vector<at::Tensor>& params, int world);
  int64_t shard_offset(int rank) const { return rank * shard; }
};

// The trainable parameters of a module tree (requires_grad), each once: a tied parameter
// registered under two names is one parameter, named by its first registration.
struct NamedParams {
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
};
NamedParams trainable_parameters(torch::nn::Module& model);

// Throws ConfigError when there are no parameters, or naming the first one that is not fp32 or
// not on the first one's device: dscpp keeps the model in fp32 and casts it itself.
void check_fp32_on_one_device(const std::vector<at::Tensor>& params,
                              const std::vector<std::string>& names);

// Called with each parameter's values as they are moved into a flat buffer: its offset in the
// buffer and the values in the parameter's own dtype, flattened [numel].
using FlattenTap = std::function<void(int64_t offset, const at::Tensor& values)>;

// Moves `params` (fp32, one device) into a new flat buffer [layout.padded] of `dtype` and makes
// each parameter a view into it. The buffer is filled one parameter at a time, each original
// freed as soon as it is copied, so the model never exists twice; the padding is zero. `tap`
// (optional) sees each parameter's original values first (the fp32 master weights take their
// shard from it). Returns the buffer. Throws ConfigError naming the parameter when one is not
// fp32 or not on the first one's device.
at::Tensor flatten_parameters(const std::vector<at::Tensor>& params,
                              const std::vector<std::string>& names, const FlatLayout& layout,
                              at::ScalarType dtype, const FlattenTap& tap = nullptr);

}  // namespace dscpp::zero
