// ZeRO stage 0, data parallelism: every rank holds every parameter, gradient and optimizer state.
// Gradients accumulate in a full buffer and are all-reduced bucket by bucket during the boundary
// backward (all_reduce.h); each rank then updates everything.
#include <ATen/ATen.h>

#include "zero/all_reduce.h"
#include "zero/strategy.h"

namespace dscpp::zero {
namespace {

class Stage0 final : public Strategy {
 public:
  Stage0(NamedParams np, const FlatLayout& layout, comm::Communicator& comm,
         const StrategyOptions& options, const FlattenTap& tap)
      : layout_(layout),
        group_(checkpoint_group("model", np, layout, 0, layout.numel, 0)),
        flat_(flatten_parameters(np.params, np.names, layout, options.reduce.dtype, tap)),
        reducer_(std::move(np.params), std::move(np.names), layout.segments, layout.padded, comm,
                 options.reduce, options.side_channel) {}

  int64_t numel() const override { return layout_.numel; }
  int64_t part_numel() const override { return layout_.numel; }
  bool replicated() const override { return true; }
  int64_t part_begin() const override { return 0; }
  std::vector<std::pair<int64_t, int64_t>> optimizer_segments() const override {
    return layout_.segments;
  }
  at::Tensor flat_params() const override { return flat_.narrow(0, 0, layout_.numel); }
  at::TensorOptions options() const override { return flat_.options(); }

  GradReducer& reducer() override { return reducer_; }
  bool reduces_every_backward() const override { return false; }
  void reduce_accumulated() override { reducer_.reduce_all_now(); }
  at::Tensor side_channel() const override { return reducer_.side_channel(); }

  std::vector<Part> parts() override {
    return {Part{flat_params(), reducer_.grads().narrow(0, 0, layout_.numel), 0}};
  }
  void publish_params() override {}  // every rank updated everything
  std::vector<CheckpointGroup> checkpoint_groups() const override { return {group_}; }
  int64_t param_bytes() const override { return static_cast<int64_t>(flat_.nbytes()); }

 private:
  FlatLayout layout_;
  CheckpointGroup group_;
  at::Tensor flat_;  // [padded] the parameters' storage
  AllReduceReducer reducer_;
};

}  // namespace

std::unique_ptr<Strategy> make_stage0(NamedParams np, const FlatLayout& layout,
                                      comm::Communicator& comm, const StrategyOptions& options,
                                      const FlattenTap& tap) {
  return std::make_unique<Stage0>(std::move(np), layout, comm, options, tap);
}

}  // namespace dscpp::zero
