// `dscpp train` as real processes through `dscpp launch`: the equivalence backbone (world sizes
// 1, 2, 3 x GAS 1, 2, 4 at the same train_batch_size reproduce the single-process losses and
// final weights), the default run's accuracy, and the errors a user meets (unknown optimizer,
// data too short, --init with wrong shapes, a loss that turns non-finite).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>

#include "support/temp_dir.h"
#include "dscpp/models/gpt.h"
#include "dscpp/safetensors.h"
#include "support/subprocess.h"

namespace dscpp {
namespace {

namespace fs = std::filesystem;
using testing::free_port;
using testing::run_command;

const std::string kCli = DSCPP_CLI_PATH;

using dscpp::testing::TempDir;

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::vector<double> losses_of(const std::string& metrics) {
  std::vector<double> out;
  std::ifstream f(metrics);
  std::string line;
  while (std::getline(f, line)) out.push_back(nlohmann::json::parse(line).at("loss").get<double>());
  return out;
}

at::Tensor flat_weights(const std::string& path) {
  std::vector<at::Tensor> parts;
  for (auto& [name, t] : safetensors::load(path).tensors) parts.push_back(t.reshape({-1}).to(at::kDouble));
  return at::cat(parts);
}

// The GPT that kModelArgs describes on the built-in task (vocab 12, T 18), of width n_embd.
models::GPTConfig tiny_gpt(int64_t n_embd) {
  models::GPTConfig gc;
  gc.vocab_size = 12;
  gc.block_size = 18;
  gc.n_layer = 2;
  gc.n_head = 2;
  gc.n_embd = n_embd;
  return gc;
}

const char* kModelArgs = " --n_layer 2 --n_head 2 --n_embd 32 --seed 5 --eval_problems 10";

// `extra`: more top-level keys, e.g. ", \"bf16\": {\"enabled\": true}"; `zero`: more keys of
// zero_optimization.
std::string config(int train_batch, int micro, int zero_stage = 0, const std::string& extra = "",
                   const std::string& zero = "") {
  return "{\"train_batch_size\": " + std::to_string(train_batch) + extra +
         ", \"zero_optimization\": {\"stage\": " + std::to_string(zero_stage) + zero + "}" +
         ", \"train_micro_batch_size_per_gpu\": " + std::to_string(micro) +
         ", \"steps_per_print\": 100, \"gradient_clipping\": 0.5,"
         " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 3e-3, \"weight_decay\": 0.1}},"
         " \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 4, "
         "\"warmup_max_lr\": 3e-3}}}";
}

TEST(TrainEquivalence, WorldSizesAndGasReproduceTheSingleProcessRun) {
  TempDir dir;
  {
    models::GPTConfig gc = tiny_gpt(32);
    models::GPT init(gc, 99);
    safetensors::save(*init, dir.file("init.safetensors"));
  }
  const int B = 24, steps = 8;
  auto run = [&](int world, int gas, int stage = 0) {
    std::string tag = "w" + std::to_string(world) + "g" + std::to_string(gas) + "s" + std::to_string(stage);
    // Stage 2 with overlapped reductions in buckets of about a quarter of the model; stage 3
    // with almost every parameter sharded, units released after each use, and (world 3) the
    // blocks recomputed in backward.
    const std::string zero =
        stage == 2   ? ", \"overlap_comm\": true, \"reduce_bucket_size\": 8000"
        : stage == 3 ? ", \"stage3_param_persistence_threshold\": 100, \"stage3_max_reuse_distance\": 0"
                     : "";
    const std::string recompute = stage == 3 && world == 3 ? " --checkpoint_activations" : "";
    write(dir.file(tag + ".json"), config(B, B / (world * gas), stage, "", zero));
    auto r = run_command(kCli + " launch --num_procs " + std::to_string(world) + " --master_port " +
                         std::to_string(free_port()) + " " + kCli + " train --config " +
                         dir.file(tag + ".json") + kModelArgs + recompute + " --no_shuffle --steps " +
                         std::to_string(steps) + " --init " + dir.file("init.safetensors") +
                         " --metrics " + dir.file(tag + ".jsonl") + " --save_final " +
                         dir.file(tag + ".safetensors"));
    EXPECT_EQ(r.status, 0) << tag << "\n" << r.output;
    return std::make_pair(losses_of(dir.file(tag + ".jsonl")), flat_weights(dir.file(tag + ".safetensors")));
  };
  auto [ref_losses, ref_weights] = run(1, 1);
  ASSERT_EQ(ref_losses.size(), static_cast<size_t>(steps));
  EXPECT_LT(ref_losses.back(), ref_losses.front());
  // {world, gas, ZeRO stage}
  for (auto [world, gas, stage] : std::vector<std::tuple<int, int, int>>{
           {1, 2, 0}, {1, 4, 0}, {2, 1, 0}, {2, 2, 0}, {2, 4, 0}, {3, 1, 0}, {3, 2, 0}, {3, 4, 0},
           {2, 2, 1}, {3, 1, 1}, {4, 2, 1}, {1, 2, 2}, {2, 2, 2}, {3, 1, 2}, {4, 1, 2},
           {2, 1, 3}, {3, 1, 3}, {4, 2, 3}}) {
    auto [losses, weights] = run(world, gas, stage);
    ASSERT_EQ(losses.size(), ref_losses.size()) << "world " << world << " gas " << gas;
    for (int s = 0; s < steps; ++s) {
      EXPECT_NEAR(losses[s], ref_losses[s], 1e-5 * std::abs(ref_losses[s]))
          << "world " << world << " gas " << gas << " stage " << stage << " step " << s;
    }
    double err = (weights - ref_weights).abs().max().item<double>();
    EXPECT_LE(err, 1e-5 * ref_weights.abs().max().item<double>())
        << "world " << world << " gas " << gas << " stage " << stage << ": final weights differ by " << err;
  }
}

// The golden reference from PyTorch itself: tests/golden/gpt_reference.py trains the same GPT
// from the same init on the same batches with torch.optim.AdamW, clipping and WarmupLR in one
// process; dscpp train on 1 rank and on 2 ranks x GAS 2 must follow it step by step.
TEST(TrainGolden, MatchesPyTorchStepByStep) {
  TempDir dir;
  models::GPTConfig gc = tiny_gpt(32);
  {
    models::GPT init(gc, 7);
    safetensors::save(*init, dir.file("init.safetensors"), gc.to_metadata());
  }
  const int steps = 10;
  write(dir.file("cfg.json"), config(16, 16));
  auto py = run_command(DSCPP_PYTHON " " DSCPP_SOURCE_DIR "/tests/golden/gpt_reference.py train --weights " +
                        dir.file("init.safetensors") + " --config " + dir.file("cfg.json") +
                        " --data-spec builtin:seed=5 --steps " + std::to_string(steps) + " --out " +
                        dir.file("py.jsonl") + " --out-weights " + dir.file("py.safetensors"));
  ASSERT_EQ(py.status, 0) << "the PyTorch reference failed (run scripts/setup.sh: it installs torch into .venv)\n"
                          << py.output;
  auto py_losses = losses_of(dir.file("py.jsonl"));
  auto py_weights = flat_weights(dir.file("py.safetensors"));
  ASSERT_EQ(py_losses.size(), static_cast<size_t>(steps));
  for (auto [world, micro] : std::vector<std::pair<int, int>>{{1, 16}, {2, 4}}) {
    std::string tag = "w" + std::to_string(world);
    write(dir.file(tag + ".json"), config(16, micro));
    auto r = run_command(kCli + " launch --num_procs " + std::to_string(world) + " --master_port " +
                         std::to_string(free_port()) + " " + kCli + " train --config " +
                         dir.file(tag + ".json") + kModelArgs + " --no_shuffle --steps " +
                         std::to_string(steps) + " --init " + dir.file("init.safetensors") +
                         " --metrics " + dir.file(tag + ".jsonl") + " --save_final " +
                         dir.file(tag + ".safetensors"));
    ASSERT_EQ(r.status, 0) << r.output;
    auto losses = losses_of(dir.file(tag + ".jsonl"));
    ASSERT_EQ(losses.size(), py_losses.size());
    for (int s = 0; s < steps; ++s)
      EXPECT_NEAR(losses[s], py_losses[s], 1e-5 * std::abs(py_losses[s])) << tag << " step " << s;
    auto weights = flat_weights(dir.file(tag + ".safetensors"));
    double err = (weights - py_weights).abs().max().item<double>();
    EXPECT_LE(err, 1e-4 * py_weights.abs().max().item<double>()) << tag << ": weights differ by " << err;
  }
}

TEST(Train, DefaultRunLearnsTheBuiltInTask) {
  auto r = run_command(kCli + " launch --num_procs 2 --master_port " + std::to_string(free_port()) +
                       " " + kCli + " train --config " + DSCPP_SOURCE_DIR "/examples/ds_config.json");
  ASSERT_EQ(r.status, 0) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex("held-out accuracy: ([0-9.]+)% of answer tokens")))
      << r.output;
  EXPECT_GE(std::stod(m[1]), 95.0) << r.output;
  EXPECT_LT(r.seconds, 180) << r.output;
}

