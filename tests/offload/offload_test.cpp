// Offload to disk (docs/offload.md), ranks as threads: with the fp32 weights and the optimizer
// state in swap files, stepped sub-group by sub-group, training is the same as without offload
// bit for bit at stages 1-3, in fp32 and bf16, at worlds 1 and 2, for every pipeline setting, I/O
// backend and optimizer; a bad swap folder is refused before training with the reason, and a
// disk that fails mid-run (optimizer state or parameter shards) stops every rank with the file
// named. Stage 3's parameters on disk are compared with in memory in tests/zero/stage3_test.cpp.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "dscpp/async_io.h"
#include "dscpp/engine.h"
#include "dscpp/error.h"
#include "engine/test_net.h"
#include "offload/grad_swapper.h"
#include "offload/offload_test_util.h"
#include "offload/optimizer_swapper.h"
#include "offload/param_swapper.h"
#include "optim/dispatch.h"
#include "support/errors.h"
#include "support/fault_async_io.h"
#include "support/temp_dir.h"
#include "support/thread_ranks.h"
#include "zero/grad_shard.h"

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
using testing::TempDir;

constexpr int kSteps = 10;

std::string nvme(const std::string& dir, const std::string& more = "") {
  return "{\"device\": \"nvme\", \"nvme_path\": \"" + dir + "\"" + more + "}";
}

const std::string kPipelined = ", \"pipeline_read\": true, \"pipeline_write\": true";

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
// a folder that cannot be written, a disk too small for the swap file (a 64 KiB tmpfs; needs root
// to mount), a ratio below 1 (the config refuses it below stage 3, check_supported at stage 3).
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

  // A folder that cannot be written (a read-only mount; needs root): the open fails naming it.
  const std::string ro = dir.file("ro");
  std::filesystem::create_directory(ro);
  if (geteuid() == 0 && mount("tmpfs", ro.c_str(), "tmpfs", MS_RDONLY, "size=64k") == 0) {
    auto errs = errors_for(nvme(ro));
    umount(ro.c_str());
    for (const auto& e : errs) {
      EXPECT_TRUE(e.find("dscpp_optimizer_rank") != std::string::npos ||
                  e.find("failed on rank(s)") != std::string::npos)
          << e;
    }
    EXPECT_TRUE(errs[0].find("Read-only file system") != std::string::npos ||
                errs[1].find("Read-only file system") != std::string::npos)
        << errs[0] << "\n"
        << errs[1];
  } else {
    ADD_FAILURE() << "could not mount a read-only tmpfs (needs root): untested here";
  }

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

// Trains with `cfg` on 2 ranks, rank 1's writes failing at the `nth`: the second step must fail
// on both ranks, rank 1 with the disk's error naming its swap file `file`, rank 0 naming rank 1,
// and neither engine may go on. (After the failed step the model's parameters may be released
// and never published, so only the engine is asked again: a forward could fail in torch on their
// empty storage.)
void expect_a_failed_write_stops_every_rank(const std::string& cfg, int64_t nth,
                                            at::ScalarType dtype, const std::string& file) {
  TempDir dir;
  io::FaultAsyncIo failing({io::AioFault::Kind::fail_write, nth}, io::make_async_io({}));
  std::vector<std::string> first(2), next(2);
  auto errors = run_thread_ranks(2, [&](Communicator& c) {
    enginetest::Net net = enginetest::make_net(1);
    InitOptions o = enginetest::borrowed(c);
    if (c.rank() == 1) o.async_io = &failing;
    auto e = initialize(net.ptr(), cfg, o);
    auto X = enginetest::dataset_x().narrow(0, 4 * c.rank(), 4).to(dtype);
    auto Y = enginetest::dataset_y().narrow(0, 4 * c.rank(), 4);
    auto one_step = [&] {
      e->backward(at::mse_loss(net->forward(X).to(at::kFloat), Y));
      e->step();
    };
    one_step();
    first[c.rank()] = error_of([&] { one_step(); });
    next[c.rank()] = error_of([&] { e->backward(at::zeros({}, at::kFloat).requires_grad_()); });
  });
  for (auto& e : errors) EXPECT_FALSE(e) << error_text(e);
  EXPECT_EQ(failing.injected(), 1);
  EXPECT_NE(first[1].find("Input/output error"), std::string::npos) << first[1];
  EXPECT_NE(first[1].find(file), std::string::npos) << first[1];
  EXPECT_NE(first[0].find("offloaded optimizer step 2 failed on rank(s) 1"), std::string::npos)
      << first[0];
  for (const auto& n : next)
    EXPECT_NE(n.find("the engine stopped after an earlier failure"), std::string::npos) << n;
}

