// Tests of the GPT's fused bf16 kernels (NOTE [GPT fused kernels] in src/models/fused_ops.h):
// each kernel path against libtorch's fp32 math on the same bf16 inputs, forward and backward,
// on lengths that are not multiples of a vector (so the scalar tails run); the causal zeros;
// extreme GELU inputs; DSCPP_GPT_KERNELS; and the bf16 GPT with and without them.
#include "models/fused_ops.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/error.h"
#include "dscpp/models/gpt.h"
#include "optim/dispatch.h"
#include "support/errors.h"
#include "support/scoped_env.h"

namespace dscpp::models {
namespace {

// Sets DSCPP_GPT_KERNELS while alive, then restores what it was.
class ScopedGptKernels : public testing::ScopedEnv {
 public:
  explicit ScopedGptKernels(const std::string& value) : ScopedEnv("DSCPP_GPT_KERNELS", value) {}
};

std::vector<std::string> fused_paths() {
  std::vector<std::string> paths = {"scalar"};
  if (optim::cpu_supports(optim::KernelPath::kAvx512)) {
    paths.push_back("avx512");
  } else {
    static const bool said = [] {
      std::cout << "[   NOTE   ] this CPU has no AVX-512F: only the scalar kernels are tested\n";
      return true;
    }();
    (void)said;
  }
  return paths;
}

// |got - want| <= tol * (|want| + floor), elementwise; reports the worst element.
void expect_close(const at::Tensor& got, const at::Tensor& want, double tol, double floor,
                  const std::string& what) {
  const at::Tensor g = got.to(at::kFloat), w = want.to(at::kFloat);
  ASSERT_EQ(g.sizes(), w.sizes()) << what;
  const at::Tensor excess = (g - w).abs() - tol * (w.abs() + floor);
  const int64_t worst = excess.flatten().argmax().item<int64_t>();
  EXPECT_LE(excess.flatten()[worst].item<double>(), 0.0)
      << what << ": element " << worst << " is " << g.flatten()[worst].item<double>()
      << ", expected " << w.flatten()[worst].item<double>();
}

at::Tensor random_bf16(at::IntArrayRef shape, double scale = 1.0) {
  return (torch::randn(shape) * scale).to(at::kBFloat16);
}

// One bf16 rounding is up to 2^-8 relative; a result computed in fp32 from bf16 inputs and rounded
// once is within that of the fp32 reference, and a backward that reads its bf16 output within a
// few of them.
constexpr double kForwardTol = 1.0 / 256;
constexpr double kBackwardTol = 1.0 / 64;

TEST(GptFusedKernels, CausalSoftmaxMatchesFp32MathBothWays) {
  torch::manual_seed(1);
  const int64_t t = 37;  // rows of 1..37 visible keys: vector bodies and scalar tails
  const double scale = 0.125;
  const at::Tensor x = random_bf16({2, 3, t, t}, 4.0), gy = random_bf16({2, 3, t, t});
  const at::Tensor mask = torch::full({t, t}, -std::numeric_limits<double>::infinity()).triu(1);
  const at::Tensor xf = x.to(at::kFloat).requires_grad_();
  const at::Tensor want = torch::softmax(xf * scale + mask, -1);
  want.backward(gy.to(at::kFloat));
  for (const auto& path : fused_paths()) {
    ScopedGptKernels use(path);
    const at::Tensor xb = x.clone().requires_grad_();
    const at::Tensor y = fused_causal_softmax(xb, scale);
    y.backward(gy);
    expect_close(y, want, kForwardTol, 1e-6, path + " forward");
    // Each row's mass stays 1 (a bf16 rounding per element) and nothing leaks past the diagonal.
    expect_close(y.to(at::kFloat).sum(-1), torch::ones({2, 3, t}), 4.0 / 256, 0.0,
                 path + " row sums");
    const at::Tensor above = torch::ones({t, t}, torch::kBool).triu(1);
    EXPECT_TRUE(y.masked_select(above).eq(0).all().item<bool>()) << path;
    EXPECT_TRUE(xb.grad().masked_select(above).eq(0).all().item<bool>()) << path;
    // The backward reads y in bf16 (as libtorch's does): gx = s y (gy - sum gy y) is then off by
    // bf16's rounding of y in each term, s y (|gy| + sum |gy| y), which cancellation can make
    // large relative to gx, plus the rounding of gx itself.
    const at::Tensor yf = want.detach(), gyf = gy.to(at::kFloat);
    const at::Tensor dot_abs = (gyf.abs() * yf).sum(-1, /*keepdim=*/true);
    const at::Tensor bound =
        kForwardTol * (scale * yf * (gyf.abs() + dot_abs) + xf.grad().abs()) + 1e-7;
    const at::Tensor excess = (xb.grad().to(at::kFloat) - xf.grad()).abs() - bound;
    EXPECT_LE(excess.max().item<double>(), 0.0) << path << " backward";
  }
}

TEST(GptFusedKernels, LayerNormMatchesFp32MathBothWays) {
  torch::manual_seed(2);
  const int64_t c = 77;
  const at::Tensor x = (random_bf16({3, 5, c}, 2.0).to(at::kFloat) + 3.0).to(at::kBFloat16);
  const at::Tensor w = (1.0 + random_bf16({c}, 0.1).to(at::kFloat)).to(at::kBFloat16);
  const at::Tensor b = random_bf16({c}, 0.1), gy = random_bf16({3, 5, c});
  const at::Tensor xf = x.to(at::kFloat).requires_grad_();
  const at::Tensor wf = w.to(at::kFloat).requires_grad_(), bf = b.to(at::kFloat).requires_grad_();
  const at::Tensor want = at::layer_norm(xf, {c}, wf, bf, 1e-5);
  want.backward(gy.to(at::kFloat));
  for (const auto& path : fused_paths()) {
    ScopedGptKernels use(path);
    const at::Tensor xb = x.clone().requires_grad_();
    const at::Tensor wb = w.clone().requires_grad_(), bb = b.clone().requires_grad_();
    const at::Tensor y = fused_layer_norm(xb, wb, bb, 1e-5);
    y.backward(gy);
    expect_close(y, want, kForwardTol, 1e-2, path + " forward");
    expect_close(xb.grad(), xf.grad(), kBackwardTol, 1e-1, path + " grad x");
    EXPECT_EQ(wb.grad().scalar_type(), at::kBFloat16);
    expect_close(wb.grad(), wf.grad(), kBackwardTol, 1e-1, path + " grad weight");
    expect_close(bb.grad(), bf.grad(), kForwardTol, 1e-2, path + " grad bias");
  }
}

TEST(GptFusedKernels, GeluMatchesFp32MathBothWaysIncludingTheTails) {
  torch::manual_seed(3);
  // The edge values first, so the vector body (not only the scalar tail) computes them.
  std::vector<float> edges = {-100.f, -13.5f, -12.f, -9.f, -6.f, -5.f, -4.f, -3.f, -1.f,
                              -1e-3f, 0.f,    1e-3f, 1.f,  3.f,  6.f,  12.f, 100.f};
  const at::Tensor x =
      torch::cat({torch::tensor(edges).to(at::kBFloat16), random_bf16({1001}, 3.0)});
  const at::Tensor gy = random_bf16({x.numel()});
  // In fp64 with erfc: libtorch's gelu computes 1 + erf(x / sqrt(2)), which cancels to 0 for
  // x below about -8 even in fp64.
  const at::Tensor xd = x.to(at::kDouble);
  const at::Tensor phi = 0.5 * torch::erfc(-xd / std::sqrt(2.0));
  const at::Tensor want = xd * phi;
  const at::Tensor want_grad =
      gy.to(at::kDouble) * (phi + xd * torch::exp(-0.5 * xd * xd) / std::sqrt(2.0 * M_PI));
  const at::Tensor near = xd >= -6.0, far = (xd < -6.0) & (xd > -13.0), beyond = xd <= -13.0;
  for (const auto& path : fused_paths()) {
    ScopedGptKernels use(path);
    const at::Tensor xb = x.clone().requires_grad_();
    const at::Tensor y = fused_gelu(xb);
    y.backward(gy);
    const at::Tensor gx = xb.grad();
    // Relative to the value itself, down to the far negative tail (the cdf is computed there
    // from the tail, not as 1 - (1 - tail)): within two bf16 roundings down to x = -6 (0.16%
    // at -5, 0.36% at -6), a few percent (the approximation's own error: 3% at -12) to x = -13,
    // where the values reach 1e-38.
    for (const auto& [region, tol] : {std::pair{near, 2.0 / 256}, std::pair{far, 0.05}}) {
      expect_close(y.masked_select(region), want.masked_select(region), tol, 1e-37,
                   path + " forward");
      expect_close(gx.masked_select(region), want_grad.masked_select(region), tol, 1e-37,
                   path + " backward");
    }
    EXPECT_LE(y.masked_select(beyond).abs().max().item<double>(), 1e-30) << path;
    EXPECT_LE(gx.masked_select(beyond).abs().max().item<double>(), 1e-30) << path;
  }
}

// Infinities and NaN, in the vector body as well as the tail: gelu(inf) = inf (the limit, as
// libtorch 1.13 gave; libtorch 2.15's own kernel returns NaN there), gelu(-inf) = NaN and NaN
// gradients at both infinities (as both libtorch lines), NaN from NaN; finite values as
// libtorch's fp32 GELU.
TEST(GptFusedKernels, GeluOfInfinitiesAndNanAreDefined) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  // 16 vector lanes (four times inf, -inf, NaN, 1), then 3 in the scalar tail.
  std::vector<float> values;
  for (int i = 0; i < 4; ++i) values.insert(values.end(), {inf, -inf, nan, 1.f});
  values.insert(values.end(), {nan, inf, -inf});
  const at::Tensor x = torch::tensor(values).to(at::kBFloat16);
  const at::Tensor one = torch::ones({1}, at::TensorOptions().requires_grad(true));
  const at::Tensor gelu_one = torch::gelu(one);
  gelu_one.backward();
  const double y1 = gelu_one.item<double>(), g1 = one.grad().item<double>();
  for (const auto& path : fused_paths()) {
    ScopedGptKernels use(path);
    const at::Tensor xb = x.clone().requires_grad_();
    const at::Tensor y = fused_gelu(xb);
    y.backward(torch::ones_like(xb));
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float v = values[i];
      const double got_y = y[i].item<double>(), got_g = xb.grad()[i].item<double>();
      if (v == inf) {
        EXPECT_EQ(got_y, inf) << path << " element " << i;
      } else if (v == 1.f) {
        EXPECT_NEAR(got_y, y1, 1e-2 * y1) << path << " element " << i;
      } else {
        EXPECT_TRUE(std::isnan(got_y)) << path << " element " << i << ": " << got_y;
      }
      if (v == 1.f) {
        EXPECT_NEAR(got_g, g1, 1e-2 * g1) << path << " element " << i;
      } else {
        EXPECT_TRUE(std::isnan(got_g)) << path << " element " << i << ": " << got_g;
      }
    }
  }
}