// wall_clock_breakdown: rank 0's step line splits the window into its phases (at stage 2 the
// update's all-gather too), each ms figure consistent with the window, and the op table follows
// with the top ops by self time and their shares.
TEST(Train, WallClockBreakdownSplitsTheStepAndListsTheTopOps) {
  TempDir dir;
  write(dir.file("c.json"),
        R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 2,
            "wall_clock_breakdown": true, "zero_optimization": {"stage": 2},
            "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}})");
  auto r = run_command(kCli + " launch --num_procs 2 --master_port " + std::to_string(free_port()) +
                       " " + kCli + " train --config " + dir.file("c.json") +
                       " --n_layer 2 --n_head 2 --n_embd 256 --eval_problems 10 --steps 4");
  ASSERT_EQ(r.status, 0) << r.output;
  std::regex phases(
      "window ([0-9.]+) ms: forward\\+data ([0-9.]+) ms, backward ([0-9.]+) ms \\(waiting for "
      "gradient reductions ([0-9.]+) ms\\), optimizer ([0-9.]+) ms \\(boundary reductions "
      "([0-9.]+) ms, update ([0-9.]+) ms, all-gather ([0-9.]+) ms\\)");
  int lines = 0;
  for (std::sregex_iterator it(r.output.begin(), r.output.end(), phases), end; it != end; ++it) {
    const auto& m = *it;
    ++lines;
    const double window = std::stod(m[1]), fwd = std::stod(m[2]), bwd = std::stod(m[3]),
                 wait = std::stod(m[4]), opt = std::stod(m[5]), boundary = std::stod(m[6]),
                 update = std::stod(m[7]), gather = std::stod(m[8]);
    EXPECT_NEAR(fwd + bwd + opt, window, 0.2) << m[0];
    EXPECT_LE(wait, bwd + 0.05) << m[0];
    EXPECT_NEAR(boundary + update + gather, opt, 0.2) << m[0];
    EXPECT_GT(gather, 0) << "stage 2 all-gathers the updated parameters (1.6M)\n" << m[0];
  }
  EXPECT_EQ(lines, 2) << "steps 2 and 4\n" << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      r.output, m,
      std::regex("ops by self time: ([0-9.]+) ms inside libtorch ops \\(([0-9.]+)% of the "
                 "time\\)[^\\n]*\\n.*?([0-9.]+)%  +([0-9.]+) ms +([0-9]+) calls  [a-z]")))
      << r.output;
  EXPECT_GT(std::stod(m[2]), 10) << m[0];
  EXPECT_LE(std::stod(m[2]), 100) << m[0];
  EXPECT_NE(r.output.find("calls  aten::mm"), std::string::npos) << r.output;
}

