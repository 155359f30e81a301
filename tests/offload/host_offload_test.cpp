// Offload to CPU memory of a model on a device (offload_optimizer.device "cpu", NOTE [host step]
// in src/precision/part_store.cpp), tested without a GPU: the stand-in link
// (tests/support/stand_in_link.h) makes the CPU act as one, with its own host buffers and copies
// done late on worker threads. Training is the same as without offload bit for bit at stages 1-3,
// in fp32, bf16 and fp16, at worlds 1 and 2, with GAS; the gradients go down before the step and
// the parameters come up while it runs; a copy that fails stops every rank with its cause.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "dscpp/engine.h"
#include "dscpp/error.h"
#include "engine/test_net.h"
#include "offload/offload_test_util.h"
#include "support/errors.h"
#include "support/stand_in_link.h"
#include "support/temp_dir.h"
#include "support/thread_ranks.h"

namespace dscpp {
namespace {

using comm::Communicator;
using enginetest::config_json;
using enginetest::kAdamW;
using enginetest::run_ranks;
using offloadtest::expect_identical;
using offloadtest::zero_cfg;
using testing::error_of;
using testing::error_text;
using testing::run_thread_ranks;
using testing::StandInLink;
using testing::StandInOptions;

constexpr int kSteps = 6;

const std::string kCpu = "{\"device\": \"cpu\", \"pin_memory\": true}";

// A stand-in per rank, each copy 100 us late.
struct Links {
  explicit Links(int world, StandInOptions o = {std::chrono::microseconds(100)}) {
    for (int r = 0; r < world; ++r) links.push_back(std::make_unique<StandInLink>(o));
  }
  std::function<void(InitOptions&)> adjust() {
    return [this](InitOptions& o) { o.device_link = links.at(o.comm->rank()).get(); };
  }
  std::vector<std::unique_ptr<StandInLink>> links;
};

// The part of every rank is 140 elements at world 2 (280 at world 1): sub-groups of 32 cut it in
// 5 (9), the last short, and at stage 3 a sub-group spans two parameters' parts.
TEST(HostOffload, StandInIsBitExactAtStages1To3InFp32AndBf16AtWorlds1And2) {
  for (int stage : {1, 2, 3}) {
    for (const std::string dtype : {"fp32", "bf16"}) {
      for (int world : {1, 2}) {
        const std::string prec = dtype == "bf16" ? ", \"bf16\": {\"enabled\": true}" : "";
        const std::string what =
            "stage " + std::to_string(stage) + " " + dtype + " world " + std::to_string(world);
        auto ref =
            run_ranks(world, kSteps, config_json(8, 4 / world, kAdamW + prec + zero_cfg(stage)));
        Links links(world);
        auto got = run_ranks(world, kSteps,
                             config_json(8, 4 / world, kAdamW + prec + zero_cfg(stage, kCpu)),
                             links.adjust());
        expect_identical(got, ref, what);
        const int64_t elem = dtype == "bf16" ? 2 : 4;
        for (int r = 0; r < world; ++r) {
          const MemoryStats& m = got[r].memory;
          // fp32 values and Adam's two states in host memory, the gradients' host buffer too.
          EXPECT_EQ(m.optimizer_state, 2 * m.master) << what;
          EXPECT_GT(m.master, 0) << what;
          EXPECT_EQ(m.host, m.master + m.optimizer_state + m.offload_buffers) << what;
          // Each step every element of the part goes down once and up once.
          const StandInLink& l = *links.links[r];
          EXPECT_GT(l.bytes(true), 0) << what;
          EXPECT_EQ(l.bytes(true), l.bytes(false)) << what;
          EXPECT_EQ(l.bytes(true) % (kSteps * elem), 0) << what;
          EXPECT_LE(l.bytes(true) / kSteps, m.master / 4 * elem) << what;
        }
      }
    }
  }
}

// The optimizer's swap file for a model on a device (offload_optimizer nvme, ZeRO-Infinity): the
// gradients come down and the parameters go up as in host memory, the sub-groups read from and
// written to disk. Bit for bit at stages 1-3, fp32 and bf16, world 2, pipelined and not.
TEST(HostOffload, SwapFileForAModelOnADeviceIsBitExact) {
  testing::TempDir dir;
  for (int stage : {1, 2, 3}) {
    for (const std::string dtype : {"fp32", "bf16"}) {
      const std::string prec = dtype == "bf16" ? ", \"bf16\": {\"enabled\": true}" : "";
      const std::string pipe =
          stage == 2 ? "" : ", \"pipeline_read\": true, \"pipeline_write\": true";
      const std::string what = "stage " + std::to_string(stage) + " " + dtype;
      auto ref = run_ranks(2, kSteps, config_json(8, 2, kAdamW + prec + zero_cfg(stage)));
      Links links(2);
      auto got =
          run_ranks(2, kSteps,
                    config_json(8, 2,
                                kAdamW + prec +
                                    zero_cfg(stage, "{\"device\": \"nvme\", \"nvme_path\": \"" +
                                                        dir.path() + "\"" + pipe + "}")),
                    links.adjust());
      expect_identical(got, ref, what);
      for (int r = 0; r < 2; ++r) {
        EXPECT_EQ(got[r].memory.optimizer_state, 0) << what;  // on disk
        EXPECT_GT(got[r].memory.host, 0) << what;
        EXPECT_EQ(links.links[r]->bytes(true), links.links[r]->bytes(false)) << what;
        EXPECT_GT(links.links[r]->bytes(true), 0) << what;
      }
    }
  }
}

// GAS 2 (the gradients go down once per window), fp16 whose first steps overflow (a dropped
// window's copies are drained), SGD with momentum and Lion (one state), pageable memory, one
// sub-group for the whole part, and sub-groups of 7 elements (the kernels' scalar tails).
TEST(HostOffload, AccumulationOverflowOptimizersAndBufferSettingsGiveTheSameBits) {
  struct Case {
    std::string name, base;
    int stage, sub_group;
    std::string offload;
  };
  const std::string fp16 =
      ", \"fp16\": {\"enabled\": true, \"initial_scale_power\": 18, \"hysteresis\": 1, "
      "\"loss_scale_window\": 2}";
  const std::string sgd =
      ", \"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.05, "
      "\"momentum\": 0.9}}";
  const std::string lion = ", \"optimizer\": {\"type\": \"Lion\", \"params\": {\"lr\": 0.001}}";
  const std::vector<Case> cases = {
      {"fp16 overflowing", kAdamW + fp16, 2, 32, kCpu},
      {"SGD momentum", sgd, 1, 32, kCpu},
      {"Lion bf16", lion + ", \"bf16\": {\"enabled\": true}", 3, 32, kCpu},
      {"pageable, one sub-group", kAdamW + ", \"bf16\": {\"enabled\": true}", 2, 1000000,
       "{\"device\": \"cpu\"}"},
      {"sub-groups of 7, 2 buffers", kAdamW + ", \"bf16\": {\"enabled\": true}", 3, 7,
       "{\"device\": \"cpu\", \"pin_memory\": true, \"buffer_count\": 2}"},
  };
  for (const auto& c : cases) {
    for (int gas : {1, 2}) {
      const std::string what = c.name + " GAS " + std::to_string(gas);
      auto ref = run_ranks(2, kSteps, config_json(8, 4 / gas, c.base + zero_cfg(c.stage)));
      Links links(2);
      auto got = run_ranks(
          2, kSteps, config_json(8, 4 / gas, c.base + zero_cfg(c.stage, c.offload, c.sub_group)),
          links.adjust());
      expect_identical(got, ref, what);
      for (const auto& t : got) EXPECT_EQ(t.skipped, ref[0].skipped) << what;
      if (c.name == "fp16 overflowing") EXPECT_GT(ref[0].skipped, 0) << what;
      // One sub-group: one buffer for the parameters going up besides the gradients' (bf16: each
      // the part's length x 2 bytes, together the fp32 values' bytes).
      if (c.name == "pageable, one sub-group") {
        for (const auto& t : got) EXPECT_EQ(t.memory.offload_buffers, t.memory.master) << what;
      }
    }
  }
}

// The order of events on the link in one step: every gradient goes down before the first
// parameter goes up (the copies down are issued as soon as the reductions are done, before the
// statistics are summed); parameters go up while later sub-groups still step (a copy up is
// issued before the last copy down is waited for); with pin_memory the gradients' buffer is
// page-locked, without it only the buffers the parameters go up from.
TEST(HostOffload, GradientsGoDownBeforeTheStepAndParametersUpDuringIt) {
  for (const bool pinned : {true, false}) {
    Links links(1, StandInOptions{std::chrono::microseconds(200)});
    const std::string off = pinned ? kCpu : "{\"device\": \"cpu\"}";
    auto got = run_ranks(
        1, 1, config_json(8, 4, kAdamW + ", \"bf16\": {\"enabled\": true}" + zero_cfg(2, off)),
        links.adjust());
    ASSERT_EQ(got.size(), 1u);
    const auto events = links.links[0]->events();
    int64_t last_down_issue = -1, first_up_issue = -1, last_down_wait = -1, downs = 0, ups = 0;
    for (size_t i = 0; i < events.size(); ++i) {
      const auto& e = events[i];
      const auto at = static_cast<int64_t>(i);
      if (e.kind == StandInLink::Event::issued && e.to_host) last_down_issue = at, ++downs;
      if (e.kind == StandInLink::Event::issued && !e.to_host) {
        ++ups;
        if (first_up_issue < 0) first_up_issue = at;
      }
      if (e.kind == StandInLink::Event::waited && e.to_host) last_down_wait = at;
    }
    EXPECT_EQ(downs, 9) << "280 elements in sub-groups of 32";
    EXPECT_EQ(ups, 9);
    EXPECT_LT(last_down_issue, first_up_issue);
    EXPECT_LT(first_up_issue, last_down_wait);
    const MemoryStats& m = got[0].memory;
    const int64_t grads_host = 2 * m.master / 4;  // bf16, the part's length
    if (pinned) {
      EXPECT_GE(links.links[0]->pinned_bytes(), grads_host);
    } else {
      EXPECT_LT(links.links[0]->pinned_bytes(), grads_host);
      EXPECT_GT(links.links[0]->pinned_bytes(), 0);
    }
  }
}

// Bytes of copies down issued so far.
int64_t issued_down(const StandInLink& l) {
  int64_t b = 0;
  for (const auto& e : l.events()) {
    if (e.kind == StandInLink::Event::issued && e.to_host) b += e.bytes;
  }
  return b;
}

// Each piece of the gradient goes down the moment its reduction is done in the boundary's
// backward (NOTE [final pieces]), not at the step: with GAS 2, nothing after the first backward,
// the part's gradients (but the padding, which no reduction returns) once the second returns,
// the rest with the step. Stages 1-3, reduce buckets of 64 elements (several pieces). Without
// pin_memory everything goes down at the step (pageable copies would stall backward on a GPU).
TEST(HostOffload, GradientsGoDownAsTheirReductionsFinish) {
  for (int stage : {1, 2, 3, 4}) {  // 4: stage 2 with pageable memory
    const bool pageable = stage == 4;
    const std::string what = "stage " + std::to_string(stage);
    Links links(2);
    std::vector<int64_t> after_first(2), after_boundary(2), after_step(2), part(2);
    std::string zero = pageable ? zero_cfg(2, "{\"device\": \"cpu\"}") : zero_cfg(stage, kCpu);
    zero.insert(zero.size() - 1, ", \"reduce_bucket_size\": 64");
    auto errors = run_thread_ranks(2, [&](Communicator& c) {
      enginetest::Net net = enginetest::make_net(1);
      InitOptions o = enginetest::borrowed(c);
      links.adjust()(o);
      auto e = initialize(net.ptr(),
                          config_json(8, 2, kAdamW + ", \"bf16\": {\"enabled\": true}" + zero), o);
      const StandInLink& l = *links.links[c.rank()];
      for (int micro = 0; micro < 2; ++micro) {
        auto X = enginetest::dataset_x().narrow(0, 4 * c.rank() + 2 * micro, 2).to(at::kBFloat16);
        auto Y = enginetest::dataset_y().narrow(0, 4 * c.rank() + 2 * micro, 2);
        e->backward(at::mse_loss(net->forward(X).to(at::kFloat), Y));
        (micro == 0 ? after_first : after_boundary)[c.rank()] = issued_down(l);
        e->step();
      }
      after_step[c.rank()] = issued_down(l);
      part[c.rank()] = e->memory_stats().master / 4;
    });
    for (auto& e : errors) EXPECT_FALSE(e) << error_text(e);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(after_first[r], 0) << what << " rank " << r;
      if (pageable) {
        EXPECT_EQ(after_boundary[r], 0) << what << " rank " << r;
      } else {
        EXPECT_GE(after_boundary[r], 2 * (part[r] - 2)) << what << " rank " << r;
      }
      EXPECT_EQ(after_step[r], 2 * part[r]) << what << " rank " << r;
    }
  }
}

// A copy that fails on rank 1 in the second step: the step fails on both ranks, rank 1 with the
// copy's error, rank 0 naming rank 1, and neither engine goes on.
TEST(HostOffload, AFailingCopyStopsEveryRankWithTheCause) {
  for (const int fail : {12, 15}) {  // step 2 issues copies 10-19: 5 down, then 5 up
    Links links(2);
    links.links[1] =
        std::make_unique<StandInLink>(StandInOptions{std::chrono::microseconds(50), fail});
    std::vector<std::string> first(2), next(2);
    auto errors = run_thread_ranks(2, [&](Communicator& c) {
      enginetest::Net net = enginetest::make_net(1);
      InitOptions o = enginetest::borrowed(c);
      o.device_link = links.links[c.rank()].get();
      auto e = initialize(net.ptr(), config_json(8, 4, kAdamW + zero_cfg(2, kCpu)), o);
      auto X = enginetest::dataset_x().narrow(0, 4 * c.rank(), 4);
      auto Y = enginetest::dataset_y().narrow(0, 4 * c.rank(), 4);
      auto one_step = [&] {
        e->backward(at::mse_loss(net->forward(X), Y));
        e->step();
      };
      one_step();
      first[c.rank()] = error_of([&] { one_step(); });
      next[c.rank()] = error_of([&] { e->backward(at::zeros({}, at::kFloat).requires_grad_()); });
    });
    for (auto& e : errors) EXPECT_FALSE(e) << error_text(e);
    EXPECT_NE(first[1].find("the stand-in link's copy " + std::to_string(fail)), std::string::npos)
        << first[1];
    EXPECT_NE(first[1].find("injected"), std::string::npos) << first[1];
    EXPECT_NE(first[0].find("offloaded optimizer step 2 failed on rank(s) 1"), std::string::npos)
        << first[0];
    for (const auto& n : next)
      EXPECT_NE(n.find("the engine stopped after an earlier failure"), std::string::npos) << n;
  }
}

// A link for another device than the model's is refused before anything is built; so is
// offload_param cpu in fp32 with the optimizer's fp32 weights on the device (the optimizer would
// update parameters that are in host memory).
TEST(HostOffload, MismatchesAreRefusedAtStartUp) {
  struct OtherLink final : public offload::DeviceLink {
    at::Device device() const override { return at::Device(at::kCUDA, 0); }
    std::string describe() const override { return "other"; }
    at::Tensor host_empty(int64_t, at::ScalarType, bool) override { return {}; }
    offload::CopyHandle to_host(const at::Tensor&, const at::Tensor&) override { return {}; }
    offload::CopyHandle to_device(const at::Tensor&, const at::Tensor&) override { return {}; }
  } other;
  StandInLink stand_in;
  auto error_for = [&](offload::DeviceLink* link, const std::string& zero) {
    std::string out;
    auto errors = run_thread_ranks(1, [&](Communicator& c) {
      out = error_of([&] {
        enginetest::Net net = enginetest::make_net(1);
        InitOptions o = enginetest::borrowed(c);
        o.device_link = link;
        initialize(net.ptr(), config_json(8, 8, kAdamW + zero), o);
      });
    });
    for (auto& e : errors) EXPECT_FALSE(e) << error_text(e);
    return out;
  };
  const std::string e1 = error_for(&other, zero_cfg(2, kCpu));
  EXPECT_NE(e1.find("InitOptions::device_link copies to and from cuda:0 but the model is on cpu"),
            std::string::npos)
      << e1;
  const std::string e2 = error_for(
      &stand_in,
      ", \"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"cpu\"}}");
  EXPECT_NE(e2.find("offload_param.device \"cpu\" in fp32 needs offload_optimizer.device \"cpu\""),
            std::string::npos)
      << e2;
}

}  // namespace
}  // namespace dscpp
