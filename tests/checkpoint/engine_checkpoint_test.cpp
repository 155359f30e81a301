// Checkpoints end to end, ranks as threads (docs/checkpoint.md): a resume continues bit for bit
// at every stage, dtype and GAS; a checkpoint loads at another world size and stage; bad input
// and failed saves give clear errors and lose nothing.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <tuple>

#include "checkpoint/checkpoint_test_net.h"
#include "checkpoint/verify.h"
#include "dscpp/engine.h"
#include "dscpp/zero.h"
#include "engine/test_net.h"
#include "support/errors.h"
#include "support/fault_file_system.h"
#include "support/stand_in_link.h"
#include "support/temp_dir.h"
#include "support/thread_ranks.h"

namespace dscpp {
namespace {

using comm::Communicator;
using enginetest::borrowed;
using enginetest::config_json;
using enginetest::dataset_x;
using enginetest::dataset_y;
using testing::error_of;
using testing::error_text;
using testing::run_thread_ranks;
using testing::TempDir;
using namespace ckpttest;  // NOLINT: the shared model and loop

struct ResumeCase {
  int stage;
  std::string dtype;
  int gas;
};

// Run 2K steps straight; run K, save, throw the engine and model away, build new ones (from
// other initial values), load, run K more: the last K losses, grad norms, loss scales and the
// final parameters and buffers are identical bit for bit.
TEST(EngineCheckpoint, ResumeIsBitExactAtEveryStageDtypeAndGas) {
  constexpr int kWorld = 2, K = 4;
  std::vector<ResumeCase> cases;
  for (int stage : {0, 1, 2, 3})
    for (const char* dtype : {"fp32", "bf16", "fp16"})
      for (int gas : {1, 3}) cases.push_back({stage, dtype, gas});
  for (const auto& cs : cases) {
    const std::string what =
        "stage " + std::to_string(cs.stage) + " " + cs.dtype + " gas " + std::to_string(cs.gas);
    const std::string cfg =
        config_json(kWorld * 2 * cs.gas, 2, kOpt + stage_cfg(cs.stage) + dtype_cfg(cs.dtype));
    // fp16: overflows before and after the save, so the loss scaler's state matters.
    auto overflow = [&](int s) { return cs.dtype == "fp16" && (s == 1 || s == 5) ? s % 2 : -1; };
    TempDir dir_tmp;
    const std::string dir = dir_tmp.path();
    std::vector<Record> straight(kWorld), resumed(kWorld);
    on_ranks(
        kWorld,
        [&](Communicator& c) {
          CkptNet net;
          auto e = initialize(net.ptr(), cfg, borrowed(c));
          train_steps(*e, net, 0, 2 * K, straight[c.rank()], overflow);
        },
        what + " straight");
    on_ranks(
        kWorld,
        [&](Communicator& c) {
          Record first;
          CkptNet net;
          auto e = initialize(net.ptr(), cfg, borrowed(c));
          train_steps(*e, net, 0, K, first, overflow);
          EXPECT_EQ(e->save_checkpoint(dir, "", {{"epoch", 3}}),
                    dir + "/global_step" + std::to_string(K));
        },
        what + " first half");
    on_ranks(
        kWorld,
        [&](Communicator& c) {
          CkptNet net(0.25);  // other initial values, parameters and buffers: all must be loaded
          auto e = initialize(net.ptr(), cfg, borrowed(c));
          LoadResult got = e->load_checkpoint(dir);
          EXPECT_EQ(got.path, dir + "/global_step" + std::to_string(K));
          EXPECT_EQ(got.client_state.value("epoch", 0), 3);
          EXPECT_EQ(e->global_steps(), K);
          train_steps(*e, net, K, 2 * K, resumed[c.rank()], overflow);
        },
        what + " second half");
    for (int r = 0; r < kWorld; ++r) {
      const Record& a = straight[r];
      const Record& b = resumed[r];
      ASSERT_EQ(b.losses.size(), static_cast<size_t>(K)) << what;
      for (int i = 0; i < K; ++i) {
        EXPECT_EQ(b.losses[i], a.losses[K + i]) << what << " loss at step " << K + i + 1;
        if (!std::isnan(a.norms[K + i]))
          EXPECT_EQ(b.norms[i], a.norms[K + i]) << what << " step " << K + i + 1;
        EXPECT_EQ(b.scales[i], a.scales[K + i]) << what << " loss scale at step " << K + i + 1;
      }
      EXPECT_TRUE(at::equal(b.state, a.state))
          << what << " rank " << r << ": final state differs by "
          << (b.state - a.state).abs().max().item<double>();
      EXPECT_EQ(b.skipped, a.skipped) << what;
      EXPECT_EQ(b.global_samples, a.global_samples) << what;
    }
    if (cs.dtype == "fp16")
      EXPECT_EQ(straight[0].skipped, 2) << what << ": the overflows did not happen";
  }
}

// Saved at one world size and stage with optimizer `opt`, loaded at another with no conversion:
// the continued trajectory matches the uninterrupted run. Also across transports: saved by 4
// ranks on two simulated hosts (the hierarchy, NOTE [hierarchical collectives]) and loaded on
// one host.
void expect_loads_at_another_world_size_and_stage(const std::string& opt) {
  constexpr int K = 3, B = 12;
  struct Layout {
    int world, stage;
    int per_host = 0;  // > 0: simulated hosts of this many ranks
  };
  auto cfg_for = [&opt](Layout l) { return config_json(B, B / l.world, opt + stage_cfg(l.stage)); };
  for (Layout saved : {Layout{2, 2}, Layout{3, 3}, Layout{4, 3, 2}}) {
    std::vector<Record> straight(saved.world);
    on_ranks(
        saved.world,
        [&](Communicator& c) {
          CkptNet net;
          auto e = initialize(net.ptr(), cfg_for(saved), borrowed(c));
          train_steps(*e, net, 0, 2 * K, straight[c.rank()]);
        },
        "straight", saved.per_host);
    TempDir dir_tmp;
    const std::string dir = dir_tmp.path();
    on_ranks(
        saved.world,
        [&](Communicator& c) {
          Record first;
          CkptNet net;
          auto e = initialize(net.ptr(), cfg_for(saved), borrowed(c));
          train_steps(*e, net, 0, K, first);
          e->save_checkpoint(dir);
        },
        "save", saved.per_host);
    const std::vector<Layout> targets =
        saved.stage == 2 ? std::vector<Layout>{{3, 1}, {1, 0}, {4, 2}, {2, 3}, {4, 3, 2}}
        : saved.per_host ? std::vector<Layout>{{4, 3}, {2, 2}}
                         : std::vector<Layout>{{2, 1}};
    for (Layout to : targets) {
      auto hosts = [](Layout l) { return l.per_host ? " on 2 hosts" : ""; };
      const std::string what = "saved at " + std::to_string(saved.world) + " ranks stage " +
                               std::to_string(saved.stage) + hosts(saved) + ", loaded at " +
                               std::to_string(to.world) + " ranks stage " +
                               std::to_string(to.stage) + hosts(to);
      std::vector<Record> resumed(to.world);
      on_ranks(
          to.world,
          [&](Communicator& c) {
            CkptNet net(0.25);
            auto e = initialize(net.ptr(), cfg_for(to), borrowed(c));
            e->load_checkpoint(dir);
            train_steps(*e, net, K, 2 * K, resumed[c.rank()]);
          },
          what, to.per_host);
      const Record& ref = straight[0];
      for (int r = 0; r < to.world; ++r) {
        for (int i = 0; i < K; ++i) {
          EXPECT_NEAR(resumed[r].losses[i], ref.losses[K + i], 1e-6 * std::abs(ref.losses[K + i]))
              << what;
          EXPECT_NEAR(resumed[r].norms[i], ref.norms[K + i], 1e-6 * std::abs(ref.norms[K + i]))
              << what;
        }
        const double err = (resumed[r].state - ref.state).abs().max().item<double>();
        EXPECT_LE(err, 1e-6 * ref.state.abs().max().item<double>()) << what << " rank " << r;
      }
    }
  }
}

TEST(EngineCheckpoint, LoadsAtAnotherWorldSizeAndStage) {
  expect_loads_at_another_world_size_and_stage(kOpt);
}

// Muon too: its momentum is partitioned like Adam's state, each matrix's owner follows the new
// layout, and its Adam half's schedule resumes where it was (CkptNet's matrix v is cut between
// ranks at 3 and 4 ranks).
TEST(EngineCheckpoint, MuonLoadsAtAnotherWorldSizeAndStage) {
  expect_loads_at_another_world_size_and_stage(
      ", \"gradient_clipping\": 0.5, \"optimizer\": {\"type\": \"Muon\", \"params\": "
      "{\"lr\": 0.01, \"adam_lr\": 0.004, \"weight_decay\": 0.1}}, \"scheduler\": "
      "{\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 6, \"warmup_type\": "
      "\"linear\"}}");
}

// Saves a 2-rank stage-1 checkpoint after 2 steps into `dir`; returns rank 0's state then.
at::Tensor save_one(const std::string& dir, const std::string& tag = "",
                    io::FileSystem* fs = nullptr) {
  at::Tensor state;
  on_ranks(
      2,
      [&](Communicator& c) {
        CkptNet net;
        InitOptions o = borrowed(c);
        o.file_system = fs;
        auto e = initialize(net.ptr(), config_json(4, 2, kOpt + stage_cfg(1)), o);
        Record rec;
        train_steps(*e, net, 0, 2, rec);
        e->save_checkpoint(dir, tag);
        if (c.rank() == 0) state = rec.state;
      },
      "save_one");
  return state;
}

// load_checkpoint's error on rank 0 of a 2-rank stage-1 engine (every rank must throw).
std::string load_error(const std::string& dir, const std::string& tag = "", LoadOptions opts = {}) {
  std::string msg;
  auto errors = run_thread_ranks(2, [&](Communicator& c) {
    CkptNet net;
    auto e = initialize(net.ptr(), config_json(4, 2, kOpt + stage_cfg(1)), borrowed(c));
    at::Tensor before = net->w.detach().clone();
    try {
      e->load_checkpoint(dir, tag, opts);
    } catch (...) {
      EXPECT_TRUE(at::equal(before, net->w)) << "a failed load changed the model";
      throw;
    }
  });
  for (size_t r = 0; r < errors.size(); ++r) {
    EXPECT_TRUE(errors[r]) << "rank " << r << " loaded " << dir;
    if (r == 0 && errors[r]) msg = error_text(errors[r]);
  }
  return msg;
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(EngineCheckpoint, BadInputIsAClearErrorNamingThePath) {
  TempDir dir_tmp;
  const std::string dir = dir_tmp.path();
  save_one(dir);
  const std::string folder = dir + "/global_step2";

  // A missing folder; `latest` naming nothing.
  EXPECT_TRUE(has(load_error(dir + "/nowhere"), dir + "/nowhere' does not exist"));
  {
    TempDir other_tmp;
    const std::string other = other_tmp.path();
    std::ofstream(other + "/latest") << "global_step9\n";
    std::string msg = load_error(other);
    EXPECT_TRUE(has(msg, "names tag 'global_step9'")) << msg;
  }
  // A corrupted rank file: named, with the tag; nothing loaded (load_error checks the model).
  {
    TempDir copy_tmp;
    const std::string copy = copy_tmp.path();
    std::filesystem::copy(dir, copy, std::filesystem::copy_options::recursive);
    const std::string f = copy + "/global_step2/rank00001-of-00002.safetensors";
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(-3, std::ios::end);
    io.put('\x7f');
    io.close();
    std::string msg = load_error(copy);
    EXPECT_TRUE(has(msg, "is damaged; nothing was loaded")) << msg;
    EXPECT_TRUE(has(msg, f + ": CRC-32C")) << msg;  // rank 1 checked it; rank 0 is told
  }
  // A manifest from a newer format version.
  {
    TempDir copy_tmp;
    const std::string copy = copy_tmp.path();
    std::filesystem::copy(dir, copy, std::filesystem::copy_options::recursive);
    const std::string mf = copy + "/global_step2/manifest.json";
    std::ifstream in(mf);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    in.close();
    auto j = nlohmann::json::parse(text);
    j["version"] = 99;
    std::ofstream(mf) << j.dump();
    std::string msg = load_error(copy);
    EXPECT_TRUE(has(msg, mf)) << msg;
    EXPECT_TRUE(has(msg, "is 99, but this dscpp reads versions 1..1")) << msg;
  }
  // A checkpoint of another model: every difference listed at once.
  {
    std::string msg;
    auto errors = run_thread_ranks(2, [&](Communicator& c) {
      enginetest::Net net = enginetest::make_net(1);
      auto e = initialize(net.ptr(), config_json(4, 2, kOpt + stage_cfg(1)), borrowed(c));
      e->load_checkpoint(dir);
    });
    ASSERT_TRUE(errors[0] && errors[1]);
    msg = error_text(errors[0]);
    EXPECT_TRUE(has(msg, "fc1.weight") && has(msg, "frozen") && has(msg, "seen")) << msg;
  }
  // A parameter frozen since the save: refused by name, never left unloaded.
  {
    std::string msg;
    auto errors = run_thread_ranks(2, [&](Communicator& c) {
      CkptNet net;
      net->w.set_requires_grad(false);
      auto e = initialize(net.ptr(), config_json(4, 2, kOpt + stage_cfg(1)), borrowed(c));
      e->load_checkpoint(dir);
    });
    ASSERT_TRUE(errors[0] && errors[1]);
    msg = error_text(errors[0]);
    EXPECT_TRUE(has(msg, "'w': trainable when saved, frozen or a buffer now")) << msg;
  }
  // Another optimizer: refused unless its state is not wanted.
  {
    std::string msg;
    auto errors = run_thread_ranks(2, [&](Communicator& c) {
      CkptNet net;
      const std::string sgd =
          ", \"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.1, \"momentum\": 0.9}}";
      auto e = initialize(net.ptr(), config_json(4, 2, sgd + stage_cfg(1)), borrowed(c));
      if (c.rank() == 0)
        msg = error_of<CheckpointError>([&] { e->load_checkpoint(dir); });
      else
        EXPECT_THROW(e->load_checkpoint(dir), CheckpointError);
      LoadOptions o;
      o.load_optimizer_states = false;
      o.load_lr_scheduler_states = false;
      e->load_checkpoint(dir, "", o);
      EXPECT_EQ(e->global_steps(), 2);
    });
    for (auto& err : errors) EXPECT_FALSE(err) << error_text(err);
    EXPECT_TRUE(has(msg, "optimizer AdamW, this engine runs SGD")) << msg;
  }
  // A save into a folder that cannot be made (a file stands where it should be).
  {
    std::ofstream(dir + "/a_file") << "x";
    std::string msg;
    auto errors = run_thread_ranks(2, [&](Communicator& c) {
      CkptNet net;
      auto e = initialize(net.ptr(), config_json(4, 2, kOpt + stage_cfg(1)), borrowed(c));
      e->save_checkpoint(dir + "/a_file/sub");
    });
    ASSERT_TRUE(errors[0] && errors[1]);
    msg = error_text(errors[0]);
    EXPECT_TRUE(has(msg, dir + "/a_file/sub")) << msg;
  }
  // Saving over the complete checkpoint `latest` names is refused; it still loads.
  {
    auto errors = run_thread_ranks(2, [&](Communicator& c) {
      CkptNet net;
      auto e = initialize(net.ptr(), config_json(4, 2, kOpt + stage_cfg(1)), borrowed(c));
      e->save_checkpoint(dir, "global_step2");
    });
    ASSERT_TRUE(errors[0] && errors[1]);
    EXPECT_TRUE(has(error_text(errors[0]), "already holds a complete checkpoint"))
        << error_text(errors[0]);
    checkpoint::verify(dir);
  }
}

TEST(EngineCheckpoint, SaveInsideAnAccumulationWindowIsRefused) {
  TempDir dir_tmp;
  const std::string dir = dir_tmp.path();
  auto errors = run_thread_ranks(2, [&](Communicator& c) {
    CkptNet net;
    auto e = initialize(net.ptr(), config_json(8, 2, kOpt), borrowed(c));  // GAS 2
    auto x = dataset_x().narrow(0, 0, 2), y = dataset_y().narrow(0, 0, 2);
    e->backward(at::mse_loss(net->forward(x), y));
    e->step();
    std::string msg = error_of<CheckpointError>([&] { e->save_checkpoint(dir); });
    EXPECT_TRUE(has(msg, "middle of a gradient accumulation window (1 of 2")) << msg;
  });
  for (auto& err : errors) EXPECT_FALSE(err) << error_text(err);
  EXPECT_FALSE(std::filesystem::exists(dir + "/latest"));
}

TEST(EngineCheckpoint, SaveOrLoadInsideAGatheredParametersScopeIsRefused) {
  TempDir dir_tmp;
  const std::string dir = dir_tmp.path();
  auto errors = run_thread_ranks(2, [&](Communicator& c) {
    CkptNet net;
    auto e = initialize(net.ptr(), config_json(4, 2, kOpt + stage_cfg(3)), borrowed(c));
    {
      zero::GatheredParameters whole(*net);
      std::string msg = error_of<CheckpointError>([&] { e->save_checkpoint(dir); });
      EXPECT_TRUE(has(msg, "inside a zero::GatheredParameters scope")) << msg;
      msg = error_of<CheckpointError>([&] { e->load_checkpoint(dir); });
      EXPECT_TRUE(has(msg, "inside a zero::GatheredParameters scope")) << msg;
    }
    e->save_checkpoint(dir);  // once it is closed
  });
  for (auto& err : errors) EXPECT_FALSE(err) << error_text(err);
  EXPECT_EQ(checkpoint::verify(dir).tag, "global_step0");
}

// A failed save (a write, a sync or a rename fails, or the disk fills) throws on every rank and
// leaves `latest` on the previous checkpoint, which still verifies and loads.
TEST(EngineCheckpoint, FailedSaveKeepsThePreviousCheckpoint) {
  using Kind = io::FileFault::Kind;
  // Every point of a save's writes (the nth append, sync or rename, all files of both ranks
  // together; a disk that fills after a few bytes or most of the save).
  std::vector<io::FileFault> faults;
  for (int64_t n = 1; n <= 6; ++n) faults.push_back({Kind::fail_append, n, 0});
  for (int64_t n = 1; n <= 4; ++n) faults.push_back({Kind::fail_sync, n, 0});
  for (int64_t n = 1; n <= 4; ++n) faults.push_back({Kind::fail_rename, n, 0});
  for (uint64_t b : {0, 600, 4000}) faults.push_back({Kind::disk_full, 1, b});
  for (const io::FileFault& fault : faults) {
    TempDir dir_tmp;
    const std::string dir = dir_tmp.path();
    const at::Tensor saved = save_one(dir, "first");
    io::FaultFileSystem fs(fault);
    auto errors = run_thread_ranks(2, [&](Communicator& c) {
      CkptNet net;
      InitOptions o = borrowed(c);
      o.file_system = &fs;
      auto e = initialize(net.ptr(), config_json(4, 2, kOpt + stage_cfg(1)), o);
      Record rec;
      train_steps(*e, net, 0, 3, rec);
      e->save_checkpoint(dir, "second");
    });
    const std::string what = "fault kind " + std::to_string(static_cast<int>(fault.kind)) +
                             " nth " + std::to_string(fault.nth);
    EXPECT_GE(fs.injected(), 1) << what;
    EXPECT_TRUE(errors[0] && errors[1]) << what << ": the save did not fail on every rank";
    EXPECT_EQ(checkpoint::verify(dir).tag, "first") << what;
    std::vector<Record> loaded(2);
    on_ranks(
        2,
        [&](Communicator& c) {
          CkptNet net(0.25);
          auto e = initialize(net.ptr(), config_json(4, 2, kOpt + stage_cfg(1)), borrowed(c));
          e->load_checkpoint(dir);
          EXPECT_EQ(e->global_steps(), 2);
          train_steps(*e, net, 2, 2, loaded[c.rank()]);
        },
        what + " load");
    EXPECT_TRUE(at::equal(loaded[0].state, saved)) << what;
  }
}

TEST(EngineCheckpoint, EveryRankUsesRankZerosTagAndFailRefusesOthers) {
  TempDir dir_tmp;
  const std::string dir = dir_tmp.path();
  for (const char* mode : {"Fail", "Warn"}) {
    const std::string cfg =
        config_json(4, 2, kOpt + ", \"checkpoint\": {\"tag_validation\": \"" + mode + "\"}");
    auto errors = run_thread_ranks(2, [&](Communicator& c) {
      CkptNet net;
      auto e = initialize(net.ptr(), cfg, borrowed(c));
      e->save_checkpoint(dir, std::string("tag_") + mode + "_" + std::to_string(c.rank()));
    });
    if (std::string(mode) == "Fail") {
      ASSERT_TRUE(errors[0] && errors[1]);
      EXPECT_TRUE(has(error_text(errors[1]), "tag_validation is Fail")) << error_text(errors[1]);
      EXPECT_FALSE(std::filesystem::exists(dir + "/tag_Fail_0"));
    } else {
      for (auto& err : errors) EXPECT_FALSE(err) << error_text(err);
      EXPECT_EQ(checkpoint::verify(dir).tag, "tag_Warn_0");  // rank 0's
    }
  }
  // A load follows rank 0's tag too: every rank loads the same checkpoint.
  std::vector<std::string> paths(2);
  on_ranks(
      2,
      [&](Communicator& c) {
        CkptNet net;
        auto e = initialize(net.ptr(), config_json(4, 2, kOpt), borrowed(c));
        e->save_checkpoint(dir, "other");
        paths[c.rank()] = e->load_checkpoint(dir, c.rank() == 0 ? "tag_Warn_0" : "other").path;
      },
      "load by tag");
  EXPECT_EQ(paths[0], dir + "/tag_Warn_0");
  EXPECT_EQ(paths[1], dir + "/tag_Warn_0");
}

}  // namespace
}  // namespace dscpp

namespace dscpp {
namespace {

// With the optimizer state on disk (offload_optimizer nvme, sub-groups of 5 elements; at stage 3
// the parameter shards too), a checkpoint streams the swap file into the rank files and a load
// writes them back; in host memory (offload_optimizer cpu of a model on a device: the tests'
// stand-in for a GPU; at stage 3 offload_param cpu too; and the swap file for such a model, "nvme,
// GPU") a load copies the parameters up again. The resume is bit-exact, and a
// checkpoint moves between offloaded and in-memory engines both ways.
TEST(EngineCheckpoint, OffloadedStateSavesAndLoadsBitExactBothWays) {
  constexpr int kWorld = 2, K = 3;
  TempDir swap;
  for (const auto& [stage, dtype, device] : std::vector<std::tuple<int, std::string, std::string>>{
           {2, "bf16", "nvme"}, {3, "fp32", "nvme"}, {1, "fp32", "nvme"}, {2, "bf16", "cpu"},
           {3, "fp32", "cpu"}, {3, "bf16", "cpu"}, {2, "fp32", "nvme, GPU"}}) {
    const std::string what = "stage " + std::to_string(stage) + " " + dtype + " " + device;
    std::vector<std::unique_ptr<testing::StandInLink>> links;
    for (int r = 0; r < kWorld; ++r) links.push_back(std::make_unique<testing::StandInLink>());
    auto options = [&](Communicator& c, bool offload) {
      InitOptions o = borrowed(c);
      if (offload && device != "nvme") o.device_link = links[c.rank()].get();
      return o;
    };
    const std::string base = kOpt + dtype_cfg(dtype);
    auto cfg = [&](bool offload) {
      std::string z = ", \"zero_optimization\": {\"stage\": " + std::to_string(stage) +
                      ", \"stage3_param_persistence_threshold\": 0";
      if (offload && device == "cpu") {
        z += ", \"sub_group_size\": 5, \"offload_optimizer\": {\"device\": \"cpu\"}";
        // Stage 3: the parameter shards in host memory too.
        if (stage == 3) z += ", \"offload_param\": {\"device\": \"cpu\"}";
      } else if (offload) {
        z += ", \"sub_group_size\": 5, \"offload_optimizer\": {\"device\": \"nvme\", "
             "\"nvme_path\": \"" +
             swap.path() + "\", \"pipeline_read\": true, \"pipeline_write\": true}";
        // Stage 3: the parameter shards on disk too.
        if (stage == 3) {
          z += ", \"offload_param\": {\"device\": \"nvme\", \"max_in_cpu\": 0, "
               "\"nvme_path\": \"" +
               swap.path() + "\"}";
        }
      }
      return config_json(kWorld * 2, 2, base + z + "}");
    };
    std::vector<Record> straight(kWorld);
    on_ranks(
        kWorld,
        [&](Communicator& c) {
          CkptNet net;
          auto e = initialize(net.ptr(), cfg(true), options(c, true));
          train_steps(*e, net, 0, 2 * K, straight[c.rank()]);
        },
        what + " straight");
    for (const auto& [save_offloaded, load_offloaded] :
         std::vector<std::pair<bool, bool>>{{true, true}, {true, false}, {false, true}}) {
      const std::string how = what + (save_offloaded ? ", saved offloaded" : ", saved in memory") +
                              (load_offloaded ? ", loaded offloaded" : ", loaded in memory");
      TempDir dir;
      std::vector<Record> resumed(kWorld);
      on_ranks(
          kWorld,
          [&](Communicator& c) {
            Record first;
            CkptNet net;
            auto e = initialize(net.ptr(), cfg(save_offloaded), options(c, save_offloaded));
            train_steps(*e, net, 0, K, first);
            e->save_checkpoint(dir.path());
          },
          how + " first half");
      on_ranks(
          kWorld,
          [&](Communicator& c) {
            CkptNet net(0.25);
            auto e = initialize(net.ptr(), cfg(load_offloaded), options(c, load_offloaded));
            e->load_checkpoint(dir.path());
            train_steps(*e, net, K, 2 * K, resumed[c.rank()]);
          },
          how + " second half");
      for (int r = 0; r < kWorld; ++r) {
        for (int i = 0; i < K; ++i)
          EXPECT_EQ(resumed[r].losses[i], straight[r].losses[K + i]) << how << " step " << K + i;
        EXPECT_TRUE(at::equal(resumed[r].state, straight[r].state)) << how << " rank " << r;
      }
    }
  }
}

}  // namespace
}  // namespace dscpp