// Each result is rounded to bf16 once, to nearest even, exactly as c10::BFloat16 rounds: a layer
// norm of rows of +-1 with eps 0 has mean 0 and 1/std 1 exactly, so y = x w + b is one fp32 fma
// and one bf16 rounding. Ties, overflow to inf and NaN included; 64 columns fill vector lanes.
TEST(GptFusedKernels, RoundsToBf16AsC10Does) {
  torch::manual_seed(5);
  const int64_t c = 64;
  const at::Tensor x = torch::tensor({1.f, -1.f}).repeat({5, c / 2}).to(at::kBFloat16);
  at::Tensor w = random_bf16({c}, 2.0).to(at::kFloat), b = random_bf16({c}, 2.0).to(at::kFloat);
  // Ties: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 (to 1, even); (1 + 2^-7) + 2^-8 is halfway
  // between 1 + 2^-7 and 1 + 2^-6 (to 1 + 2^-6, even); the largest bf16 plus half an ulp
  // rounds to inf; a NaN bias.
  const std::vector<std::array<float, 2>> special = {{1.f, 0x1p-8f},
                                                     {1.f + 0x1p-7f, 0x1p-8f},
                                                     {-1.f, -0x1p-8f},
                                                     {0x1.fep127f, 0x1p119f},
                                                     {1.f, std::nanf("")}};
  for (size_t k = 0; k < special.size(); ++k) {
    w[static_cast<int64_t>(2 * k)] = special[k][0];  // x is +1 on even columns
    b[static_cast<int64_t>(2 * k)] = special[k][1];
  }
  const at::Tensor wb = w.to(at::kBFloat16), bb = b.to(at::kBFloat16);
  const at::Tensor want = (x.to(at::kFloat) * wb.to(at::kFloat) + bb.to(at::kFloat));
  for (const auto& path : fused_paths()) {
    ScopedGptKernels use(path);
    const at::Tensor y = fused_layer_norm(x, wb, bb, 0.0);
    for (int64_t i = 0; i < y.numel(); ++i) {
      const float ref = want.flatten()[i].item<float>();
      const c10::BFloat16 rounded(ref);  // c10's scalar round to nearest even
      const c10::BFloat16 got = y.flatten()[i].item<c10::BFloat16>();
      if (std::isnan(ref)) {
        EXPECT_TRUE(std::isnan(static_cast<float>(got))) << path << " element " << i;
      } else {
        EXPECT_EQ(got.x, rounded.x) << path << " element " << i << ": " << ref;
      }
    }
  }
}

