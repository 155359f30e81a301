// Checkpoints written in the background (checkpoint.writer.decoupled; NOTE [background save] in
// src/engine/checkpoint.cpp): the files hold the state of the step the save was called at,
// whatever training does while they are written; `latest` moves only once every rank's file is
// durable; a failed write, a second save, a load and the engine's end are each handled.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "checkpoint/checkpoint_test_net.h"
#include "checkpoint/verify.h"
#include "dscpp/error.h"
#include "dscpp/file_system.h"
#include "dscpp/safetensors.h"
#include "dscpp/zero.h"
#include "support/errors.h"
#include "support/temp_dir.h"
#include "support/thread_ranks.h"

namespace dscpp {
namespace {

using namespace ckpttest;  // NOLINT: the shared model and loop
using comm::Communicator;
using enginetest::borrowed;
using enginetest::config_json;
using testing::error_text;
using testing::run_thread_ranks;
using testing::TempDir;

// A file system whose rank files (*.safetensors) stop at their `allow`-th append (0-based: the
// length prefix is append 0, the header 1, then one per tensor or piece) until open() is called,
// or for `slow_ms` milliseconds when that is given (a slow disk: appends of the training state
// happen while the save holds it, so they cannot wait for training), and whose appends to files
// with `fail_in` in their path throw IoError.
class GateFileSystem final : public io::FileSystem {
 public:
  explicit GateFileSystem(int allow, std::string fail_in = "", int slow_ms = -1)
      : allow_(allow),
        slow_ms_(slow_ms),
        fail_in_(std::move(fail_in)),
        inner_(io::resolve(nullptr)) {}
  void open() {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = false;
    cv_.notify_all();
  }
  int held() {
    std::lock_guard<std::mutex> lock(mutex_);
    return held_;
  }
  std::unique_ptr<io::RandomAccessFile> open_for_read(const std::string& p) override {
    return inner_.open_for_read(p);
  }
  std::unique_ptr<io::WritableFile> open_for_write(const std::string& p) override {
    auto f = inner_.open_for_write(p);
    if (p.find(".safetensors") == std::string::npos) return f;
    return std::make_unique<GatedFile>(*this, std::move(f));
  }
  std::unique_ptr<io::WritableFile> open_for_append(const std::string& p) override {
    return inner_.open_for_append(p);
  }
  void rename_file(const std::string& a, const std::string& b) override {
    inner_.rename_file(a, b);
  }
  void remove_file(const std::string& p) override { inner_.remove_file(p); }
  void sync_dir(const std::string& d) override { inner_.sync_dir(d); }
  void create_dirs(const std::string& d) override { inner_.create_dirs(d); }
  bool exists(const std::string& p) override { return inner_.exists(p); }
  uint64_t file_size(const std::string& p) override { return inner_.file_size(p); }

 private:
  class GatedFile final : public io::WritableFile {
   public:
    GatedFile(GateFileSystem& fs, std::unique_ptr<io::WritableFile> inner)
        : fs_(fs), inner_(std::move(inner)) {}
    void append(const void* data, size_t n) override {
      DSCPP_CHECK(fs_.fail_in_.empty() || path().find(fs_.fail_in_) == std::string::npos, IoError,
                  "writing '", path(), "' failed: injected fault");
      if (appends_++ == fs_.allow_) {
        std::unique_lock<std::mutex> lock(fs_.mutex_);
        ++fs_.held_;
        if (fs_.slow_ms_ >= 0) {
          fs_.cv_.wait_for(lock, std::chrono::milliseconds(fs_.slow_ms_));
        } else {
          fs_.cv_.wait(lock, [&] { return !fs_.closed_; });
        }
      }
      inner_->append(data, n);
    }
    void sync() override { inner_->sync(); }
    void close() override { inner_->close(); }
    const std::string& path() const override { return inner_->path(); }

