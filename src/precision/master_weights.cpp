// Implements MasterWeights (master_weights.h).
#include "precision/master_weights.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace dscpp::precision {

MasterWeights::MasterWeights(int64_t numel, const at::TensorOptions& options)
    : weights_(at::zeros({numel}, options.dtype(at::kFloat).requires_grad(false))) {}

void MasterWeights::take(int64_t part_offset, const at::Tensor& values) {
  at::NoGradGuard no_grad;
  weights_.narrow(0, part_offset, values.numel()).copy_(values.reshape({-1}));
}

zero::FlattenTap part_tap(int64_t begin, int64_t numel,
                          std::function<void(int64_t part_offset, const at::Tensor& values)> take) {
  return [begin, numel, take = std::move(take)](int64_t offset, const at::Tensor& values) {
    const int64_t end = begin + numel;
    const int64_t lo = std::max(offset, begin), hi = std::min(offset + values.numel(), end);
    if (lo < hi) take(lo - begin, values.narrow(0, lo - offset, hi - lo));
  };
}

zero::FlattenTap MasterWeights::tap(int64_t begin) {
  return part_tap(begin, weights_.numel(),
                  [this](int64_t off, const at::Tensor& v) { take(off, v); });
}

void MasterWeights::publish(const std::vector<zero::Part>& parts) const {
  at::NoGradGuard no_grad;
  for (const auto& p : parts) p.store(0, weights_.narrow(0, p.offset, p.numel()));
}

}  // namespace dscpp::precision
