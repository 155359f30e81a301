// The gradient shard in memory (grad_shard.h); the one on disk is offload/grad_swapper.cpp.
#include "zero/grad_shard.h"

#include <ATen/ATen.h>

#include "optim/dispatch.h"

namespace dscpp::zero {
namespace {

class MemoryGradShard final : public GradShard {
 public:
  MemoryGradShard(int64_t numel, const at::TensorOptions& options)
      : shard_(at::zeros({numel}, options)) {}
  int64_t numel() const override { return shard_.numel(); }
  at::Tensor tensor() const override { return shard_; }
  void add(int64_t pos, const at::Tensor& piece, double factor) override {
    at::Tensor dst = shard_.narrow(0, pos, piece.numel());
    if (factor != 1.0)
      dst.add_(piece, factor);
    else
      dst.add_(piece);
  }
  void zero() override { shard_.zero_(); }
  int64_t bytes() const override { return static_cast<int64_t>(shard_.nbytes()); }
  at::Tensor read(int64_t pos, int64_t n) override { return shard_.narrow(0, pos, n); }
  double squared_norm() override { return optim::squared_norm(shard_); }

 private:
  at::Tensor shard_;  // [numel] training dtype
};

}  // namespace

std::unique_ptr<GradShard> make_memory_grad_shard(int64_t numel, const at::TensorOptions& options) {
  return std::make_unique<MemoryGradShard>(numel, options);
}

}  // namespace dscpp::zero