   private:
    GateFileSystem& fs_;
    std::unique_ptr<io::WritableFile> inner_;
    int appends_ = 0;
  };
  const int allow_;
  const int slow_ms_;
  const std::string fail_in_;
  io::FileSystem& inner_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool closed_ = true;
  int held_ = 0;
};

const std::string kBackground = R"(, "checkpoint": {"writer": {"decoupled": true}})";

std::string latest(const std::string& dir) {
  std::ifstream in(dir + "/latest");
  std::string tag;
  in >> tag;
  return tag;
}

// Every tensor of DIR/TAG's rank files but the random generators' states (the ranks are threads
// of one process, sharing its CPU generator).
std::map<std::string, at::Tensor> contents(const std::string& dir, const std::string& tag) {
  std::map<std::string, at::Tensor> out;
  for (const auto& f : std::filesystem::directory_iterator(dir + "/" + tag)) {
    if (f.path().extension() != ".safetensors") continue;
    for (auto& [name, t] : safetensors::load(f.path().string()).tensors) {
      if (name.rfind("rng/", 0) != 0) out[f.path().filename().string() + ":" + name] = t;
    }
  }
  return out;
}

void expect_same_contents(const std::map<std::string, at::Tensor>& a,
                          const std::map<std::string, at::Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    ASSERT_NE(it, b.end()) << what << ": " << name;
    EXPECT_TRUE(at::equal(t, it->second)) << what << ": " << name << " differs";
  }
}

// The write is held before its first tensor (at the header, until training went on), slowed
// for 300 ms after its first two (a slow disk), or not at all, while training goes on for two
// steps (whose updates must not reach the file); the checkpoint then published equals the one a
// synchronous save writes at the same step, and training continued exactly as without a save.
TEST(BackgroundSave, FilesHoldTheStateOfTheirStepWhateverTrainingDoesMeanwhile) {
  constexpr int kWorld = 2, K = 3;
  for (int stage : {0, 1, 2, 3}) {
    for (const char* dtype : {"fp32", "bf16"}) {
      const std::string base = kOpt + stage_cfg(stage) + dtype_cfg(dtype);
      const std::string what = "stage " + std::to_string(stage) + " " + dtype;
      TempDir ref_tmp;
      std::vector<Record> straight(kWorld);
      on_ranks(
          kWorld,
          [&](Communicator& c) {
            CkptNet net;
            auto e = initialize(net.ptr(), config_json(8, 2, base), borrowed(c));
            Record first;
            train_steps(*e, net, 0, K, first);
            e->save_checkpoint(ref_tmp.path(), "ck");
            train_steps(*e, net, K, K + 3, straight[c.rank()]);
          },
          what + " synchronous");
      const auto want = contents(ref_tmp.path(), "ck");
      for (int allow : {1, 3, -1}) {
        const std::string how =
            what +
            (allow < 0 ? ", write not held" : ", write held at append " + std::to_string(allow));
        TempDir tmp;
        const std::string dir = tmp.path();
        GateFileSystem fs(allow, "", allow == 3 ? 300 : -1);
        if (allow < 0) fs.open();
        std::vector<Record> trained(kWorld);
        on_ranks(
            kWorld,
            [&](Communicator& c) {
              CkptNet net;
              InitOptions o = borrowed(c);
              o.file_system = &fs;
              auto e = initialize(net.ptr(), config_json(8, 2, base + kBackground), o);
              Record first;
              train_steps(*e, net, 0, K, first);
              EXPECT_EQ(e->save_checkpoint(dir, "ck"), dir + "/ck");
              train_steps(*e, net, K, K + 2, trained[c.rank()]);
              if (allow == 1) EXPECT_EQ(latest(dir), "") << how << ": published before written";
              c.barrier()->wait();
              if (c.rank() == 0) fs.open();
              e->wait_for_checkpoint();
              EXPECT_EQ(latest(dir), "ck") << how;
              Record rest;
              train_steps(*e, net, K + 2, K + 3, rest);
              trained[c.rank()].losses.push_back(rest.losses[0]);
              trained[c.rank()].state = rest.state;
            },
            how);
        if (allow >= 0) EXPECT_EQ(fs.held(), kWorld) << how << ": the gate held no write";
        EXPECT_EQ(checkpoint::verify(dir).tag, "ck") << how;
        expect_same_contents(contents(dir, "ck"), want, how);
        for (int r = 0; r < kWorld; ++r) {
          EXPECT_EQ(trained[r].losses, straight[r].losses) << how << " rank " << r;
          EXPECT_TRUE(at::equal(trained[r].state, straight[r].state)) << how << " rank " << r;
        }
      }
    }
  }
}

// Without waiting, the checkpoint is published at the end of a later step on every rank, and
// a save while another is in flight publishes that one first.
TEST(BackgroundSave, PublishedAtALaterStepAndOneAtATime) {
  TempDir tmp;
  const std::string dir = tmp.path();
  on_ranks(
      2,
      [&](Communicator& c) {
        CkptNet net;
        auto e = initialize(net.ptr(), config_json(8, 2, kOpt + stage_cfg(2) + kBackground),
                            borrowed(c));
        Record rec;
        train_steps(*e, net, 0, 2, rec);
        e->save_checkpoint(dir, "a");
        e->save_checkpoint(dir, "b");  // waits for "a" and publishes it first
        EXPECT_EQ(checkpoint::verify(dir, "a").tag, "a");
        int steps = 0;
        for (; steps < 200 && latest(dir) != "b"; ++steps) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
          train_steps(*e, net, 2 + steps, 3 + steps, rec);
        }
        EXPECT_EQ(latest(dir), "b") << "not published after " << steps << " steps";
        EXPECT_EQ(e->wait_for_checkpoint(), "") << "still in flight after it was published";
      },
      "publish");
  EXPECT_EQ(checkpoint::verify(dir).tag, "b");
}