// bf16 through the whole tool: every stage (0-3) at 2 ranks learns and stays near the fp32 run.
TEST(Train, Bf16TrainsAtEveryStageNearTheFp32Run) {
  TempDir dir;
  const int steps = 8;
  auto run = [&](const std::string& tag, const std::string& cfg) {
    write(dir.file(tag + ".json"), cfg);
    auto r = run_command(kCli + " launch --num_procs 2 --master_port " + std::to_string(free_port()) +
                         " " + kCli + " train --config " + dir.file(tag + ".json") + kModelArgs +
                         " --no_shuffle --steps " + std::to_string(steps) + " --metrics " + dir.file(tag + ".jsonl"));
    EXPECT_EQ(r.status, 0) << tag << "\n" << r.output;
    return losses_of(dir.file(tag + ".jsonl"));
  };
  auto fp32 = run("fp32", config(8, 4));
  ASSERT_EQ(fp32.size(), static_cast<size_t>(steps));
  for (int stage : {0, 1, 2, 3}) {
    auto bf16 = run("bf16s" + std::to_string(stage), config(8, 4, stage, ", \"bf16\": {\"enabled\": true}"));
    ASSERT_EQ(bf16.size(), fp32.size());
    EXPECT_LT(bf16.back(), bf16.front()) << "stage " << stage;
    for (int s = 0; s < steps; ++s) EXPECT_NEAR(bf16[s], fp32[s], 0.03 * fp32[s]) << "stage " << stage << " step " << s;
  }
}

