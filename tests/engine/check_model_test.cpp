// dscpp::check: what initialize() refuses about a model, refused first without joining a job, with
// initialize()'s text; and zero::ShapesOnly, the model built for its shapes only that
// `dscpp check --model gpt` judges.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "dscpp/engine.h"
#include "dscpp/error.h"
#include "dscpp/models/gpt.h"
#include "dscpp/zero.h"
#include "support/errors.h"
#include "support/scoped_env.h"
#include "support/temp_dir.h"
#include "support/thread_ranks.h"
#include "test_net.h"
#include "zero/presharded.h"

namespace dscpp::enginetest {
namespace {

// A refusal that needs the model, made by check() at world 2 and by initialize() on 2 ranks.
struct Refusal {
  std::string name;
  std::string config;                                         // after config_json(4, 2, ...)
  std::function<std::shared_ptr<torch::nn::Module>()> model;  // a fresh one per call
  zero::UnitPolicy zero_units;
  std::string expected;  // a part of the text
};

std::shared_ptr<torch::nn::Module> plain_net() { return make_net(1).ptr(); }

TEST(CheckModel, RefusesWhatInitializeRefusesWithItsText) {
  testing::TempDir dir;
  const std::string nvme = dir.path();
  const zero::UnitPolicy layers{{"fc1", "fc2", "branch"}};
  const std::vector<Refusal> cases = {
      {"a leaf_module class the model lacks",
       kAdamW + std::string(
                    R"(, "zero_optimization": {"stage": 3, "leaf_module": {"classes": ["Nope"]}})"),
       plain_net,
       {},
       "matching no module of the model: zero_optimization.leaf_module.classes \"Nope\""},
      {"a zero_units path the model lacks",
       kAdamW + std::string(R"(, "zero_optimization": {"stage": 3})"), plain_net,
       zero::UnitPolicy{{"fc9"}}, "InitOptions::zero_units path \"fc9\""},
      {"a torch_autocast safe module the model lacks",
       kAdamW +
           std::string(
               R"(, "torch_autocast": {"enabled": true, "lower_precision_safe_modules": ["torch.nn.Conv2d"]})"),
       plain_net,
       {},
       "\"torch.nn.Conv2d\" (read as the C++ class torch::nn::Conv2d) names no module of the "
       "model"},
      {"a unit shard larger than offload_param's buffers",
       kAdamW +
           std::string(
               R"(, "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, )") +
           R"("offload_optimizer": {"device": "nvme", "nvme_path": ")" + nvme + R"("}, )" +
           R"("offload_param": {"device": "nvme", "nvme_path": ")" + nvme +
           R"(", "buffer_size": 50, "max_in_cpu": 0}})",
       plain_net, layers,
       // fc1: 8 x 16 + 16 = 144 elements, 72 per rank.
       "offload_param.buffer_size 50 elements is smaller than the largest stage-3 unit shard a "
       "rank puts on disk (72 elements over 2 ranks)"},
      {"no optimizer anywhere",
       "",
       plain_net,
       {},
       "the config has no optimizer section and no optimizer was passed to initialize()"},
      {"no trainable parameter",
       kAdamW,
       [] {
         auto m = plain_net();
         for (auto& p : m->parameters()) p.set_requires_grad(false);
         return m;
       },
       {},
       "the model has no trainable parameters"},
      {"a bf16 parameter",
       kAdamW + std::string(R"(, "bf16": {"enabled": true})"),
       [] {
         auto m = plain_net();
         m->to(at::kBFloat16);
         return m;
       },
       {},
       "parameter 'fc1.weight' is BFloat16; dscpp keeps the model in fp32"},
  };
  auto errors = testing::run_thread_ranks(2, [&](Communicator& c) {
    for (const Refusal& r : cases) {
      const std::string config = config_json(4, 2, r.config);
      InitOptions opts = borrowed(c);
      opts.zero_units = r.zero_units;
      const std::string checked =
          testing::error_of<ConfigError>([&] { check(r.model(), config, /*world=*/2, opts); });
      const std::string init =
          testing::error_of<ConfigError>([&] { initialize(r.model(), config, opts); });
      EXPECT_EQ(checked, init) << r.name;
      EXPECT_NE(checked.find(r.expected), std::string::npos) << r.name << ": " << checked;
    }
  });
  for (auto& e : errors) ASSERT_FALSE(e) << testing::error_text(e);

  // The pre-flight memory check, for the ranks of this host that the caller names (a thread
  // rank's process environment says 1).
  testing::ScopedEnv limit("DSCPP_MEMORY_LIMIT", "1M");
  const std::string config = config_json(4, 2, kAdamW);
  const std::string checked = testing::error_of<ConfigError>(
      [&] { check(plain_net(), config, 2, InitOptions{}, /*local_ranks=*/1); });
  EXPECT_NE(checked.find("with 1 rank(s) on this host"), std::string::npos) << checked;
  errors = testing::run_thread_ranks(2, [&](Communicator& c) {
    const std::string init =
        testing::error_of<ConfigError>([&] { initialize(plain_net(), config, borrowed(c)); });
    EXPECT_EQ(checked, init);
  });
  for (auto& e : errors) ASSERT_FALSE(e) << testing::error_text(e);
}