// A write that fails: the step at which the ranks learn it throws on every rank after the step
// itself was applied, `latest` stays on the previous checkpoint, and the next save works.
TEST(BackgroundSave, AFailedWriteIsReportedByAStepAndLosesOnlyItself) {
  TempDir tmp;
  const std::string dir = tmp.path();
  GateFileSystem fs(-1, "/second/");
  fs.open();
  std::vector<std::string> errors(2);
  on_ranks(
      2,
      [&](Communicator& c) {
        CkptNet net;
        InitOptions o = borrowed(c);
        o.file_system = &fs;
        auto e = initialize(net.ptr(), config_json(8, 2, kOpt + stage_cfg(1) + kBackground), o);
        Record rec;
        train_steps(*e, net, 0, 1, rec);
        e->save_checkpoint(dir, "first");
        e->wait_for_checkpoint();
        train_steps(*e, net, 1, 2, rec);
        e->save_checkpoint(dir, "second");
        for (int s = 2; s < 100 && errors[c.rank()].empty(); ++s) {
          const int64_t before = e->global_steps();
          try {
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
            train_steps(*e, net, s, s + 1, rec);
          } catch (const std::exception& err) {
            errors[c.rank()] = err.what();
            EXPECT_EQ(e->global_steps(), before + 1) << "the step was not applied";
          }
        }
        EXPECT_EQ(latest(dir), "first");
        EXPECT_EQ(e->wait_for_checkpoint(), "");
        e->save_checkpoint(dir, "third");
        e->wait_for_checkpoint();
        EXPECT_EQ(latest(dir), "third");
      },
      "failed write");
  for (const auto& msg : errors) EXPECT_NE(msg.find("second"), std::string::npos) << msg;
  EXPECT_EQ(checkpoint::verify(dir).tag, "third");
}

// The engine's end publishes a save still in flight; a load waits for one first.
TEST(BackgroundSave, TheEngineEndAndALoadFinishTheSaveInFlight) {
  TempDir tmp;
  const std::string dir = tmp.path();
  GateFileSystem fs(1);
  const std::string cfg = config_json(8, 2, kOpt + stage_cfg(3) + kBackground);
  on_ranks(
      2,
      [&](Communicator& c) {
        CkptNet net;
        InitOptions o = borrowed(c);
        o.file_system = &fs;
        auto e = initialize(net.ptr(), cfg, o);
        Record rec;
        train_steps(*e, net, 0, 2, rec);
        e->save_checkpoint(dir, "end");
        c.barrier()->wait();
        if (c.rank() == 0) fs.open();
      },
      "destroyed with a save in flight");
  EXPECT_EQ(checkpoint::verify(dir).tag, "end");
  on_ranks(
      2,
      [&](Communicator& c) {
        CkptNet net;
        auto e = initialize(net.ptr(), cfg, borrowed(c));
        Record rec;
        train_steps(*e, net, 0, 1, rec);
        e->save_checkpoint(dir, "pending");
        EXPECT_EQ(e->load_checkpoint(dir).path, dir + "/pending");
        EXPECT_EQ(e->global_steps(), 1);
      },
      "load with a save in flight");
}

// Stage 3: a GatheredParameters scope that changes the parameters while a save is in flight
// does not change the checkpoint.
TEST(BackgroundSave, AGatheredParametersWriteBackDoesNotReachTheFile) {
  TempDir ref_tmp, tmp;
  // bf16: the checkpoint's values are the master weights, which the write-back changes in place.
  const std::string cfg = config_json(8, 2, kOpt + stage_cfg(3) + dtype_cfg("bf16"));
  on_ranks(
      2,
      [&](Communicator& c) {
        CkptNet net;
        auto e = initialize(net.ptr(), cfg, borrowed(c));
        Record rec;
        train_steps(*e, net, 0, 2, rec);
        e->save_checkpoint(ref_tmp.path(), "ck");
      },
      "reference");
  GateFileSystem fs(1);  // held before the values are read
  on_ranks(
      2,
      [&](Communicator& c) {
        CkptNet net;
        InitOptions o = borrowed(c);
        o.file_system = &fs;
        auto e = initialize(net.ptr(), cfg.substr(0, cfg.size() - 1) + kBackground + "}", o);
        Record rec;
        train_steps(*e, net, 0, 2, rec);
        e->save_checkpoint(tmp.path(), "ck");
        {
          zero::GatheredParameters scope(*net, /*modifier_rank=*/0);
          at::NoGradGuard no_grad;
          if (c.rank() == 0) net->w.fill_(7.0);
        }
        c.barrier()->wait();
        if (c.rank() == 0) fs.open();
        e->wait_for_checkpoint();
      },
      "write-back during the save");
  expect_same_contents(contents(tmp.path(), "ck"), contents(ref_tmp.path(), "ck"), "stage 3");
}

}  // namespace
}  // namespace dscpp