// A softmax row that holds -inf scores gives them exactly 0 (exp underflows to 0, not to a
// subnormal); a row with a NaN or a +inf score is NaN (as libtorch's), in vector lanes and tail
// alike.
TEST(GptFusedKernels, CausalSoftmaxOfInfiniteAndNanScores) {
  const int64_t t = 21;
  at::Tensor x = torch::zeros({t, t});
  x[20].slice(0, 0, 18).fill_(-std::numeric_limits<float>::infinity());  // keys 18..20 remain
  x[19][3] = std::nanf("");
  x[17][2] = std::numeric_limits<float>::infinity();
  for (const auto& path : fused_paths()) {
    ScopedGptKernels use(path);
    const at::Tensor y = fused_causal_softmax(x.to(at::kBFloat16), 1.0).to(at::kFloat);
    EXPECT_TRUE(y[20].slice(0, 0, 18).eq(0).all().item<bool>()) << path;
    EXPECT_TRUE(y[20].slice(0, 18).allclose(torch::full({3}, 1.0 / 3), 1e-2)) << path;
    EXPECT_TRUE(y[19].slice(0, 0, 20).isnan().all().item<bool>()) << path;
    EXPECT_TRUE(y[17].slice(0, 0, 18).isnan().all().item<bool>()) << path;  // +inf: inf - inf
    EXPECT_TRUE(y[18].sum().sub(1).abs().le(1e-2).item<bool>()) << path;
  }
}

