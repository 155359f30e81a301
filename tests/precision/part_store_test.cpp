// The part stores (src/precision/part_store.h) step bit for bit alike: wherever the fp32 values
// and the optimizer's states live (the parameters, master weights, the swap file with or without
// the values), the same gradients give the same parameters, values and states; and a checkpoint's
// view of them (values(), read()) and write() followed by publish() round-trip.
#include "precision/part_store.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "dscpp/async_io.h"
#include "dscpp/config.h"
#include "dscpp/optim.h"
#include "offload/optimizer_swapper.h"
#include "support/temp_dir.h"

using dscpp::testing::TempDir;

namespace dscpp {
namespace {

using precision::kValues;

// The part's pieces: three parts (stage 3's units), sub-groups of 600 elements spanning them.
const std::vector<int64_t> kOffsets{0, 700, 1500}, kNumels{700, 800, 517};
constexpr int64_t kPartNumel = 2017;
constexpr int64_t kSubGroup = 600;

struct Kind {
  std::string name;
  at::ScalarType dtype;
  bool nvme, params_on_disk;
};

class PartStores : public ::testing::TestWithParam<std::string> {};

// Where the fp32 values and states live, per store: the trajectory after three steps.
struct Trajectory {
  at::Tensor params;                 // the parts' parameters, concatenated (training dtype)
  at::Tensor values;                 // fp32 [kPartNumel]
  std::vector<at::Tensor> states;    // the optimizer's, fp32 [kPartNumel] each
  std::vector<at::Tensor> reloaded;  // params after write(values * 2) and publish()
};

Trajectory run(const Kind& k, const std::string& optimizer, const std::string& dir) {
  auto io = io::make_async_io({});
  OptimizerConfig oc;
  oc.type = optimizer;
  oc.adam.lr = 1e-2;
  oc.adam.weight_decay = 0.1;
  oc.sgd.lr = 1e-2;
  oc.sgd.momentum = 0.9;
  precision::PartStoreOptions o;
  o.dtype = k.dtype;
  o.nvme = k.nvme;
  o.params_on_disk = k.params_on_disk;
  o.sub_group_size = kSubGroup;
  o.make_swapper = [&](int64_t numel, bool with_values) {
    offload::SwapperOptions so;
    so.path = dir + "/" + k.name + ".swp";
    so.numel = numel;
    if (with_values) {
      so.names.push_back("fp32 weights");
      so.initial.push_back(0.0f);
    }
    for (const auto& [name, t] : optim::make_optimizer(oc, 1, at::kFloat)->state()) {
      so.names.push_back(name);
      so.initial.push_back(t.item<float>());
    }
    so.sub_group_size = kSubGroup;
    return std::make_unique<offload::OptimizerSwapper>(*io, so);
  };
  auto store = precision::make_part_store(o);
  const zero::PartTap tap = store->open(kPartNumel);

  // The parts as a strategy lays them out: rank 0's fp32 values handed to the tap, the parameters
  // cast into the training dtype.
  at::Tensor fp32 =
      at::randn({kPartNumel}, at::TensorOptions().dtype(at::kFloat).requires_grad(false));
  at::Tensor params = fp32.to(k.dtype), grads = at::zeros({kPartNumel}, k.dtype);
  std::vector<zero::Part> parts;
  for (size_t i = 0; i < kOffsets.size(); ++i) {
    zero::Part p;
    p.params = params.narrow(0, kOffsets[i], kNumels[i]);
    p.grads = grads.narrow(0, kOffsets[i], kNumels[i]);
    p.offset = kOffsets[i];
    parts.push_back(p);
    if (tap) tap(p.offset, fp32.narrow(0, p.offset, p.numel()));
  }
  EXPECT_EQ(tap == nullptr, k.dtype == at::kFloat && !k.params_on_disk);
  store->flush();

  auto opt =
      optim::make_optimizer(oc, store->holds_optimizer_states() ? 0 : kPartNumel, at::kFloat);
  for (int step = 1; step <= 3; ++step) {
    at::manual_seed(100 + step);
    grads.copy_(at::randn({kPartNumel}).to(k.dtype));
    optim::StepContext ctx;
    ctx.lr = 1e-2;
    ctx.step = step;
    ctx.grad_scale = 2.0;
    store->step(*opt, parts, ctx);
  }

  Trajectory t;
  t.params = params.clone();
  auto fetch = [&](const std::string& what, const at::Tensor& memory) {
    if (!store->on_disk(what)) return memory.clone();
    at::Tensor out = at::empty({kPartNumel}, at::kFloat);
    store->read(what, 0, out);
    return out;
  };
  if (store->on_disk(kValues)) {
    t.values = fetch(kValues, at::Tensor());
  } else {  // a view per part (in the parameters, the parts are apart)
    t.values = at::empty({kPartNumel}, at::kFloat);
    for (const auto& p : parts)
      t.values.narrow(0, p.offset, p.numel()).copy_(store->values(parts, p.offset, p.numel()));
  }
  // (An optimizer built for no elements still names its states.)
  for (const auto& [name, state] : opt->state()) t.states.push_back(fetch(name, state));
  // A load: new values written where they live, then the parameters cast from them.
  at::Tensor doubled = t.values * 2;
  if (store->on_disk(kValues)) {
    store->write(kValues, 0, doubled);
  } else {
    for (const auto& p : parts)
      store->values(parts, p.offset, p.numel()).copy_(doubled.narrow(0, p.offset, p.numel()));
  }
  store->publish(parts);
  t.reloaded.push_back(params.clone());
  t.reloaded.push_back(doubled.to(k.dtype));
  return t;
}

void expect_same(const Trajectory& a, const Trajectory& b, const std::string& what) {
  EXPECT_TRUE(at::equal(a.params, b.params)) << what << ": parameters";
  EXPECT_TRUE(at::equal(a.values, b.values)) << what << ": fp32 values";
  ASSERT_EQ(a.states.size(), b.states.size()) << what;
  for (size_t i = 0; i < a.states.size(); ++i)
    EXPECT_TRUE(at::equal(a.states[i], b.states[i])) << what << ": state " << i;
  EXPECT_TRUE(at::equal(a.reloaded[0], a.reloaded[1])) << what << ": publish after a load";
}

TEST_P(PartStores, StepBitForBitAlike) {
  const std::string optimizer = GetParam();
  TempDir dir;
  // fp32: the parameters are the values; the swap file holds the states only, or the values too
  // when the parameters are on disk. bf16: master weights in memory (AdamW's fused pass) or the
  // swap file.
  const std::vector<std::vector<Kind>> families{
      {{"params", at::kFloat, false, false},
       {"swap_states", at::kFloat, true, false},
       {"swap_values", at::kFloat, true, true}},
      {{"master", at::kBFloat16, false, false}, {"swap_bf16", at::kBFloat16, true, false}},
  };
  for (const auto& family : families) {
    std::vector<Trajectory> runs;
    for (const auto& k : family) {
      at::manual_seed(7);
      runs.push_back(run(k, optimizer, dir.path()));
      if (runs.size() == 1) {
        // The step moved the parameters, and the states hold something.
        EXPECT_FALSE(at::equal(runs[0].values, at::zeros({kPartNumel}))) << k.name;
        ASSERT_FALSE(runs[0].states.empty()) << k.name;
        EXPECT_GT(runs[0].states[0].abs().sum().item<double>(), 0) << k.name;
      }
      expect_same(runs[0], runs.back(), family[0].name + " vs " + k.name + " (" + optimizer + ")");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, PartStores, ::testing::Values("AdamW", "SGD"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace dscpp
