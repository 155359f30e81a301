// Tests of the built-in GPT: parameter names, shapes and count (GPT-2 small's 124,439,808),
// initialisation statistics and determinism, causal masking, the loss, and its config errors.
// Agreement with PyTorch itself is in golden_test.cpp.
#include "support/errors.h"
#include "dscpp/models/gpt.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "dscpp/error.h"

namespace dscpp::models {
namespace {

GPTConfig tiny() {
  return GPTConfig{/*vocab_size=*/11, /*block_size=*/5, /*n_layer=*/2,
                   /*n_head=*/2, /*n_embd=*/8};
}

using dscpp::testing::error_of;

TEST(GPT, ParameterNamesAndShapesAreTheModulePaths) {
  GPT model(tiny(), 1);
  std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {{"wte.weight", {11, 8}},
                                                                        {"wpe.weight", {5, 8}}};
  for (int i = 0; i < 2; ++i) {
    const std::string p = "h." + std::to_string(i) + ".";
    std::vector<std::pair<std::string, std::vector<int64_t>>> block = {
        {p + "ln_1.weight", {8}},
        {p + "ln_1.bias", {8}},
        {p + "attn.c_attn.weight", {24, 8}},
        {p + "attn.c_attn.bias", {24}},
        {p + "attn.c_proj.weight", {8, 8}},
        {p + "attn.c_proj.bias", {8}},
        {p + "ln_2.weight", {8}},
        {p + "ln_2.bias", {8}},
        {p + "mlp.c_fc.weight", {32, 8}},
        {p + "mlp.c_fc.bias", {32}},
        {p + "mlp.c_proj.weight", {8, 32}},
        {p + "mlp.c_proj.bias", {8}},
    };
    expected.insert(expected.end(), block.begin(), block.end());
  }
  expected.push_back({"ln_f.weight", {8}});
  expected.push_back({"ln_f.bias", {8}});

  auto params = model->named_parameters();
  ASSERT_EQ(params.size(), expected.size());
  int64_t total = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(params[i].key(), expected[i].first);
    EXPECT_EQ(params[i].value().sizes().vec(), expected[i].second) << expected[i].first;
    EXPECT_EQ(params[i].value().scalar_type(), at::kFloat);
    total += params[i].value().numel();
  }
  // 11*8 + 5*8 + 2*(12*64 + 13*8) + 2*8 = 88 + 40 + 1744 + 16
  EXPECT_EQ(total, 1888);
  EXPECT_EQ(tiny().num_parameters(), 1888);
  EXPECT_TRUE(model->named_buffers().is_empty());
}

TEST(GPT, Gpt2SmallHas124439808Parameters) {
  const GPTConfig small = GPTConfig::gpt2_small();
  EXPECT_EQ(small.vocab_size, 50257);
  EXPECT_EQ(small.block_size, 1024);
  EXPECT_EQ(small.n_layer, 12);
  EXPECT_EQ(small.n_head, 12);
  EXPECT_EQ(small.n_embd, 768);
  EXPECT_EQ(small.num_parameters(), 124439808);
  // Built for real: the tied embedding is one parameter, there is no lm_head.
  GPT model(small, 0);
  int64_t total = 0;
  for (const auto& p : model->named_parameters()) {
    EXPECT_EQ(p.key().find("lm_head"), std::string::npos) << p.key();
    total += p.value().numel();
  }
  EXPECT_EQ(total, 124439808);
  EXPECT_EQ(model->named_parameters().size(), 2 + 12 * 12 + 2);
}

TEST(GPT, InitStatistics) {
  GPTConfig c{/*vocab_size=*/2000, /*block_size=*/256, /*n_layer=*/4, /*n_head=*/4,
              /*n_embd=*/256};
  GPT model(c, 123);
  const double proj_std = 0.02 / std::sqrt(2.0 * 4);  // 0.00707
  for (const auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    const at::Tensor& p = item.value();
    const bool bias = name.size() > 5 && name.substr(name.size() - 5) == ".bias";
    if (bias) {
      EXPECT_EQ(p.abs().max().item<float>(), 0.0f) << name;
    } else if (name.find("ln_") != std::string::npos) {
      EXPECT_TRUE(p.eq(1).all().item<bool>()) << name;
    } else {
      const double want = name.find("c_proj.weight") != std::string::npos ? proj_std : 0.02;
      const double std = p.std().item<double>(), mean = p.mean().item<double>();
      // >= 65k samples per weight: the sample std is within 1.5% of the true one.
      EXPECT_NEAR(std, want, 0.015 * want) << name;
      EXPECT_NEAR(mean, 0.0, 0.03 * want) << name;
    }
  }
}

TEST(GPT, InitIsDeterministicPerSeedAndLeavesTheGlobalGeneratorAlone) {
  torch::manual_seed(7);
  const at::Tensor before = torch::randn({16});
  torch::manual_seed(7);
  GPT a(tiny(), 5);
  GPT b(tiny(), 5);
  const at::Tensor after = torch::randn({16});
  EXPECT_TRUE(before.equal(after)) << "building a GPT changed the caller's random stream";

  GPT c(tiny(), 6);
  auto pa = a->named_parameters(), pb = b->named_parameters(), pc = c->named_parameters();
  bool any_differs = false;
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(pa[i].value().equal(pb[i].value())) << pa[i].key();
    if (!pa[i].value().equal(pc[i].value())) any_differs = true;
  }
  EXPECT_TRUE(any_differs);
  EXPECT_FALSE(pa["wte.weight"].equal(pc["wte.weight"]));