// Their backwards are computed outside autograd: a graph built through them would miss terms,
// so a backward with create_graph is refused by name.
TEST(GptFusedKernels, DoubleBackwardIsRefused) {
  const at::Tensor w = torch::ones({8}, at::kBFloat16), b = torch::zeros({8}, at::kBFloat16);
  const std::vector<std::pair<std::string, std::function<at::Tensor(const at::Tensor&)>>> ops = {
      {"GELU", [](const at::Tensor& x) { return fused_gelu(x); }},
      {"layer norm", [&](const at::Tensor& x) { return fused_layer_norm(x, w, b, 1e-5); }},
      {"causal softmax", [](const at::Tensor& x) { return fused_causal_softmax(x, 0.5); }}};
  for (const auto& path : fused_paths()) {
    ScopedGptKernels use(path);
    for (const auto& [name, op] : ops) {
      const at::Tensor x = random_bf16({8, 8}).requires_grad_();
      const at::Tensor y = (op(x) * random_bf16({8, 8})).sum();
      const std::string msg = testing::error_of<Error>([&] {
        torch::autograd::grad({y}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true);
      });
      EXPECT_NE(msg.find(name + " has no double backward"), std::string::npos) << path << msg;
      EXPECT_NE(msg.find("DSCPP_GPT_KERNELS=torch"), std::string::npos) << path << msg;
      // Without create_graph it is an ordinary backward.
      EXPECT_EQ(torch::autograd::grad({y}, {x})[0].sizes(), x.sizes()) << path << " " << name;
    }
  }
}