// The main job stopped by SIGTERM at a random step (the launcher forwards it to the ranks, which
// save at the next optimizer step and exit 0) and rerun with --resume ends with the same final
// weights, bit for bit, as an uninterrupted run; its metrics continue the stopped run's.
TEST(Train, StoppedBySigtermAndResumedEqualsAnUninterruptedRun) {
  TempDir dir;
  const int steps = 30;
  write(dir.file("c.json"), config(8, 2, 2));  // 2 ranks x GAS 2, ZeRO stage 2
  auto train = [&](const std::string& extra) {
    return kCli + " launch --num_procs 2 --stop_grace 60 --master_port " + std::to_string(free_port()) + " " +
           kCli + " train --config " + dir.file("c.json") + kModelArgs + " --steps " + std::to_string(steps) +
           " " + extra;
  };
  auto straight = run_command(train("--metrics " + dir.file("a.jsonl") + " --save_final " + dir.file("a.safetensors")));
  ASSERT_EQ(straight.status, 0) << straight.output;

  const int stop_after = 3 + static_cast<int>(std::random_device{}() % 10);  // metrics lines seen
  const std::string metrics = dir.file("b.jsonl");
  auto stopped = run_command("(" + train("--save_dir " + dir.file("ckpt") + " --metrics " + metrics) +
                             " & pid=$!; while [ \"$(cat " + metrics + " 2>/dev/null | wc -l)\" -lt " +
                             std::to_string(stop_after) + " ]; do sleep 0.01; done; kill -TERM $pid; wait $pid)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(stopped.output, m, std::regex("stop requested \\(SIGTERM\\): saved checkpoint "
                                                              "[^ ]+/global_step([0-9]+) after step")))
      << "stopped after " << stop_after << " steps:\n" << stopped.output;
  const int saved = std::stoi(m[1]);
  EXPECT_GE(saved, stop_after);
  EXPECT_LT(saved, steps) << "the run ended before the signal: no test of a stop";
  EXPECT_EQ(losses_of(metrics).size(), static_cast<size_t>(saved));

  // Without --resume the folder of a run is not saved into.
  auto again = run_command(train("--save_dir " + dir.file("ckpt")));
  EXPECT_NE(again.status, 0) << again.output;
  EXPECT_NE(again.output.find("already holds checkpoints of a run"), std::string::npos) << again.output;

  auto resumed = run_command(train("--save_dir " + dir.file("ckpt") + " --resume --metrics " + metrics +
                                   " --save_final " + dir.file("b.safetensors")));
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from " + dir.file("ckpt") + "/global_step" + std::to_string(saved)),
            std::string::npos)
      << resumed.output;
  EXPECT_EQ(losses_of(metrics), losses_of(dir.file("a.jsonl")));
  EXPECT_TRUE(at::equal(flat_weights(dir.file("b.safetensors")), flat_weights(dir.file("a.safetensors"))))
      << "stopped at step " << saved;

  // The last checkpoint (step 30), consolidated: the same weights under the same names.
  auto z = run_command(kCli + " zero-to-fp32 " + dir.file("ckpt") + " " + dir.file("z.safetensors"));
  ASSERT_EQ(z.status, 0) << z.output;
  std::map<std::string, at::Tensor> want;
  for (auto& [name, t] : safetensors::load(dir.file("a.safetensors")).tensors) want[name] = t;
  auto got = safetensors::load(dir.file("z.safetensors")).tensors;
  EXPECT_EQ(got.size(), want.size());
  for (auto& [name, t] : got) {
    ASSERT_TRUE(want.count(name)) << name;
    EXPECT_TRUE(at::equal(t, want[name])) << name;
  }
  // PyTorch's twin module takes the file with load_state_dict(strict=True) and computes the
  // same logits as from the uninterrupted run's weights.
  safetensors::save(dir.file("tokens.safetensors"), {{"idx", at::arange(36, at::kLong).remainder(12).view({2, 18})}});
  for (const char* w : {"a", "z"}) {
    auto py = run_command(std::string(DSCPP_PYTHON " " DSCPP_SOURCE_DIR "/tests/golden/gpt_reference.py forward --n-head 2 --weights ") +
                          dir.file(std::string(w) + ".safetensors") + " --tokens " + dir.file("tokens.safetensors") +
                          " --out " + dir.file(std::string(w) + "_logits.safetensors"));
    ASSERT_EQ(py.status, 0) << py.output;
  }
  EXPECT_TRUE(at::equal(safetensors::load(dir.file("a_logits.safetensors")).tensors[0].second,
                        safetensors::load(dir.file("z_logits.safetensors")).tensors[0].second));
  // And dscpp train starts from it.
  auto init = run_command(kCli + " train --config " + dir.file("c.json") + kModelArgs +
                          " --steps 1 --init " + dir.file("z.safetensors"));
  EXPECT_EQ(init.status, 0) << init.output;
}

