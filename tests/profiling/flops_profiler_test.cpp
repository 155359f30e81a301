// The flops profiler (src/profiling): on the built-in GPT the counted FLOPs are the analytic
// formula (forward exactly; forward + backward = 6·N·tokens + the attention's, within 1%), per
// module scope too; convolutions count from their shapes; and the engine profiles DeepSpeed's
// window and writes the report, at stage 3 with the units as scopes.
#include "profiling/flops_profiler.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/conv.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "dscpp/models/gpt.h"
#include "engine/test_net.h"
#include "support/temp_dir.h"

namespace dscpp::enginetest {
namespace {

using models::GPT;
using models::GPTConfig;
using profiling::FlopsProfiler;
using profiling::Phase;

// Forward FLOPs of the GPT's matmuls: per block c_attn (C -> 3C), q k^T and att v (2·B·T²·C
// each over all heads), c_proj (C -> C), c_fc (C -> 4C), c_proj (4C -> C); then the tied output
// projection (C -> V).
int64_t gpt_forward_flops(const GPTConfig& c, int64_t b, int64_t t) {
  const int64_t bt = b * t, C = c.n_embd;
  const int64_t block =
      2 * bt * (3 * C * C + C * C + 4 * C * C + 4 * C * C) + 2 * 2 * b * t * t * C;
  return c.n_layer * block + 2 * bt * C * c.vocab_size;
}

const GPTConfig kGpt{/*vocab*/ 97, /*block*/ 24, /*layers*/ 2, /*heads*/ 4, /*embd*/ 32};

TEST(FlopsProfiler, CountsTheGPTsFlopsAsTheAnalyticFormula) {
  GPT gpt(kGpt, 1);
  const int64_t b = 3, t = 24;
  auto idx = at::randint(0, kGpt.vocab_size, {b, t}, at::kLong);
  FlopsProfiler prof(*gpt, FlopsProfilerConfig{});
  at::Tensor loss = gpt->loss(idx, idx);
  prof.set_phase(Phase::backward);
  loss.backward();
  const int64_t fwd = gpt_forward_flops(kGpt, b, t);
  EXPECT_EQ(prof.flops(Phase::forward), fwd);
  // The check: 6·N·tokens (N: the matmul weights, 12·C² per block and the tied V·C) plus
  // three times the attention's forward FLOPs.
  const int64_t C = kGpt.n_embd, n = kGpt.n_layer * 12 * C * C + kGpt.vocab_size * C;
  const double analytic = 6.0 * n * b * t + 3.0 * kGpt.n_layer * 4 * b * t * t * C;
  const double counted = prof.flops(Phase::forward) + prof.flops(Phase::backward);
  EXPECT_NEAR(counted / analytic, 1.0, 0.01) << counted << " vs " << analytic;
  // Per module scope: each block (and its attention and MLP) by name.
  const int64_t attn = 2 * b * t * 4 * C * C + 4 * b * t * t * C, mlp = 2 * b * t * 8 * C * C;
  for (const char* block : {"h.0", "h.1"}) {
    EXPECT_EQ(prof.module_flops(block), attn + mlp) << block;
    EXPECT_EQ(prof.module_flops(std::string(block) + ".attn"), attn) << block;
    EXPECT_EQ(prof.module_flops(std::string(block) + ".mlp"), mlp) << block;
  }
  EXPECT_EQ(prof.module_flops("wte"), 2 * b * t * C * kGpt.vocab_size);  // the output projection
}

TEST(FlopsProfiler, CountsConvolutionsFromTheirShapes) {
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 8, 3).stride(2).padding(1));
  auto x = at::randn({2, 3, 16, 16}).requires_grad_(true);
  FlopsProfiler prof(*conv, FlopsProfilerConfig{});
  auto y = conv->forward(x);  // [2, 8, 8, 8]
  prof.set_phase(Phase::backward);
  y.sum().backward();
  const int64_t fwd = 2 * (2 * 8 * 8 * 8) * (3 * 3 * 3);
  EXPECT_EQ(prof.flops(Phase::forward), fwd);
  EXPECT_EQ(prof.flops(Phase::backward), 2 * fwd) << "the input's and the weight's gradients";
}