// The layer norm's weight and bias gradients are summed over fixed row chunks: the same bits
// whatever the number of threads.
TEST(GptFusedKernels, LayerNormGradientsDoNotDependOnTheThreadCount) {
  torch::manual_seed(6);
  const at::Tensor x = random_bf16({40, 24}), gy = random_bf16({40, 24});
  const at::Tensor w = random_bf16({24}), b = random_bf16({24});
  const int threads = at::get_num_threads();
  for (const auto& path : fused_paths()) {
    ScopedGptKernels use(path);
    std::vector<at::Tensor> got;
    for (int n : {1, 3}) {
      at::set_num_threads(n);
      const at::Tensor wb = w.clone().requires_grad_(), bb = b.clone().requires_grad_();
      fused_layer_norm(x, wb, bb, 1e-5).backward(gy);
      got.push_back(torch::cat({wb.grad(), bb.grad()}));
    }
    at::set_num_threads(threads);
    EXPECT_TRUE(got[0].view(at::kShort).equal(got[1].view(at::kShort))) << path;
  }
}

TEST(GptFusedKernels, EmptyTensorsGiveEmptyResults) {
  for (const auto& path : fused_paths()) {
    ScopedGptKernels use(path);
    const at::Tensor scores = torch::zeros({2, 3, 0, 0}, at::kBFloat16).requires_grad_();
    const at::Tensor y = fused_causal_softmax(scores, 0.5);
    y.sum().backward();
    EXPECT_EQ(scores.grad().sizes(), scores.sizes()) << path;
    const at::Tensor w = torch::ones({0}, at::kBFloat16).requires_grad_();
    const at::Tensor x = torch::zeros({4, 0}, at::kBFloat16).requires_grad_();
    fused_layer_norm(x, w, torch::zeros({0}, at::kBFloat16), 1e-5).sum().backward();
    EXPECT_EQ(x.grad().sizes(), x.sizes()) << path;
    EXPECT_EQ(fused_gelu(torch::zeros({0}, at::kBFloat16)).numel(), 0) << path;
  }
}

