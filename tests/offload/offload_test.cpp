// Optimizer offload to disk (docs/offload.md), ranks as threads: with the fp32 weights and the
// optimizer state in swap files, stepped sub-group by sub-group, training is the same as without
// offload bit for bit at stages 1-3, in fp32 and bf16, at worlds 1 and 2, for every pipeline
// setting, I/O backend and optimizer; a bad swap folder is refused before training with the
// reason, and a disk that fails mid-run stops every rank with the file named.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "dscpp/engine.h"
#include "dscpp/error.h"
#include "engine/test_net.h"
#include "io/async_io.h"
#include "io/fault_async_io.h"
#include "offload/optimizer_swapper.h"
#include "support/errors.h"
#include "support/temp_dir.h"
#include "support/thread_ranks.h"

namespace dscpp {
namespace {

using comm::Communicator;
using enginetest::config_json;
using enginetest::kAdamW;
using enginetest::run_ranks;
using enginetest::Trajectory;
using testing::error_of;
using testing::error_text;
using testing::run_thread_ranks;
using testing::TempDir;

constexpr int kSteps = 10;

std::string zero_cfg(int stage, const std::string& offload = "", int sub_group = 32) {
  return ", \"zero_optimization\": {\"stage\": " + std::to_string(stage) +
         (stage == 3 ? ", \"stage3_param_persistence_threshold\": 0" : "") +
         (offload.empty() ? ""
                          : ", \"sub_group_size\": " + std::to_string(sub_group) +
                                ", \"offload_optimizer\": " + offload) +
         "}";
}

std::string nvme(const std::string& dir, const std::string& more = "") {
  return "{\"device\": \"nvme\", \"nvme_path\": \"" + dir + "\"" + more + "}";
}

const std::string kPipelined = ", \"pipeline_read\": true, \"pipeline_write\": true";

// Bit for bit: every loss and grad norm, and the final parameters.
void expect_identical(const std::vector<Trajectory>& got, const std::vector<Trajectory>& ref,
                      const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (size_t r = 0; r < got.size(); ++r) {
    ASSERT_EQ(got[r].losses.size(), ref[r].losses.size()) << what;
    for (size_t i = 0; i < ref[r].losses.size(); ++i) {
      EXPECT_EQ(got[r].losses[i], ref[r].losses[i]) << what << " rank " << r << " step " << i;
      EXPECT_EQ(got[r].grad_norms[i], ref[r].grad_norms[i]) << what << " rank " << r;
    }
    EXPECT_TRUE(at::equal(got[r].params, ref[r].params)) << what << " rank " << r;
  }
}

// The part of every rank is 140 elements at world 2 (280 at world 1): with sub-groups of 32 the
// pipeline cycles through 5 (9) of them, the last one short, and at stage 3 a sub-group spans
// the parts of two parameters.
TEST(Offload, NvmeOptimizerIsBitExactAtStages1To3InFp32AndBf16AtWorlds1And2) {
  TempDir dir;
  for (int stage : {1, 2, 3}) {
    for (const char* dtype : {"fp32", "bf16"}) {
      for (int world : {1, 2}) {
        const std::string prec =
            std::string(dtype) == "bf16" ? ", \"bf16\": {\"enabled\": true}" : "";
        const std::string what =
            "stage " + std::to_string(stage) + " " + dtype + " world " + std::to_string(world);
        auto ref =
            run_ranks(world, kSteps, config_json(8, 4 / world, kAdamW + prec + zero_cfg(stage)));
        auto got =
            run_ranks(world, kSteps,
                      config_json(8, 4 / world,
                                  kAdamW + prec + zero_cfg(stage, nvme(dir.path(), kPipelined))));
        expect_identical(got, ref, what);
        for (const auto& t : got) {
          EXPECT_EQ(t.memory.optimizer_state, 0) << what;
          EXPECT_EQ(t.memory.master, 0) << what;
          EXPECT_GT(t.memory.offload_buffers, 0) << what;
        }
        EXPECT_TRUE(dir.entries().empty()) << what << ": the swap files are unlinked while open";
      }
    }
  }
}

// Every pipeline setting (DeepSpeed's defaults pipeline nothing), buffer count and I/O backend,
// with GAS 2, gives the same bits; so do sub-groups of 7 elements, which the SIMD kernels step
// in their scalar tails (NOTE [position-independent rounding]), in fp32 and bf16.
TEST(Offload, EveryPipelineSettingAndBackendGivesTheSameBits) {
  TempDir dir;
  const std::string base = kAdamW + ", \"bf16\": {\"enabled\": true}";
  auto ref = run_ranks(2, kSteps, config_json(8, 2, base + zero_cfg(2)));
  for (const std::string more :
       {std::string(""), ", \"buffer_count\": 1" + kPipelined, ", \"buffer_count\": 2" + kPipelined,
        std::string(", \"pipeline_read\": true"), std::string(", \"pipeline_write\": true")}) {
    auto got = run_ranks(2, kSteps, config_json(8, 2, base + zero_cfg(2, nvme(dir.path(), more))));
    expect_identical(got, ref, "offload_optimizer" + more);
  }
  // The thread-pool fallback, with a slow disk: the same bits, only later.
  io::AioFault slow{io::AioFault::Kind::slow};
  slow.delay_ms = 5;
  io::FaultAsyncIo threads(slow, io::make_async_io({}, io::AioBackend::threads));
  auto got =
      run_ranks(2, kSteps, config_json(8, 2, base + zero_cfg(2, nvme(dir.path(), kPipelined))),
                [&](InitOptions& o) { o.async_io = &threads; });
  expect_identical(got, ref, "thread-pool backend, slow disk");
  for (const std::string prec : {std::string(""), std::string(", \"bf16\": {\"enabled\": true}")}) {
    auto ref7 = run_ranks(2, kSteps, config_json(8, 2, kAdamW + prec + zero_cfg(1)));
    auto got7 = run_ranks(
        2, kSteps, config_json(8, 2, kAdamW + prec + zero_cfg(1, nvme(dir.path(), kPipelined), 7)));
    expect_identical(got7, ref7, "sub-groups of 7" + prec);
  }
}

// Optimizers whose state starts at a non-zero value (Adagrad's accumulator), whose state is
// one tensor (SGD's momentum, Lion) or none (SGD without momentum).
TEST(Offload, EveryOptimizersStateSwapsBitExact) {
  TempDir dir;
  for (const std::string opt :
       {std::string("{\"type\": \"Adagrad\", \"params\": {\"lr\": 0.05, "
                    "\"initial_accumulator_value\": 0.1}}"),
        std::string("{\"type\": \"SGD\", \"params\": {\"lr\": 0.05, \"momentum\": 0.9}}"),
        std::string("{\"type\": \"SGD\", \"params\": {\"lr\": 0.05}}"),
        std::string("{\"type\": \"Lion\", \"params\": {\"lr\": 0.001}}")}) {
    const std::string base = ", \"optimizer\": " + opt;
    auto ref = run_ranks(2, kSteps, config_json(8, 4, base + zero_cfg(1)));
    auto got =
        run_ranks(2, kSteps, config_json(8, 4, base + zero_cfg(1, nvme(dir.path(), kPipelined))));
    expect_identical(got, ref, opt);
  }
}

// offload_optimizer cpu with a model on the CPU: the state is already in CPU memory; accepted
// and the same training.
TEST(Offload, CpuDeviceWithACpuModelTrainsAsWithout) {
  auto ref = run_ranks(2, 4, config_json(8, 4, kAdamW + zero_cfg(2)));
  auto got = run_ranks(2, 4, config_json(8, 4, kAdamW + zero_cfg(2, "{\"device\": \"cpu\"}")));
  expect_identical(got, ref, "offload_optimizer cpu");
}

// Start-up errors, on every rank, before a step: a missing folder, a file instead of a folder,
// a disk too small for the swap file (a 64 KiB tmpfs; needs root to mount), a ratio below 1
// (the config refuses it below stage 3, check_supported at stage 3).
TEST(Offload, BadSwapFoldersAreRefusedBeforeTraining) {
  TempDir dir;
  auto errors_for = [&](const std::string& offload) {
    std::vector<std::string> out(2);
    auto errors = run_thread_ranks(2, [&](Communicator& c) {
      out[c.rank()] = error_of([&] {
        enginetest::Net net = enginetest::make_net(1);
        initialize(net.ptr(), config_json(8, 4, kAdamW + zero_cfg(2, offload)),
                   enginetest::borrowed(c));
      });
    });
    for (auto& e : errors) EXPECT_FALSE(e) << error_text(e);
    return out;
  };
  for (const auto& e : errors_for(nvme(dir.file("missing")))) {
    EXPECT_NE(e.find("nvme_path '" + dir.file("missing") + "' does not exist"), std::string::npos)
        << e;
  }
  std::ofstream(dir.file("plain")) << "x";
  for (const auto& e : errors_for(nvme(dir.file("plain"))))
    EXPECT_NE(e.find("is not a directory"), std::string::npos) << e;
  for (const auto& e :
       errors_for("{\"device\": \"nvme\", \"nvme_path\": \"" + dir.path() + "\", \"ratio\": 0.5}"))
    EXPECT_NE(e.find("offload_optimizer.ratio 0.5"), std::string::npos) << e;

  const std::string small = dir.file("small");
  std::filesystem::create_directory(small);
  if (geteuid() == 0 && mount("tmpfs", small.c_str(), "tmpfs", 0, "size=64k") == 0) {
    auto errs = errors_for(nvme(small));
    umount(small.c_str());
    // The file needs 2 states x 5 sub-groups x 4 KiB = 40 KiB per rank: the first rank's fits,
    // the second's does not; that rank names the bytes, the other names it.
    int full = 0, named = 0;
    for (const auto& e : errs) {
      full += e.find("reserving 40960 bytes for '" + small) != std::string::npos &&
              e.find("No space left on device") != std::string::npos;
      named +=
          e.find("swap file in offload_optimizer.nvme_path failed on rank(s)") != std::string::npos;
    }
    EXPECT_EQ(full, 1) << errs[0] << "\n" << errs[1];
    EXPECT_EQ(named, 1) << errs[0] << "\n" << errs[1];
  } else {
    ADD_FAILURE() << "could not mount a small tmpfs (needs root): the disk-too-small case is "
                     "untested here";
  }
}

// A write that fails in the middle of the second step on rank 1: rank 1 throws the disk's error
// naming its swap file, rank 0 names rank 1, and neither engine takes another step.
TEST(Offload, ADiskFailingMidRunStopsEveryRankNamingTheFile) {
  TempDir dir;
  io::FaultAsyncIo failing({io::AioFault::Kind::fail_write, 7}, io::make_async_io({}));
  std::vector<std::string> first(2), next(2);
  auto errors = run_thread_ranks(2, [&](Communicator& c) {
    enginetest::Net net = enginetest::make_net(1);
    InitOptions o = enginetest::borrowed(c);
    if (c.rank() == 1) o.async_io = &failing;
    auto e = initialize(net.ptr(),
                        config_json(8, 4, kAdamW + zero_cfg(2, nvme(dir.path(), kPipelined))), o);
    auto X = enginetest::dataset_x().narrow(0, 4 * c.rank(), 4);
    auto Y = enginetest::dataset_y().narrow(0, 4 * c.rank(), 4);
    auto one_step = [&] {
      e->backward(at::mse_loss(net->forward(X), Y));
      e->step();
    };
    one_step();  // writes 5 sub-groups
    first[c.rank()] = error_of([&] { one_step(); });
    next[c.rank()] = error_of([&] { one_step(); });
  });
  for (auto& e : errors) EXPECT_FALSE(e) << error_text(e);
  EXPECT_EQ(failing.injected(), 1);
  EXPECT_NE(first[1].find("Input/output error"), std::string::npos) << first[1];
  EXPECT_NE(first[1].find("dscpp_optimizer_rank1_pid"), std::string::npos) << first[1];
  EXPECT_NE(first[0].find("offloaded optimizer step 2 failed on rank(s) 1"), std::string::npos)
      << first[0];
  for (const auto& n : next)
    EXPECT_NE(n.find("the engine stopped after an earlier failure"), std::string::npos) << n;
}

// The swapper on its own: values written through the cursor across sub-group borders come back
// from the file after a pipelined pass, and a sub-group never written reads the initial values.
TEST(OptimizerSwapper, CursorAndPipelineAgree) {
  TempDir dir;
  auto io = io::make_async_io({});
  offload::SwapperOptions o;
  o.path = dir.file("swap");
  o.numel = 2500;
  o.names = {"a", "b"};
  o.initial = {0.0f, 0.25f};
  o.sub_group_size = 1000;
  offload::OptimizerSwapper s(*io, o);
  EXPECT_EQ(s.sub_groups(), 3);
  EXPECT_EQ(s.file_bytes(), 2 * (4096 + 4096) + 2 * 4096);
  s.write(0, 900, at::arange(200, at::kFloat));  // spans sub-groups 0 and 1
  s.flush();
  std::vector<int64_t> seen;
  s.for_each_sub_group([&](int64_t begin, int64_t length, const std::vector<at::Tensor>& t) {
    seen.push_back(begin);
    if (begin == 0) EXPECT_EQ(t[0][950].item<float>(), 50.0f);
    if (begin == 2000) EXPECT_EQ(t[1][0].item<float>(), 0.25f);  // never written
    EXPECT_EQ(length, begin == 2000 ? 500 : 1000);
    t[1].add_(1.0f);
  });
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1000, 2000}));
  at::Tensor back = at::empty({200}, at::kFloat), b = at::empty({10}, at::kFloat);
  s.read(0, 900, back);
  EXPECT_TRUE(at::equal(back, at::arange(200, at::kFloat)));
  s.read(1, 2490, b);
  EXPECT_TRUE(at::equal(b, at::full({10}, 1.25f)));
  const offload::SwapStats st = s.take_stats();
  EXPECT_GT(st.bytes_written, 0);
  EXPECT_GT(st.bytes_read, 0);
}

}  // namespace
}  // namespace dscpp