// An optimizer swap write that fails in the second step on rank 1 (the first step wrote its 5
// sub-groups).
TEST(Offload, ADiskFailingMidRunStopsEveryRankNamingTheFile) {
  TempDir dir;
  expect_a_failed_write_stops_every_rank(
      config_json(8, 4, kAdamW + zero_cfg(2, nvme(dir.path(), kPipelined))), 7, at::kFloat,
      "dscpp_optimizer_rank1_pid");
}

// A parameter shard write that fails in the second step on rank 1 (stage 3, offload_param nvme,
// every shard on disk; rank 1's writes: its shard at set-up, then one per step).
TEST(Offload, AParameterWriteFailingMidRunStopsEveryRank) {
  TempDir dir;
  expect_a_failed_write_stops_every_rank(
      config_json(8, 4,
                  kAdamW + ", \"bf16\": {\"enabled\": true}" +
                      ", \"zero_optimization\": {\"stage\": 3, "
                      "\"stage3_param_persistence_threshold\": 0, \"offload_param\": {\"device\": "
                      "\"nvme\", \"max_in_cpu\": 0, \"nvme_path\": \"" +
                      dir.path() + "\"}}"),
      3, at::kBFloat16, "dscpp_params_rank1_pid");
}

// Both offloads on nvme: rank 1's gradient shard write fails in the second backward (NOTE
// [gradients on disk]). That backward throws the disk's error naming the file; the step is
// dropped on every rank, naming rank 1; the next window trains on both.
TEST(Offload, AGradientWriteFailingInBackwardDropsTheStepOnEveryRank) {
  TempDir dir;
  io::AioFault fault{io::AioFault::Kind::fail_write, 2};
  fault.only_path = "dscpp_gradients_rank1";
  io::FaultAsyncIo failing(fault, io::make_async_io({}));
  const std::string cfg =
      config_json(8, 4,
                  kAdamW +
                      ", \"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 3, "
                      "\"stage3_param_persistence_threshold\": 0, \"offload_optimizer\": " +
                      nvme(dir.path()) +
                      ", \"offload_param\": " + nvme(dir.path(), ", \"max_in_cpu\": 0") + "}");
  std::vector<std::string> backward_error(2), step_error(2);
  std::vector<double> last_loss(2);
  auto errors = run_thread_ranks(2, [&](Communicator& c) {
    enginetest::Net net = enginetest::make_net(1);
    InitOptions o = enginetest::borrowed(c);
    if (c.rank() == 1) o.async_io = &failing;
    auto e = initialize(net.ptr(), cfg, o);
    auto X = enginetest::dataset_x().narrow(0, 4 * c.rank(), 4).to(at::kBFloat16);
    auto Y = enginetest::dataset_y().narrow(0, 4 * c.rank(), 4);
    for (int s = 0; s < 3; ++s) {
      try {
        e->backward(at::mse_loss(net->forward(X).to(at::kFloat), Y));
      } catch (const IoError& err) {
        backward_error[c.rank()] += err.what();
      }
      try {
        e->step();
        if (s == 2) last_loss[c.rank()] = e->last_step().loss;
      } catch (const Error& err) {
        step_error[c.rank()] += err.what();
      }
    }
  });
  for (auto& e : errors) EXPECT_FALSE(e) << error_text(e);
  EXPECT_EQ(failing.injected(), 1);
  EXPECT_EQ(backward_error[0], "");
  EXPECT_NE(backward_error[1].find("Input/output error"), std::string::npos) << backward_error[1];
  EXPECT_NE(backward_error[1].find("dscpp_gradients_rank1_pid"), std::string::npos)
      << backward_error[1];
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(step_error[r].find("backward() failed on rank(s) 1 in the accumulation window of "
                                 "optimizer step 2"),
              std::string::npos)
        << step_error[r];
    EXPECT_TRUE(std::isfinite(last_loss[r]) && last_loss[r] > 0) << "the next window trains";
  }
}

