// ZeRO stages 1 and 2: every rank holds every parameter, but the fp32 master weights and the
// optimizer state are split into world-size shards of the flat buffer (NOTE [flat partition]);
// each rank updates its shard and the ranks all-gather the updated parameters (shard_all_gather.h).
//   stage 1: gradients accumulate in a full buffer and are reduce-scattered in place during the
//            boundary backward (InPlaceReducer);
//   stage 2: gradients accumulate in staging slots and are reduce-scattered in every backward
//            into a gradient shard (SlotReducer), so no rank holds the full gradient.
#include <ATen/ATen.h>

#include "dscpp/error.h"
#include "zero/reduce_scatter.h"
#include "zero/shard_all_gather.h"
#include "zero/strategy.h"

namespace dscpp::zero {
namespace {

class Stage1And2 final : public Strategy {
 public:
  Stage1And2(NamedParams np, const FlatLayout& layout, comm::Communicator& comm,
             const StrategyOptions& options, const FlattenTap& tap)
      : layout_(layout),
        comm_(comm),
        group_(checkpoint_group("model", np, layout, layout.shard_offset(comm.rank()), layout.shard,
                                0)),
        allgather_bucket_size_(options.allgather_bucket_size),
        flat_(flatten_parameters(np.params, np.names, layout, options.reduce.dtype, tap)) {
    if (options.stage == 1) {
      auto r =
          std::make_unique<InPlaceReducer>(std::move(np.params), std::move(np.names),
                                           layout.segments, layout.padded, comm, options.reduce);
      grad_shard_ = r->grad_shard();
      in_place_ = r.get();
      reducer_ = std::move(r);
    } else {
      auto r = std::make_unique<SlotReducer>(
          std::move(np.params), std::move(np.names), layout.segments,
          std::vector<GroupGeometry>{{0, layout.padded, layout.shard, 0}}, std::vector<int>{}, comm,
          options.reduce);
      grad_shard_ = r->grad_shard();
      reducer_ = std::move(r);
    }
  }

  int64_t numel() const override { return layout_.numel; }
  int64_t part_numel() const override { return layout_.shard; }
  bool replicated() const override { return false; }
  int64_t part_begin() const override { return layout_.shard_offset(comm_.rank()); }
  at::Tensor flat_params() const override { return flat_.narrow(0, 0, layout_.numel); }
  at::TensorOptions options() const override { return flat_.options(); }

  GradReducer& reducer() override { return *reducer_; }
  bool reduces_every_backward() const override { return in_place_ == nullptr; }
  void reduce_accumulated() override {
    DSCPP_CHECK(in_place_, Error, "internal: stage 2 reduces in every backward");
    in_place_->reduce_all_now();
  }

  std::vector<Part> parts() override {
    return {Part{flat_.narrow(0, part_begin(), layout_.shard), grad_shard_, 0}};
  }
  void publish_params() override {
    gather_in_place(comm_, flat_, layout_.shard, allgather_bucket_size_);
  }
  int64_t param_bytes() const override { return static_cast<int64_t>(flat_.nbytes()); }
  std::vector<CheckpointGroup> checkpoint_groups() const override { return {group_}; }

 private:
  FlatLayout layout_;
  comm::Communicator& comm_;
  CheckpointGroup group_;
  int64_t allgather_bucket_size_;
  at::Tensor flat_;        // [padded] the parameters' storage
  at::Tensor grad_shard_;  // [shard] this rank's averaged gradient
  std::unique_ptr<GradReducer> reducer_;
  InPlaceReducer* in_place_ = nullptr;  // stage 1
};

}  // namespace

std::unique_ptr<Strategy> make_stage1_2(NamedParams np, const FlatLayout& layout,
                                        comm::Communicator& comm, const StrategyOptions& options,
                                        const FlattenTap& tap) {
  return std::make_unique<Stage1And2>(std::move(np), layout, comm, options, tap);
}

}  // namespace dscpp::zero