TEST(FlopsProfiler, OneProfilerAtATimePerProcess) {
  GPT gpt(kGpt, 1);
  FlopsProfiler a(*gpt, FlopsProfilerConfig{});
  std::string msg = testing::error_of([&] { FlopsProfiler b(*gpt, FlopsProfilerConfig{}); });
  EXPECT_NE(msg.find("another engine in this process is profiling"), std::string::npos) << msg;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// DeepSpeed's window (the one that starts when global_steps reaches profile_step), rank 0's
// report in output_file, the units as scopes at stage 3, module_depth and detailed honoured.
TEST(FlopsProfiler, EngineProfilesTheStepAndWritesTheReport) {
  for (int stage : {0, 3}) {
    testing::TempDir dir;
    const std::string file = dir.file("flops.txt");
    const std::string cfg =
        "{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": 2, \"steps_per_print\": "
        "1000, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}}, "
        "\"zero_optimization\": {\"stage\": " +
        std::to_string(stage) +
        "}, \"flops_profiler\": {\"enabled\": true, \"profile_step\": 1, \"module_depth\": " +
        (stage == 3 ? "3" : "-1") + ", \"detailed\": " + (stage == 3 ? "false" : "true") +
        ", \"output_file\": \"" + file + "\"}}";
    auto errors = testing::run_thread_ranks(2, [&](Communicator& c) {
      GPT gpt(kGpt, 1);
      InitOptions opts = borrowed(c);
      opts.zero_units = models::GPTImpl::zero_units();
      auto engine = initialize(gpt.ptr(), cfg, opts);
      engine->set_tokens_per_sample(kGpt.block_size);
      for (int s = 0; s < 3; ++s) {
        for (int k = 0; k < engine->gradient_accumulation_steps(); ++k) {
          auto idx = at::randint(0, kGpt.vocab_size, {2, kGpt.block_size}, at::kLong);
          engine->backward(gpt->loss(idx, idx));
          engine->step();
        }
        // Created (empty) at set-up; the report comes at the end of step 2.
        if (s == 0 && c.rank() == 0) EXPECT_EQ(std::filesystem::file_size(file), 0u) << "too early";
      }
    });
    for (auto& e : errors) ASSERT_FALSE(e) << testing::error_text(e);
    const std::string r = read_text(file);
    const std::string where = "stage " + std::to_string(stage) + ":\n" + r;
    EXPECT_NE(r.find("optimizer step 2"), std::string::npos) << where;
    EXPECT_NE(r.find("rank 0 of 2; 2 micro-step(s)"), std::string::npos) << where;
    // Two micro-steps of [2, 24] tokens: 3x the forward formula.
    const double total = 3.0 * 2 * gpt_forward_flops(kGpt, 2, kGpt.block_size);
    EXPECT_NE(r.find(fmt::format("total {:.2f} MFLOP", total / 1e6)), std::string::npos)
        << total << "\n"
        << where;
    EXPECT_NE(r.find("tokens on this rank:"), std::string::npos) << where;
    EXPECT_NE(r.find(" 96 ("), std::string::npos) << "2 micro-steps x 2 x 24 tokens\n" << where;
    EXPECT_NE(r.find("FLOPs utilization"), std::string::npos) << where;
    EXPECT_NE(r.find("  h.1 "), std::string::npos) << where;
    if (stage == 3) {
      EXPECT_EQ(r.find("h.1.mlp"), std::string::npos)
          << "module_depth 3 shows depths 0-2 (h.1 is at 2: h is a module)\n"
          << where;
      EXPECT_EQ(r.find("aten::mm"), std::string::npos) << "detailed false\n" << where;
    } else {
      EXPECT_NE(r.find("h.1.mlp"), std::string::npos) << where;
      EXPECT_NE(r.find("aten::scaled_dot_product_attention"), std::string::npos) << where;  // fp32: sdpa
    }
  }
}

}  // namespace
}  // namespace dscpp::enginetest
