// MasterWeights: under mixed precision (bf16, fp16) the optimizer updates fp32 master weights,
// this rank's part of them, and the training-dtype parameters are cast from them after each
// step. The master weights are rank 0's original fp32 values (broadcast before the model is
// cast), taken piece by piece while the model is moved into its flat buffers, so the model never
// exists twice in fp32.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "zero/partition.h"
#include "zero/strategy.h"

namespace dscpp::precision {

// A tap for zero::flatten_parameters that hands `take(part_offset, values)` the piece of each
// parameter falling in [begin, begin + numel) of the flat buffer (this rank's part).
zero::FlattenTap part_tap(int64_t begin, int64_t numel,
                          std::function<void(int64_t part_offset, const at::Tensor& values)> take);

class MasterWeights {
 public:
  // This rank's part: `numel` elements, in the optimizer's order (zero::Part offsets); elements
  // no parameter covers (padding) stay zero.
  MasterWeights(int64_t numel, const at::TensorOptions& options);
  // Copies fp32 `values` into the part at `part_offset`.
  void take(int64_t part_offset, const at::Tensor& values);
  // For zero::flatten_parameters when the part is [begin, begin + numel) of one flat buffer:
  // copies the piece of each parameter that falls in that range.
  zero::FlattenTap tap(int64_t begin);
  at::Tensor weights() const { return weights_; }  // [numel] fp32
  // Casts the updated master weights into the parts' parameters (training dtype).
  void publish(const std::vector<zero::Part>& parts) const;
  int64_t bytes() const { return static_cast<int64_t>(weights_.nbytes()); }

 private:
  at::Tensor weights_;
};

}  // namespace dscpp::precision