// dscpp launch --max_restarts: rank 1 is killed in step 10 of the first start; the launcher
// starts the job again, dscpp train --resume continues from the step-8 checkpoint, says which
// steps it trains again, and ends exactly where an uninterrupted run ends.
TEST(Train, KilledRankIsRestartedFromTheLastCheckpointAndEndsAsAnUninterruptedRun) {
  TempDir dir;
  const int steps = 16;
  write(dir.file("c.json"), config(8, 2, 1));  // 2 ranks x GAS 2, ZeRO stage 1
  const std::string args = " train --config " + dir.file("c.json") + kModelArgs + " --steps " + std::to_string(steps);
  auto straight = run_command(kCli + " launch --num_procs 2 --master_port " + std::to_string(free_port()) + " " + kCli +
                              args + " --metrics " + dir.file("a.jsonl") + " --save_final " + dir.file("a.safetensors"));
  ASSERT_EQ(straight.status, 0) << straight.output;

  write(dir.file("rank.sh"),
        "if [ \"$DSCPP_RESTART_COUNT\" = 0 ]; then export DSCPP_FAULT_INJECT=kill:phase=optimizer:rank=1:hit=10; fi\n"
        "exec " + kCli + args + " --save_dir " + dir.file("ckpt") + " --save_interval 4 --resume --metrics " +
            dir.file("b.jsonl") + " --save_final " + dir.file("b.safetensors") + "\n");
  auto restarted = run_command(kCli + " launch --num_procs 2 --max_restarts 1 --master_port " +
                               std::to_string(free_port()) + " sh " + dir.file("rank.sh"));
  ASSERT_EQ(restarted.status, 0) << restarted.output;
  EXPECT_NE(restarted.output.find("killed by signal 9 (SIGKILL)"), std::string::npos) << restarted.output;
  EXPECT_NE(restarted.output.find("restart 1 of 1 (--max_restarts), DSCPP_RESTART_COUNT=1"), std::string::npos)
      << restarted.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(restarted.output, m,
                                std::regex("resumed from [^ ]+/global_step8 at step 8; steps 9\\.\\.(9|10) are trained "
                                           "again: ([12]) step\\(s\\) since the checkpoint were lost \\(the run "
                                           "before reached step (9|10); restart 1\\)")))
      << restarted.output;
  EXPECT_EQ(losses_of(dir.file("b.jsonl")), losses_of(dir.file("a.jsonl")));
  EXPECT_TRUE(at::equal(flat_weights(dir.file("b.safetensors")), flat_weights(dir.file("a.safetensors"))));

  // Without --max_restarts the same failure ends the job.
  auto once = run_command(kCli + " launch --num_procs 2 --master_port " + std::to_string(free_port()) + " sh -c '" +
                          "DSCPP_FAULT_INJECT=kill:phase=optimizer:rank=1:hit=2 exec " + kCli + args + "'");
  EXPECT_NE(once.status, 0) << once.output;
  EXPECT_EQ(once.output.find("restart 1"), std::string::npos) << once.output;
}

