// Tests of the GPT's fused bf16 kernels (NOTE [GPT fused kernels] in src/models/fused_ops.h):
// each kernel path against libtorch's fp32 math on the same bf16 inputs, forward and backward,
// on lengths that are not multiples of a vector (so the scalar tails run); the causal zeros;
// extreme GELU inputs; DSCPP_GPT_KERNELS; and the bf16 GPT with and without them.
#include "models/fused_ops.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "dscpp/error.h"
#include "dscpp/models/gpt.h"
#include "optim/dispatch.h"
#include "support/errors.h"

namespace dscpp::models {
namespace {

// Sets DSCPP_GPT_KERNELS while alive.
class ScopedGptKernels {
 public:
  explicit ScopedGptKernels(const std::string& value) {
    setenv("DSCPP_GPT_KERNELS", value.c_str(), 1);
  }
  ~ScopedGptKernels() { unsetenv("DSCPP_GPT_KERNELS"); }
};

std::vector<std::string> fused_paths() {
  std::vector<std::string> paths = {"scalar"};
  if (optim::cpu_supports(optim::KernelPath::kAvx512)) paths.push_back("avx512");
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

// One bf16 rounding is 2^-9 relative; a result computed in fp32 from bf16 inputs and rounded
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
  std::vector<float> edges = {-100.f, -13.5f, -12.f, -9.f, -6.f, -5.f, -4.f, -3.f, -1.f,
                              -1e-3f, 0.f,    1e-3f, 1.f,  3.f,  6.f,  12.f, 100.f};
  const at::Tensor x =
      torch::cat({random_bf16({1001}, 3.0), torch::tensor(edges).to(at::kBFloat16)});
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
    // from the tail, not as 1 - (1 - tail)): within bf16's rounding down to x = -6, a few
    // percent (the approximation's own error) to x = -13, where the values reach 1e-38.
    for (const auto& [region, tol] : {std::pair{near, 2.0 / 256}, std::pair{far, 0.03}}) {
      expect_close(y.masked_select(region), want.masked_select(region), tol, 1e-37,
                   path + " forward");
      expect_close(gx.masked_select(region), want_grad.masked_select(region), tol, 1e-37,
                   path + " backward");
    }
    EXPECT_LE(y.masked_select(beyond).abs().max().item<double>(), 1e-30) << path;
    EXPECT_LE(gx.masked_select(beyond).abs().max().item<double>(), 1e-30) << path;
    const at::Tensor nan = torch::full({3}, std::nan("")).to(at::kBFloat16);
    EXPECT_TRUE(fused_gelu(nan).isnan().all().item<bool>()) << path;
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

}  // namespace
}  // namespace dscpp::models