TEST(GptFusedKernels, KernelPathFollowsTheEnvironment) {
  const at::Tensor bf16 = torch::zeros({4, 4}, at::kBFloat16);
  {
    ScopedGptKernels use("torch");
    EXPECT_EQ(active_gpt_kernels(), GptKernels::kTorch);
    EXPECT_FALSE(use_fused_kernels(bf16));
  }
  {
    ScopedGptKernels use("scalar");
    EXPECT_TRUE(use_fused_kernels(bf16));
    EXPECT_FALSE(use_fused_kernels(torch::zeros({4, 4})));                 // fp32
    EXPECT_FALSE(use_fused_kernels(bf16.transpose(0, 1).slice(0, 0, 2)));  // not contiguous
  }
  {
    ScopedGptKernels use("fastest");
    const std::string msg = testing::error_of<ConfigError>([] { active_gpt_kernels(); });
    EXPECT_NE(msg.find("DSCPP_GPT_KERNELS='fastest'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("auto, avx512, scalar or torch"), std::string::npos) << msg;
    // Building the GPT already checks it.
    EXPECT_THROW(GPT(GPTConfig{13, 8, 1, 2, 8}, 1), ConfigError);
  }
  const GptKernels dflt = active_gpt_kernels();
  EXPECT_EQ(dflt, optim::cpu_supports(optim::KernelPath::kAvx512) ? GptKernels::kAvx512
                                                                  : GptKernels::kTorch);
}

// The bf16 GPT's loss and gradients with the fused kernels agree with libtorch's ops.
TEST(GptFusedKernels, Bf16GptAgreesWithLibtorchOps) {
  GPTConfig config{/*vocab_size=*/13, /*block_size=*/19, /*n_layer=*/2, /*n_head=*/3,
                   /*n_embd=*/24};
  torch::manual_seed(4);
  const at::Tensor idx = torch::randint(0, 13, {2, 19}, at::kLong);
  const at::Tensor targets = torch::randint(0, 13, {2, 19}, at::kLong);
  auto run = [&](const std::string& path) {
    ScopedGptKernels use(path);
    GPT model(config, 7);
    model->to(at::kBFloat16);
    const at::Tensor loss = model->loss(idx, targets);
    loss.backward();
    std::vector<at::Tensor> grads = {loss.detach().reshape({1}).to(at::kFloat)};
    for (const auto& p : model->parameters()) grads.push_back(p.grad().flatten().to(at::kFloat));
    return grads;
  };
  const auto want = run("torch");
  for (const auto& path : fused_paths()) {
    const auto got = run(path);
    expect_close(got[0], want[0], 1.0 / 128, 0.0, path + " loss");
    const at::Tensor g = torch::cat(std::vector<at::Tensor>(got.begin() + 1, got.end()));
    const at::Tensor w = torch::cat(std::vector<at::Tensor>(want.begin() + 1, want.end()));
    // bf16 gradients through two blocks: compare as vectors (elementwise bf16 noise is large).
    EXPECT_LT(((g - w).norm() / w.norm()).item<double>(), 0.05) << path;
  }
}


// NOTE [GPT attention]: DSCPP_GPT_ATTENTION picks sdpa or math; auto takes math for bf16 CPU
// tensors and sdpa for the others; anything else is refused when the GPT is built.
TEST(GptAttention, PathFollowsTheEnvironmentAndTheDtype) {
  const at::Tensor fp32 = torch::zeros({1, 1, 4, 2}), bf16 = fp32.to(at::kBFloat16);
  EXPECT_EQ(active_gpt_attention(fp32), GptAttention::kSdpa);
  EXPECT_EQ(active_gpt_attention(bf16), GptAttention::kMath);
  EXPECT_EQ(active_gpt_attention(fp32.to(at::kHalf)), GptAttention::kSdpa);
  {
    testing::ScopedEnv use("DSCPP_GPT_ATTENTION", "math");
    EXPECT_EQ(active_gpt_attention(fp32), GptAttention::kMath);
  }
  {
    testing::ScopedEnv use("DSCPP_GPT_ATTENTION", "sdpa");
    EXPECT_EQ(active_gpt_attention(bf16), GptAttention::kSdpa);
  }
  {
    testing::ScopedEnv use("DSCPP_GPT_ATTENTION", "flash");
    const std::string msg = testing::error_of<ConfigError>([&] { active_gpt_attention(fp32); });
    EXPECT_NE(msg.find("DSCPP_GPT_ATTENTION='flash'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("auto, sdpa or math"), std::string::npos) << msg;
    EXPECT_THROW(GPT(GPTConfig{13, 8, 1, 2, 8}, 1), ConfigError);
  }
}

// The two attentions compute the same loss and gradients: to rounding in fp32, to bf16's
// precision in bf16 (both the fused softmax and libtorch's under math).
TEST(GptAttention, SdpaAndMathAgree) {
  GPTConfig config{/*vocab_size=*/13, /*block_size=*/19, /*n_layer=*/2, /*n_head=*/3,
                   /*n_embd=*/24};
  torch::manual_seed(5);
  const at::Tensor idx = torch::randint(0, 13, {2, 19}, at::kLong);
  const at::Tensor targets = torch::randint(0, 13, {2, 19}, at::kLong);
  auto run = [&](const std::string& attention, at::ScalarType dtype) {
    testing::ScopedEnv use("DSCPP_GPT_ATTENTION", attention);
    GPT model(config, 7);
    model->to(dtype);
    const at::Tensor loss = model->loss(idx, targets);
    loss.backward();
    std::vector<at::Tensor> parts = {loss.detach().reshape({1}).to(at::kFloat)};
    for (const auto& p : model->parameters()) parts.push_back(p.grad().flatten().to(at::kFloat));
    return torch::cat(parts);
  };
  const at::Tensor want = run("math", at::kFloat), got = run("sdpa", at::kFloat);
  EXPECT_LT(((got - want).abs().max() / want.abs().max()).item<double>(), 1e-5);
  const at::Tensor want16 = run("math", at::kBFloat16), got16 = run("sdpa", at::kBFloat16);
  EXPECT_LT(((got16 - want16).norm() / want16.norm()).item<double>(), 0.05);
  EXPECT_LT(((got16 - want).norm() / want.norm()).item<double>(), 0.05);
}
}  // namespace
}  // namespace dscpp::models