TEST(CheckModel, AcceptsWhatInitializeAcceptsAndReturnsTheWarnings) {
  const std::string config = config_json(
      4, 2, kAdamW + std::string(R"(, "zero_optimization": {"stage": 0, "overlap_comm": false})"));
  const std::vector<std::string> warnings = check(plain_net(), config, 2);
  bool said = false;
  for (const auto& w : warnings) said = said || w.find("overlap_comm") != std::string::npos;
  EXPECT_TRUE(said) << "check() returns initialize()'s warnings";
  auto errors = testing::run_thread_ranks(2, [&](Communicator& c) {
    auto engine = initialize(plain_net(), config, borrowed(c));
    EXPECT_EQ(engine->gradient_accumulation_steps(), 1);
  });
  for (auto& e : errors) ASSERT_FALSE(e) << testing::error_text(e);
  // The batch is resolved for the world size given: 4 samples do not split over 3 ranks.
  const std::string bad = testing::error_of<ConfigError>([&] { check(plain_net(), config, 3); });
  EXPECT_NE(bad.find("the world size given to dscpp::check()"), std::string::npos) << bad;
}

// Names of module classes, as a user writes them: leaf_module.classes takes TORCH_MODULE's name
// without "Impl" as torch_autocast's list does; every bad name is listed at once with the
// model's classes; a safe-module class that holds no parameters itself is said to change nothing.
TEST(CheckModel, ClassNamesAsAUserWritesThem) {
  struct BlockImpl : torch::nn::Module {
    BlockImpl() { fc = register_module("fc", torch::nn::Linear(4, 4)); }
    torch::nn::Linear fc{nullptr};
  };
  struct Model : torch::nn::Module {
    Model() {
      for (const char* n : {"a", "b"}) register_module(n, std::make_shared<BlockImpl>());
    }
  };
  auto model = std::make_shared<Model>();
  const std::string stage3 = kAdamW + std::string(R"(, "zero_optimization": {"stage": 3, )");
  // "Block" and "BlockImpl" both name BlockImpl (Module::name() is the C++ type's).
  std::string type = model->named_modules()["a"]->name();
  const std::string bare = type.substr(type.rfind("::") + 2);
  ASSERT_EQ(bare.substr(bare.size() - 4), "Impl") << type;
  for (const std::string& cls : {bare, bare.substr(0, bare.size() - 4)}) {
    EXPECT_NO_THROW(check(
        model, config_json(4, 2, stage3 + R"("leaf_module": {"classes": [")" + cls + R"("]}})"), 2))
        << cls;
  }
  const std::string leaf = testing::error_of<ConfigError>([&] {
    check(model, config_json(4, 2, stage3 + R"("leaf_module": {"classes": ["Blok"]}})"), 2);
  });
  EXPECT_NE(leaf.find("leaf_module.classes \"Blok\". Its module classes are: "), std::string::npos)
      << leaf;
  EXPECT_NE(leaf.find(type), std::string::npos) << leaf;
  const std::string autocast = kAdamW + std::string(R"(, "torch_autocast": {"enabled": true, )");
  const std::string both = testing::error_of<ConfigError>([&] {
    check(model,
          config_json(4, 2, autocast + R"("lower_precision_safe_modules": ["Blok", "Lin"]})"), 2);
  });
  EXPECT_NE(both.find("\"Blok\" (read as the C++ class Blok), \"Lin\" (read as the C++ class "
                      "Lin) name no module of the model"),
            std::string::npos)
      << both;
  const auto warnings = check(
      model, config_json(4, 2, autocast + R"("lower_precision_safe_modules": ["Block"]})"), 2);
  bool said = false;
  for (const auto& w : warnings)
    said = said || w.find(
                       "\"Block\" names modules that hold no "
                       "parameters themselves") != std::string::npos;
  EXPECT_TRUE(said);
}