// The disk filling mid-run (a small tmpfs holding the swap files and the checkpoints; needs root
// to mount): the swap files were reserved at start-up, so training goes on; the checkpoint that
// no longer fits fails on every rank naming the path, `latest` still names the earlier one, and
// it loads and resumes the run bit for bit.
TEST(Offload, AFullDiskFailsTheCheckpointAndKeepsTheEarlierOne) {
  TempDir dir;
  const std::string disk = dir.file("disk");
  std::filesystem::create_directory(disk);
  if (geteuid() != 0 || mount("tmpfs", disk.c_str(), "tmpfs", 0, "size=1m") != 0) {
    ADD_FAILURE() << "could not mount a small tmpfs (needs root): the full disk is untested here";
    return;
  }
  struct Unmount {
    std::string path;
    ~Unmount() { umount(path.c_str()); }
  } unmount{disk};
  const std::string cfg = config_json(8, 4, kAdamW + zero_cfg(2, nvme(disk, kPipelined)));
  const std::string filler = disk + "/filler";
  std::vector<std::string> failed(2), loaded(2);
  std::vector<std::vector<double>> straight(2), resumed(2);
  auto train = [&](Communicator& c, enginetest::Net& net, Engine& e, int steps,
                   std::vector<double>& losses) {
    auto X = enginetest::dataset_x().narrow(0, 4 * c.rank(), 4);
    auto Y = enginetest::dataset_y().narrow(0, 4 * c.rank(), 4);
    for (int s = 0; s < steps; ++s) {
      e.backward(at::mse_loss(net->forward(X), Y));
      e.step();
      losses.push_back(e.last_step().loss);
    }
  };
  auto errors = run_thread_ranks(2, [&](Communicator& c) {
    enginetest::Net net = enginetest::make_net(1);
    auto e = initialize(net.ptr(), cfg, enginetest::borrowed(c));
    std::vector<double> first;
    train(c, net, *e, 2, first);
    e->save_checkpoint(disk + "/ckpt", "early");
    c.barrier()->wait();
    if (c.rank() == 0) {  // fill what is left of the disk
      std::ofstream f(filler, std::ios::binary);
      const std::string mib(1 << 16, 'x');
      while (f.write(mib.data(), static_cast<std::streamsize>(mib.size()))) {
      }
    }
    c.barrier()->wait();
    train(c, net, *e, 2, straight[c.rank()]);
    failed[c.rank()] = error_of([&] { e->save_checkpoint(disk + "/ckpt", "late"); });
    c.barrier()->wait();
    if (c.rank() == 0) std::filesystem::remove(filler);
    c.barrier()->wait();
    // The earlier checkpoint, loaded into a fresh engine, continues as the run did.
    enginetest::Net again = enginetest::make_net(2);
    auto e2 = initialize(again.ptr(), cfg, enginetest::borrowed(c));
    loaded[c.rank()] = e2->load_checkpoint(disk + "/ckpt").path;  // `latest`
    train(c, again, *e2, 2, resumed[c.rank()]);
  });
  for (auto& e : errors) EXPECT_FALSE(e) << error_text(e);
  int full = 0;
  for (const auto& f : failed) {
    full += f.find("No space left on device") != std::string::npos;
    EXPECT_NE(f.find(disk + "/ckpt"), std::string::npos) << f;
  }
  EXPECT_GE(full, 1) << failed[0] << "\n" << failed[1];
  for (const auto& l : loaded) EXPECT_EQ(l, disk + "/ckpt/early");
  EXPECT_EQ(resumed, straight);
}

// The size of the open, unlinked file whose path was `path` (found through /proc/self/fd).
int64_t open_file_size(const std::string& path) {
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(e.path(), ec).string();
    if (!ec && target == path + " (deleted)") {
      struct stat st {};
      if (::stat(e.path().c_str(), &st) == 0) return st.st_size;
    }
  }
  return -1;
}