  // init_weights(seed) reproduces the constructor's values.
  c->init_weights(5);
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(pa[i].value().equal(pc[i].value()));
}

TEST(GPT, ForwardShapesAndLoss) {
  GPT model(tiny(), 3);
  torch::manual_seed(0);
  at::Tensor idx = torch::randint(0, 11, {3, 5}, at::kLong);
  at::Tensor targets = torch::randint(0, 11, {3, 5}, at::kLong);
  at::Tensor logits = model->forward(idx);
  EXPECT_EQ(logits.sizes().vec(), (std::vector<int64_t>{3, 5, 11}));
  EXPECT_EQ(logits.scalar_type(), at::kFloat);
  at::Tensor loss = model->loss(idx, targets);
  EXPECT_EQ(loss.dim(), 0);
  // Mean over all 15 target tokens of -log softmax(logits)[target].
  at::Tensor logp = torch::log_softmax(logits, -1);
  double manual = -logp.gather(-1, targets.unsqueeze(-1)).mean().item<double>();
  EXPECT_NEAR(loss.item<double>(), manual, 1e-6);
  // With N(0, 0.02) weights the logits are nearly uniform: loss ~ ln V.
  EXPECT_NEAR(loss.item<double>(), std::log(11.0), 0.05);
  // Shorter sequences than block_size work.
  EXPECT_EQ(model->forward(idx.narrow(1, 0, 2)).sizes().vec(), (std::vector<int64_t>{3, 2, 11}));
}

TEST(GPT, CausalMaskingFutureTokensDoNotChangeEarlierLogits) {
  GPTConfig c{/*vocab_size=*/50, /*block_size=*/12, /*n_layer=*/2, /*n_head=*/4, /*n_embd=*/32};
  GPT model(c, 9);
  torch::manual_seed(1);
  at::Tensor idx = torch::randint(0, 50, {2, 12}, at::kLong);
  at::Tensor changed = idx.clone();
  changed.index_put_({at::indexing::Slice(), 7}, (idx.index({at::indexing::Slice(), 7}) + 1) % 50);
  at::Tensor a = model->forward(idx), b = model->forward(changed);
  using at::indexing::Slice;
  EXPECT_TRUE(a.index({Slice(), Slice(0, 7)}).equal(b.index({Slice(), Slice(0, 7)})));
  for (int t = 7; t < 12; ++t) {
    EXPECT_GT((a.index({Slice(), t}) - b.index({Slice(), t})).abs().max().item<float>(), 1e-6)
        << "position " << t << " did not see the change at position 7";
  }
}

TEST(GPT, GradientsReachEveryParameter) {
  GPT model(tiny(), 4);
  torch::manual_seed(2);
  at::Tensor idx = torch::randint(0, 11, {2, 5}, at::kLong);
  model->loss(idx, idx.roll(1, 1)).backward();
  for (const auto& p : model->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_GT(p.value().grad().abs().sum().item<double>(), 0.0) << p.key();
  }
}

TEST(GPT, ConfigErrorsAreClear) {
  std::string e = error_of([] { GPT(GPTConfig{11, 5, 2, 3, 10}, 0); });
  EXPECT_NE(e.find("n_embd (10) is not divisible by n_head (3)"), std::string::npos) << e;
  EXPECT_THROW(GPT(GPTConfig{11, 5, 2, 3, 10}, 0), ConfigError);
  EXPECT_THROW(GPT(GPTConfig{0, 5, 2, 2, 8}, 0), ConfigError);
  EXPECT_THROW(GPT(GPTConfig{11, 5, 0, 2, 8}, 0), ConfigError);

  GPT model(tiny(), 0);
  e = error_of([&] { model->forward(torch::zeros({1, 6}, at::kLong)); });
  EXPECT_NE(e.find("sequence length 6, longer than block_size 5"), std::string::npos) << e;
  e = error_of([&] { model->forward(torch::full({1, 3}, 11, at::kLong)); });
  EXPECT_NE(e.find("outside [0, vocab_size=11)"), std::string::npos) << e;
  EXPECT_THROW(model->forward(torch::full({1, 3}, -1, at::kLong)), ConfigError);
  EXPECT_THROW(model->forward(torch::zeros({1, 3}, at::kInt)), ConfigError);
  EXPECT_THROW(model->forward(torch::zeros({3}, at::kLong)), ConfigError);
  at::Tensor idx = torch::zeros({1, 3}, at::kLong);
  EXPECT_THROW(model->loss(idx, torch::full({1, 3}, 11, at::kLong)), ConfigError);
  EXPECT_THROW(model->loss(idx, torch::zeros({1, 4}, at::kLong)), ConfigError);
}

TEST(GPT, ConfigMetadataRoundTrip) {
  GPTConfig c{12, 18, 4, 4, 128};
  auto m = c.to_metadata();
  EXPECT_EQ(m.at("n_head"), "4");
  GPTConfig back = GPTConfig::from_metadata(m);
  EXPECT_EQ(back.to_string(), c.to_string());
  EXPECT_EQ(c.to_string(), "n_layer=4 n_head=4 n_embd=128 vocab_size=12 block_size=18");
  m.erase("n_head");
  EXPECT_THROW(GPTConfig::from_metadata(m), ConfigError);
  m["n_head"] = "4x";
  EXPECT_THROW(GPTConfig::from_metadata(m), ConfigError);
}

}  // namespace
}  // namespace dscpp::models