TEST(CheckModel, ShapesOnlyKeepsTheShapesAndNoValues) {
  const models::GPTConfig gc{/*vocab_size=*/96, /*block_size=*/16, /*n_layer=*/3, /*n_head=*/4,
                             /*n_embd=*/64};
  models::GPT real(gc, 3);
  models::GPT shapes(nullptr);
  {
    zero::ShapesOnly scope;
    shapes = models::GPT(gc, 3);
  }
  const auto a = real->named_parameters(), b = shapes->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].key(), b[i].key());
    EXPECT_EQ(a[i].value().sizes(), b[i].value().sizes()) << a[i].key();
    EXPECT_EQ(b[i].value().scalar_type(), at::kFloat);
    EXPECT_FALSE(zero::is_shapes_only(a[i].value()));
    if (b[i].value().numel() > 1) {
      EXPECT_TRUE(zero::is_shapes_only(b[i].value())) << b[i].key();
      EXPECT_LE(b[i].value().storage().nbytes(), 4u) << b[i].key();
    }
  }
  // Judged as the model it describes: the same decision, the same text.
  testing::TempDir dir;
  const std::string config = config_json(
      4, 2,
      kAdamW +
          std::string(
              R"(, "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "offload_optimizer": {"device": "nvme", "nvme_path": ")") +
          dir.path() + R"("}, "offload_param": {"device": "nvme", "nvme_path": ")" + dir.path() +
          R"(", "buffer_size": 1000, "max_in_cpu": 0}})");
  InitOptions opts;
  opts.zero_units = models::GPTImpl::zero_units();
  const std::string on_real =
      testing::error_of<ConfigError>([&] { check(real.ptr(), config, 2, opts); });
  const std::string on_shapes =
      testing::error_of<ConfigError>([&] { check(shapes.ptr(), config, 2, opts); });
  EXPECT_EQ(on_real, on_shapes);
  EXPECT_NE(on_shapes.find("buffer_size 1000 elements is smaller"), std::string::npos) << on_shapes;
  // It cannot train.
  auto errors = testing::run_thread_ranks(1, [&](Communicator& c) {
    const std::string msg = testing::error_of<ConfigError>(
        [&] { initialize(shapes.ptr(), config_json(2, 2, kAdamW), borrowed(c)); });
    EXPECT_NE(msg.find("built for its shapes only (zero::ShapesOnly)"), std::string::npos) << msg;
  });
  for (auto& e : errors) ASSERT_FALSE(e) << testing::error_text(e);
}

}  // namespace
}  // namespace dscpp::enginetest