// --steps 0 --save_final writes the weights a run starts from (bench/seed_tables.sh hands them
// to PyTorch DDP), at stage 0 and from a model built sharded at stage 3.
TEST(Train, StepsZeroWritesTheInitialWeights) {
  TempDir dir;
  models::GPT expected(tiny_gpt(32), 5);
  std::vector<at::Tensor> parts;
  for (const auto& p : expected->parameters()) parts.push_back(p.reshape({-1}).to(at::kDouble));
  const at::Tensor want = at::cat(parts);
  for (int stage : {0, 3}) {
    const std::string tag = "s" + std::to_string(stage);
    write(dir.file(tag + ".json"), config(8, 4, stage));
    auto r =
        run_command(kCli + " launch --num_procs 2 --master_port " + std::to_string(free_port()) +
                    " " + kCli + " train --config " + dir.file(tag + ".json") + kModelArgs +
                    " --steps 0 --save_final " + dir.file(tag + ".safetensors"));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("nothing trained"), std::string::npos) << r.output;
    EXPECT_TRUE(at::equal(flat_weights(dir.file(tag + ".safetensors")), want)) << tag;
  }
  // Without --save_final there is nothing to do.
  write(dir.file("c.json"), config(8, 4));
  auto r = run_command(kCli + " train --config " + dir.file("c.json") + kModelArgs + " --steps 0");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--save_final"), std::string::npos) << r.output;
}

TEST(Train, BadInputIsAClearErrorAndNoRankIsLeftRunning) {
  TempDir dir;
  auto launch = [&](const std::string& cfg_json, const std::string& extra, int steps = 3) {
    write(dir.file("c.json"), cfg_json);
    return run_command(kCli + " launch --num_procs 2 --master_port " + std::to_string(free_port()) +
                       " " + kCli + " train --config " + dir.file("c.json") + kModelArgs +
                       " --steps " + std::to_string(steps) + " " + extra);
  };
  std::string good = config(8, 4);
  // Unknown optimizer type.
  auto r = launch("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Adamm\", \"params\": {}}}", "");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("Adamm"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Adam"), std::string::npos) << r.output;
  // A data file too short for one optimizer step.
  write(dir.file("short.txt"), "too short for a batch");
  r = launch(good, "--data " + dir.file("short.txt") + " --block_size 16");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("short.txt"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("fewer than one optimizer step needs (train_batch_size=8"),
            std::string::npos)
      << r.output;
  // ... said before the model is built (its pre-flight memory estimate is the first thing then).
  EXPECT_EQ(r.output.find("estimated peak RSS"), std::string::npos) << r.output;
  // --init with the wrong shapes.
  {
    models::GPTConfig gc = tiny_gpt(16);  // the run uses 32
    models::GPT other(gc, 1);
    safetensors::save(*other, dir.file("wrong.safetensors"));
  }
  r = launch(good, "--init " + dir.file("wrong.safetensors"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("wte.weight"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 60) << r.output;
  // fp16 on the CPU trains (libtorch 2.x has CPU fp16 kernels for every op of the GPT).
  r = launch(config(8, 4, 0, ", \"fp16\": {\"enabled\": true}"), "");
  EXPECT_EQ(r.status, 0) << r.output;
  // A learning rate that blows the loss up: every rank stops with the step named.
  r = launch("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 1e30}}}",
             "", 20);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("non-finite"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 60) << r.output;
}

}  // namespace
}  // namespace dscpp