// A swap file reserves its blocks at once, or with reserve_in_setup as set-up writes its
// sub-groups in order and wholly at the first flush (NOTE [spilled shards]: zero::Init's spill
// empties meanwhile).
TEST(OptimizerSwapper, ReservesAtOnceOrAsSetUpWrites) {
  TempDir dir;
  auto io = io::make_async_io({});
  for (const bool in_setup : {false, true}) {
    offload::SwapperOptions o;
    o.path = dir.file(in_setup ? "later" : "now");
    o.numel = 2500;
    o.names = {"a", "b"};
    o.initial = {0.0f, 0.25f};
    o.sub_group_size = 1000;
    o.reserve_in_setup = in_setup;
    offload::OptimizerSwapper s(*io, o);
    const int64_t whole = s.file_bytes();
    EXPECT_EQ(open_file_size(o.path), in_setup ? 0 : whole);
    s.write(0, 900, at::arange(200, at::kFloat));  // sub-group 0 goes back when 1 is reached
    EXPECT_EQ(open_file_size(o.path), in_setup ? 2 * 4096 : whole);
    s.flush();
    EXPECT_EQ(open_file_size(o.path), whole);
  }
  // A write that fails during set-up surfaces at the first flush(), which every rank reaches,
  // not in the middle of set-up's collectives.
  io::FaultAsyncIo failing({io::AioFault::Kind::fail_write, 1}, io::make_async_io({}));
  offload::SwapperOptions o;
  o.path = dir.file("failing");
  o.numel = 2500;
  o.names = {"a"};
  o.initial = {0.0f};
  o.sub_group_size = 1000;
  o.reserve_in_setup = true;
  offload::OptimizerSwapper s(failing, o);
  EXPECT_NO_THROW(s.write(0, 900, at::arange(1200, at::kFloat)));  // sub-groups 0, 1, 2
  EXPECT_EQ(failing.injected(), 1);
  EXPECT_NE(error_of([&] { s.flush(); }).find("Input/output error"), std::string::npos);
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

// The parameter swapper on its own: shards stored and taken back, a read ahead served to take(),
// the step's puts across shard borders (fp32 values cast to bf16) written once each shard is
// complete, and buffers returning to the pool when the taken tensors go.
TEST(ParamSwapper, StoreTakeReadAheadAndPutAgree) {
  TempDir dir;
  auto io = io::make_async_io({});
  offload::ParamSwapperOptions o;
  o.path = dir.file("params");
  o.numels = {3000, 0, 5000, 10};
  o.dtype = at::kBFloat16;
  o.buffer_count = 2;
  offload::ParamSwapper s(*io, o);
  EXPECT_TRUE(dir.entries().empty()) << "unlinked while open";
  EXPECT_EQ(s.numel(), 8010);
  EXPECT_EQ(s.file_bytes(), 8192 + 0 + 12288 + 4096);
  s.store(0, at::full({3000}, 1.5f));
  s.store(2, at::arange(5000, at::kFloat));
  s.store(3, at::full({10}, -2.0f));
  EXPECT_TRUE(s.read_ahead(2));
  EXPECT_TRUE(s.read_ahead(0));
  EXPECT_FALSE(s.read_ahead(3)) << "two buffers read ahead already";
  at::Tensor two = s.take(2);
  EXPECT_TRUE(
      at::equal(two.to(at::kFloat), at::arange(5000, at::kFloat).to(at::kBFloat16).to(at::kFloat)));
  EXPECT_TRUE(at::equal(s.take(0), at::full({3000}, 1.5f).to(at::kBFloat16)));
  const int64_t pooled = s.buffer_bytes();
  two = at::Tensor();
  // The step: pieces that cross shard borders, front to back.
  at::Tensor values = at::arange(8010, at::kFloat) * 0.5;
  s.put(0, values.narrow(0, 0, 2000));
  s.put(2000, values.narrow(0, 2000, 3500));
  s.put(5500, values.narrow(0, 5500, 2510));
  s.finish();
  EXPECT_TRUE(at::equal(s.take(0), values.narrow(0, 0, 3000).to(at::kBFloat16)));
  EXPECT_TRUE(at::equal(s.take(2), values.narrow(0, 3000, 5000).to(at::kBFloat16)));
  EXPECT_TRUE(at::equal(s.take(3), values.narrow(0, 8000, 10).to(at::kBFloat16)));
  EXPECT_EQ(s.buffer_bytes(), pooled) << "buffers are reused, not reallocated";
  const offload::ParamSwapStats st = s.take_stats();
  EXPECT_EQ(st.reads_ahead, 2);
  EXPECT_EQ(st.reads, 5);
  // A step that wrote only part of the shards is a bug the swapper names.
  s.put(0, values.narrow(0, 0, 10));
  EXPECT_NE(error_of([&] { s.finish(); }).find("wrote 10 of 8010"), std::string::npos);
}

// NOTE [gradients on disk]: the shard on disk holds what the shard in memory holds, bit for bit,
// and gives the same squared norm, whatever order the pieces come in, across block borders,
// with padding no piece fills, pieces smaller and larger than a block, over the micro-steps of a
// window (factor 1, and a factor that must be added in one operation), for any read size, and
// for a window flushed before its boundary (no final backward); its buffers stay within
// buffer_bytes_for; a write that fails surfaces at the end of that backward (naming the file),
// and the next window starts afresh.
TEST(GradSwapper, HoldsWhatTheShardInMemoryHolds) {
  TempDir dir;
  auto io = io::make_async_io({});
  const int64_t block = int64_t{1} << 20;
  const int64_t numel = 2 * block + 333'333;  // the last block short
  // The pieces the reductions fill, [pos, n), with padding between some (stays zero): smaller
  // than a block, or spanning several.
  std::vector<std::pair<int64_t, int64_t>> small, large{{0, 1000}, {1000, numel - 1007}};
  for (int64_t at = 0; at < numel;) {
    const int64_t n = std::min<int64_t>(numel - at, 300'001 + (at % 7) * 10'000);
    small.emplace_back(at, std::max<int64_t>(1, n - (small.size() % 3 == 1 ? 17 : 0)));
    at += n;
  }
  for (const double factor : {1.0, 0.37}) {
    for (const at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
      for (const auto& pieces : {small, large}) {
        const std::string what = std::string(c10::toString(dtype)) + " factor " +
                                 std::to_string(factor) +
                                 (pieces.size() == 2 ? " large" : " small");
        offload::GradSwapperOptions o;
        o.path = dir.file("grads");
        o.numel = numel;
        o.dtype = dtype;
        o.read_elements = 700'000;
        offload::GradSwapper disk(*io, o);
        EXPECT_TRUE(dir.entries().empty()) << "unlinked while open";
        auto memory = zero::make_memory_grad_shard(numel, at::TensorOptions(dtype));
        for (const auto& [pos, n] : pieces) disk.expect(pos, n);
        at::manual_seed(7);
        // Window 2 is flushed before its boundary: none of its backwards is final.
        for (int window = 0; window < 3; ++window) {
          const int gas = window == 1 ? 1 : window == 0 ? 3 : 2;
          for (int micro = 0; micro < gas; ++micro) {
            const bool final = micro == gas - 1 && window != 2;
            disk.begin_backward(final);
            // Backward reduces from the end of the shard; one piece comes late.
            std::vector<size_t> order;
            for (size_t i = pieces.size(); i-- > 0;) order.push_back(i);
            if (order.size() > 2) std::swap(order[1], order.back());
            for (size_t i : order) {
              const auto [pos, n] = pieces[i];
              at::Tensor piece = at::randn({n}).to(dtype);
              memory->add(pos, piece, factor);
              disk.add(pos, piece, factor);
            }
            disk.end_backward();
          }
          at::Tensor want = memory->tensor();
          EXPECT_EQ(disk.squared_norm(), optim::squared_norm(want)) << what;
          for (const int64_t step : {int64_t{700'000}, int64_t{4097}}) {
            for (int64_t pos = 0; pos < numel; pos += step) {
              const int64_t n = std::min(step, numel - pos);
              if (pos + n < numel) disk.read_ahead(pos + n, std::min(step, numel - pos - n));
              ASSERT_TRUE(at::equal(disk.read(pos, n), want.narrow(0, pos, n)))
                  << what << " window " << window << " [" << pos << ", +" << n << ")";
              if (step == 4097 && pos > 3 * 4097) break;  // a few odd reads suffice
            }
          }
          EXPECT_GT(disk.buffer_bytes(), 0);
          EXPECT_LE(disk.buffer_bytes(),
                    offload::GradSwapper::buffer_bytes_for(numel, dtype, o.read_elements))
              << what;
          EXPECT_EQ(disk.bytes(), 0);
          disk.zero();
          memory->zero();
        }
        EXPECT_NE(disk.take_report().find("gradients on disk: wrote"), std::string::npos);
      }
    }
  }
  // The third write fails: the backward's end says so, naming the file; the next window works.
  io::FaultAsyncIo failing({io::AioFault::Kind::fail_write, 3}, io::make_async_io({}));
  offload::GradSwapperOptions o;
  o.path = dir.file("failing");
  o.numel = numel;
  o.read_elements = numel;
  offload::GradSwapper disk(failing, o);
  disk.expect(0, numel);
  for (int window = 0; window < 2; ++window) {
    disk.begin_backward(true);
    disk.add(0, at::ones({numel}, at::kBFloat16), 1.0);
    if (window == 0) {
      const std::string e = error_of([&] { disk.end_backward(); });
      EXPECT_NE(e.find("Input/output error"), std::string::npos) << e;
      EXPECT_NE(e.find("failing"), std::string::npos) << e;
    } else {
      disk.end_backward();
      EXPECT_TRUE(at::equal(disk.read(0, numel), at::ones({numel}, at::kBFloat16)));
      EXPECT_EQ(disk.squared_norm(), double(numel));
    }
    disk.zero();
  }
}

}  // namespace
}  // namespace dscpp
