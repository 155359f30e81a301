// The gradient paths themselves (src/zero/reducer.h and the stage families' reducers), on one
// or two thread ranks: buckets launch while backward runs, the bucket cap, and stage 2's
// gradients going straight into the staging slots (NOTE [stage 2 slots]).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>

#include "engine/test_net.h"
#include "support/errors.h"
#include "support/thread_ranks.h"
#include "zero/all_reduce.h"
#include "zero/partition.h"
#include "zero/reduce_scatter.h"

namespace dscpp {
namespace {

using comm::Communicator;
using testing::error_text;
using testing::run_thread_ranks;

using namespace enginetest;  // NOLINT: the fixtures of this file's tests

// The gradient path of `stage` over `module`'s parameters, moved into one flat buffer.
std::unique_ptr<zero::GradReducer> make_reducer(torch::nn::Module& module, Communicator& c,
                                                int stage, const zero::ReduceOptions& o) {
  zero::NamedParams np = zero::trainable_parameters(module);
  auto layout = zero::FlatLayout::of(np.params, c.world_size());
  zero::flatten_parameters(np.params, np.names, layout, o.dtype);
  if (stage == 0) {
    return std::make_unique<zero::AllReduceReducer>(np.params, np.names, layout.segments,
                                                    layout.padded, c, o);
  }
  if (stage == 1) {
    return std::make_unique<zero::InPlaceReducer>(np.params, np.names, layout.segments,
                                                  layout.padded, c, o);
  }
  return std::make_unique<zero::SlotReducer>(
      np.params, np.names, layout.segments,
      std::vector<zero::GroupGeometry>{{0, layout.padded, layout.shard, 0}}, std::vector<int>{}, c,
      o);
}

// Buckets are reduced while backward runs, not after it: parameters the loss cannot reach (the
// unused `branch`, registered last, so in the first bucket to launch) are ready before backward
// starts and hold nothing back. Every stage, one parameter per bucket.
TEST(ZeroReducer, BucketsLaunchDuringBackwardDespiteAnUnusedParameter) {
  auto errors = run_thread_ranks(1, [&](Communicator& c) {
    for (int stage : {0, 1, 2}) {
      Net net = make_net(1);
      const size_t n = net->parameters().size();
      zero::ReduceOptions o;
      o.reduce_bucket_size = 1;
      o.overlap_comm = true;
      auto reducer_ptr = make_reducer(*net, c, stage, o);
      auto& reducer = *reducer_ptr;
      ASSERT_EQ(reducer.num_buckets(), n);
      at::Tensor loss =
          at::mse_loss(net->forward(dataset_x().narrow(0, 0, 2)), dataset_y().narrow(0, 0, 2));
      reducer.prepare_backward(true, loss);
      EXPECT_EQ(reducer.buckets_launched(), 2u) << "the unused branch's weight and bias";
      // fc1.weight's gradient is the last one autograd produces: every other bucket has been
      // launched from the hooks by the time backward returns.
      loss.backward();
      EXPECT_GE(reducer.buckets_launched(), n - 1) << "stage " << stage;
      reducer.finish_backward();
      EXPECT_EQ(reducer.buckets_launched(), n);
      EXPECT_EQ(reducer.unused_in_last_backward(),
                (std::vector<std::string>{"branch.weight", "branch.bias"}));
    }
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
}

// NOTE [bucket cap]: DeepSpeed's default buckets (5e8 elements) are cut to a sixteenth of the
// model, never below 2^20 elements; smaller values are kept.
TEST(ZeroReducer, BucketsAboveASixteenthOfTheModelAreCapped) {
  EXPECT_EQ(zero::capped_bucket_size(500000000, 151681024), 9480064);
  EXPECT_EQ(zero::capped_bucket_size(5000000, 151681024), 5000000);
  EXPECT_EQ(zero::capped_bucket_size(500000000, 280), int64_t{1} << 20);
  EXPECT_EQ(zero::capped_bucket_size(8, 280), 8);
}

// NOTE [stage 2 slots]: gradients that arrive in bucket order go straight into the staging
// slots (autograd keeps none), with one slot (overlap_comm false) or two.
TEST(ZeroReducer, Stage2GradientsGoStraightIntoTheStagingSlots) {
  auto errors = run_thread_ranks(2, [&](Communicator& c) {
    for (bool overlap : {false, true}) {
      Net net = make_net(1);
      zero::ReduceOptions o;
      o.reduce_bucket_size = 144;  // {branch, fc2} and {fc1}
      o.overlap_comm = overlap;
      auto reducer_ptr = make_reducer(*net, c, 2, o);
      auto& reducer = dynamic_cast<zero::SlotReducer&>(*reducer_ptr);
      ASSERT_EQ(reducer.num_buckets(), 2u);
      EXPECT_EQ(reducer.staging_bytes(), (overlap ? 2 : 1) * 4 * 144);
      for (int step = 0; step < 2; ++step) {
        at::Tensor loss = at::mse_loss(net->forward(dataset_x().narrow(0, 2 * c.rank(), 2)),
                                       dataset_y().narrow(0, 2 * c.rank(), 2));
        reducer.prepare_backward(true, loss);
        loss.backward();
        reducer.finish_backward();
        EXPECT_EQ(reducer.kept_gradients(), 0) << "overlap " << overlap;
        for (auto& p : net->parameters())
          EXPECT_FALSE(p.grad().defined()) << "a gradient outlived its bucket";
      }
    }
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
}

// A model registered against the order backward reaches it (ReversedNet): with one slot, {out}
// takes it first and the other three buckets' gradients (mid's and in's four parameters) arrive
// while it still accumulates, so autograd keeps them. StagesTest's
// Stage2MatchesStage0WhenGradientsArriveOutOfBucketOrder shows the result is still exact.
TEST(ZeroReducer, GradientsArrivingOutOfBucketOrderAreKeptThenCopied) {
  auto errors = run_thread_ranks(1, [&](Communicator& c) {
    ReversedNet net = make_reversed_net();
    zero::ReduceOptions o;
    o.reduce_bucket_size = 150;  // {in}, {mid.bias}, {mid.weight}, {out}
    auto reducer_ptr = make_reducer(*net, c, 2, o);
    auto& reducer = dynamic_cast<zero::SlotReducer&>(*reducer_ptr);
    ASSERT_EQ(reducer.num_buckets(), 4u);
    at::Tensor loss =
        at::mse_loss(net->forward(dataset_x().narrow(0, 0, 2)), dataset_y().narrow(0, 0, 2));
    reducer.prepare_backward(true, loss);
    loss.backward();
    reducer.finish_backward();
    EXPECT_EQ(reducer.kept_gradients(), 4);
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
}

// NOTE [first gradient is written]: at stages 0-1 a new window leaves .grad undefined (no
// memset); the first gradient of each parameter is copied into its place in the buffer, later
// ones accumulate; a parameter without a gradient is reduced as zeros. The sums are those of
// plain autograd accumulation over the same micro-steps.
TEST(ZeroReducer, FirstGradientOfAWindowIsWrittenLaterOnesAccumulate) {
  auto errors = run_thread_ranks(1, [&](Communicator& c) {
    for (int stage : {0, 1}) {
      Net net = make_net(1), twin = make_net(1);
      zero::ReduceOptions o;
      o.reduce_bucket_size = 1;
      auto reducer = make_reducer(*net, c, stage, o);
      auto micro = [&](Net& m, int64_t from, bool branch) {
        return at::mse_loss(m->forward(dataset_x().narrow(0, from, 2), branch),
                            dataset_y().narrow(0, from, 2));
      };
      for (int window = 0; window < 2; ++window) {
        reducer->zero_grads();
        twin->zero_grad();
        for (const auto& p : net->parameters()) EXPECT_FALSE(p.grad().defined());
        // Micro-step 1 uses the branch, micro-step 2 does not; the branch's bias and weight
        // still hold the first step's gradient at the boundary.
        reducer->prepare_backward(false);
        micro(net, 4 * window, true).backward();
        reducer->finish_backward();
        micro(twin, 4 * window, true).backward();
        reducer->prepare_backward(true);
        at::Tensor loss = micro(net, 4 * window + 2, false);
        loss.backward();
        reducer->finish_backward();
        micro(twin, 4 * window + 2, false).backward();
        auto mine = net->named_parameters(), want = twin->named_parameters();
        for (const auto& item : want) {
          const at::Tensor g = mine[item.key()].grad();
          ASSERT_TRUE(g.defined()) << item.key();
          EXPECT_TRUE(at::allclose(g, item.value().grad(), 1e-6, 1e-7))
              << "stage " << stage << " window " << window << " " << item.key();
        }
      }
      // A window where the branch gets no gradient at all: reduced as zeros.
      reducer->zero_grads();
      reducer->prepare_backward(true);
      micro(net, 0, false).backward();
      reducer->finish_backward();
      EXPECT_TRUE(at::equal(net->branch->weight.grad(), at::zeros_like(net->branch->weight)));
    }
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
}

// The same at stage 2 (NOTE [stage 2 slots]): each backward's first gradient of a parameter is
// copied into its place in a reused slot, and a parameter without one (the branch, in the second
// micro-step) is reduced as zeros, not as what the slot held from an earlier bucket; the shard
// sums the micro-steps as plain autograd does.
TEST(ZeroReducer, Stage2SlotsTakeTheFirstGradientAndZeroAnUnusedPlace) {
  auto errors = run_thread_ranks(1, [&](Communicator& c) {
    Net net = make_net(1), twin = make_net(1);
    zero::NamedParams np = zero::trainable_parameters(*twin);
    const auto segments = zero::FlatLayout::of(np.params, 1).segments;
    zero::ReduceOptions o;
    o.reduce_bucket_size = 1;  // a bucket per parameter, all through the one slot
    auto reducer_ptr = make_reducer(*net, c, 2, o);
    auto& reducer = dynamic_cast<zero::SlotReducer&>(*reducer_ptr);
    auto micro = [&](Net& m, int64_t from, bool branch) {
      return at::mse_loss(m->forward(dataset_x().narrow(0, from, 2), branch),
                          dataset_y().narrow(0, from, 2));
    };
    for (int window = 0; window < 2; ++window) {
      reducer.zero_grads();
      twin->zero_grad();
      for (bool branch : {true, false}) {
        at::Tensor loss = micro(net, 4 * window + (branch ? 0 : 2), branch);
        reducer.prepare_backward(true, loss);
        loss.backward();
        reducer.finish_backward();
        micro(twin, 4 * window + (branch ? 0 : 2), branch).backward();
      }
      EXPECT_EQ(reducer.kept_gradients(), 0);
      for (size_t i = 0; i < np.params.size(); ++i) {
        const auto [off, n] = segments[i];
        EXPECT_TRUE(at::allclose(reducer.grad_shard().narrow(0, off, n),
                                 np.params[i].grad().reshape({-1}), 1e-6, 1e-7))
            << "window " << window << " " << np.names[i];
      }
    }
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
}

// Two parameters of 300 and 150 elements, the wire-dtype tests' model.
struct TwoVectors : torch::nn::Module {
  TwoVectors() {
    w = register_parameter("w", at::zeros({300}));
    v = register_parameter("v", at::zeros({150}));
  }
  at::Tensor w, v;
};

// NOTE [wire dtype]: with communication_data_type fp32, bf16 gradients are reduced in fp32 and
// rounded once, which across hosts (Gloo sums bf16 in bf16, host by host) differs from reducing
// them in bf16. Three hosts of one rank, each rank's gradients multiples of 1/64 (exact in bf16,
// their sums exact in fp32): with the fp32 wire every stage's reduced gradient is the fp32 mean
// rounded to bf16 exactly; with the bf16 wire it is not (the test's power), two buckets each.
TEST(ZeroReducer, AWireDtypeOfItsOwnReducesInIt) {
  constexpr int kWorld = 3;
  auto gradient = [](int rank, int64_t n, int which) {
    at::Tensor k = (at::arange(n, at::kLong) * (37 + 11 * rank) + 13 * which) % 512 - 256;
    return (k.to(at::kFloat) / 64).to(at::kBFloat16);
  };
  // The reference: the mean over ranks in fp32, rounded once; this rank's gradient of it.
  auto mean = [&](int64_t n, int which) {
    at::Tensor sum = at::zeros({n});
    for (int r = 0; r < kWorld; ++r) sum += gradient(r, n, which).to(at::kFloat);
    return (sum / kWorld).to(at::kBFloat16);
  };
  for (bool fp32_wire : {true, false}) {
    std::vector<int64_t> mismatched(kWorld, 0);
    auto errors = testing::run_thread_ranks_with(
        testing::on_hosts(1), kWorld, [&](Communicator& c) {
          for (int stage : {0, 1, 2}) {
            TwoVectors net;
            zero::ReduceOptions o;
            o.dtype = at::kBFloat16;
            if (fp32_wire) o.wire_dtype = at::kFloat;
            o.reduce_bucket_size = 150;  // w and v in a bucket each
            auto reducer = make_reducer(net, c, stage, o);
            at::Tensor loss = (net.w * gradient(c.rank(), 300, 0)).sum() +
                              (net.v * gradient(c.rank(), 150, 1)).sum();
            reducer->prepare_backward(true, loss);
            loss.backward();
            reducer->finish_backward();
            const at::Tensor want = at::cat({mean(300, 0), mean(150, 1)});
            at::Tensor got;
            if (stage == 0) {
              got = at::cat({net.w.grad(), net.v.grad()});
            } else {
              const int64_t shard = 450 / kWorld;
              got = stage == 1 ? dynamic_cast<zero::InPlaceReducer&>(*reducer).grad_shard()
                               : dynamic_cast<zero::SlotReducer&>(*reducer).grad_shard();
              got = got.narrow(0, 0, shard);
              ASSERT_EQ(got.scalar_type(), at::kBFloat16);
              mismatched[c.rank()] +=
                  got.ne(want.narrow(0, c.rank() * shard, shard)).sum().item<int64_t>();
              continue;
            }
            ASSERT_EQ(got.scalar_type(), at::kBFloat16);
            mismatched[c.rank()] += got.ne(want).sum().item<int64_t>();
          }
        });
    for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
    for (int r = 0; r < kWorld; ++r) {
      if (fp32_wire) {
        EXPECT_EQ(mismatched[r], 0) << "rank " << r;
      } else {
        EXPECT_GT(mismatched[r], 10) << "rank " << r << ": bf16 sums round as fp32's";
      }
    }
  }
}

// torch_autocast (NOTE [autocast]): a parameter's own wire dtype. In fp32 training w's gradient
// is reduced in bf16 (each rank's rounded, the mean rounded once) and v's in fp32 (exact: the
// gradients' fp32 sums are), in buckets of their own however large reduce_bucket_size is.
// Neither gradient is representable in bf16, so rounding v, or not rounding w, shows. One host:
// shared memory sums in fp32 and rounds once (across hosts bf16 is summed hop by hop).
TEST(ZeroReducer, EachParameterReducesInItsOwnWireDtype) {
  constexpr int kWorld = 3;
  auto gradient = [](int rank, int64_t n, int which) {
    at::Tensor k = (at::arange(n, at::kLong) * (37 + 11 * rank) + 13 * which) % 512 - 256;
    return k.to(at::kFloat) / 64 * (1 + 1.0 / 1024);
  };
  auto mean = [&](int64_t n, int which, bool bf16) {
    at::Tensor sum = at::zeros({n});
    for (int r = 0; r < kWorld; ++r) {
      const at::Tensor g = gradient(r, n, which);
      sum += bf16 ? g.to(at::kBFloat16).to(at::kFloat) : g;
    }
    sum /= kWorld;
    return bf16 ? sum.to(at::kBFloat16).to(at::kFloat) : sum;
  };
  const at::Tensor want = at::cat({mean(300, 0, true), mean(150, 1, false)});
  std::vector<int64_t> mismatched(kWorld, 0);
  auto errors = run_thread_ranks(kWorld, [&](Communicator& c) {
    for (int stage : {0, 1, 2}) {
      TwoVectors net;
      zero::ReduceOptions o;
      o.wire_dtype_of["w"] = at::kBFloat16;
      auto reducer = make_reducer(net, c, stage, o);
      EXPECT_EQ(reducer->num_buckets(), 2u) << "stage " << stage;
      at::Tensor loss =
          (net.w * gradient(c.rank(), 300, 0)).sum() + (net.v * gradient(c.rank(), 150, 1)).sum();
      reducer->prepare_backward(true, loss);
      loss.backward();
      reducer->finish_backward();
      if (stage == 0) {
        mismatched[c.rank()] +=
            at::cat({net.w.grad(), net.v.grad()}).ne(want).sum().item<int64_t>();
        continue;
      }
      const int64_t shard = 450 / kWorld;
      at::Tensor got = stage == 1 ? dynamic_cast<zero::InPlaceReducer&>(*reducer).grad_shard()
                                  : dynamic_cast<zero::SlotReducer&>(*reducer).grad_shard();
      ASSERT_EQ(got.scalar_type(), at::kFloat);
      mismatched[c.rank()] +=
          got.narrow(0, 0, shard).ne(want.narrow(0, c.rank() * shard, shard)).sum().item<int64_t>();
    }
  });
  for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(mismatched[r], 0) << "rank " << r;
  EXPECT_FALSE(at::equal(mean(300, 0, true), mean(300, 0, false))) << "the test has no power";
  EXPECT_FALSE(at::equal(mean(150, 1, true), mean(150, 1, false))) << "the test has no power";
}

// NOTE [accumulation dtype]: stage 1 with an fp32 gradient buffer under bf16 parameters sums
// the micro-steps' bf16 gradients in fp32 (the buffer is never a .grad), and the reduced shard
// is the fp32 mean of those sums; a bf16 buffer rounds each partial sum (the test's power).
// Gradients are multiples of 1/64, so every fp32 sum here is exact.
TEST(ZeroReducer, Stage1AccumulatesInTheBuffersDtype) {
  struct OneVector : torch::nn::Module {
    OneVector() { w = register_parameter("w", at::zeros({256})); }
    at::Tensor w;
  };
  constexpr int kWorld = 2, kMicro = 8;
  auto gradient = [](int rank, int micro) {
    at::Tensor k = (at::arange(256, at::kLong) * (29 + 7 * rank + 3 * micro) + micro) % 512 - 256;
    return (k.to(at::kFloat) / 64).to(at::kBFloat16);
  };
  at::Tensor want = at::zeros({256});
  for (int r = 0; r < kWorld; ++r)
    for (int m = 0; m < kMicro; ++m) want += gradient(r, m).to(at::kFloat);
  want /= kWorld;
  for (bool fp32 : {true, false}) {
    std::vector<int64_t> mismatched(kWorld, 0);
    auto errors = run_thread_ranks(kWorld, [&](Communicator& c) {
      OneVector net;
      zero::ReduceOptions o;
      o.dtype = at::kBFloat16;
      if (fp32) o.accumulate_dtype = at::kFloat;
      auto reducer = make_reducer(net, c, 1, o);
      for (int m = 0; m < kMicro; ++m) {
        at::Tensor loss = (net.w * gradient(c.rank(), m)).sum();
        reducer->prepare_backward(m == kMicro - 1, loss);
        loss.backward();
        reducer->finish_backward();
        EXPECT_EQ(net.w.grad().defined(), !fp32) << "micro-step " << m;
      }
      const at::Tensor shard = dynamic_cast<zero::InPlaceReducer&>(*reducer).grad_shard();
      ASSERT_EQ(shard.scalar_type(), fp32 ? at::kFloat : at::kBFloat16);
      const int64_t n = shard.numel();
      mismatched[c.rank()] = shard.to(at::kFloat).ne(want.narrow(0, c.rank() * n, n)).sum().item<int64_t>();
      EXPECT_EQ(reducer->grad_bytes(), 256 * (fp32 ? 4 : 2));
    });
    for (auto& e : errors) ASSERT_FALSE(e) << error_text(e);
    for (int r = 0; r < kWorld; ++r) {
      if (fp32) {
        EXPECT_EQ(mismatched[r], 0) << "rank " << r;
      } else {
        EXPECT_GT(mismatched[r], 10) << "rank " << r << ": bf16 sums round as fp32's";
      }
    }
  }
}

}  // namespace
}  // namespace dscpp
