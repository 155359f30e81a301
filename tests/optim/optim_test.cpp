// The fused optimizers against references, on every kernel path this CPU has (scalar, AVX2,
// AVX-512) and the ATen path, over awkward lengths (1, 7, 8, 9, 15, 16, 17, 31, 33, 63, 65 around
// the SIMD widths, and 1000003 across several threads): Adam / AdamW / SGD / Adagrad against
// libtorch's own torch::optim on the same tensors, Lamb and Lion (and Adam without bias
// correction, which torch lacks) against plain fp64 references written here from the published
// rules. Agreement: max|a - b| / max|b| <= 1e-6 for the parameters and every state tensor after
// several steps with a changing lr and a fused grad_scale.
#include "dscpp/optim.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/optim.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "dscpp/error.h"
#include "optim/dispatch.h"
#include "support/scoped_env.h"

namespace dscpp::optim {
namespace {

constexpr double kTol = 1e-6;
constexpr int kSteps = 6;
const std::vector<int64_t> kSizes = {1, 7, 8, 9, 15, 16, 17, 31, 33, 63, 65, 1000003};

// Every path this machine can run: the SIMD levels it supports, and ATen ops.
std::vector<KernelPath> paths() {
  std::vector<KernelPath> out;
  for (KernelPath p :
       {KernelPath::kScalar, KernelPath::kAvx2, KernelPath::kAvx512, KernelPath::kTorch}) {
    if (cpu_supports(p)) out.push_back(p);
  }
  return out;
}

// max|a - b| / max(max|b|, tiny), in fp64.
double rel_err(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor ad = a.to(at::kDouble), bd = b.to(at::kDouble);
  const double scale = std::max(bd.abs().max().item<double>(), 1e-30);
  return (ad - bd).abs().max().item<double>() / scale;
}

double step_lr(double base, int t) { return base * (1.0 + 0.1 * t); }  // t = 1..kSteps

// The gradients of step t (1-based) for a buffer of n elements.
at::Tensor make_grad(int64_t n, int t, uint64_t seed) {
  at::manual_seed(static_cast<int64_t>(seed * 131 + t));
  return at::randn({n}, at::kFloat);
}

at::Tensor make_params(int64_t n, uint64_t seed) {
  at::manual_seed(static_cast<int64_t>(seed));
  return at::randn({n}, at::kFloat);
}

// Runs `opt` for kSteps with the gradients of make_grad multiplied by grad_scale (and
// ctx.grad_scale set, so the kernel must undo it). betas_override: optional per-step betas.
at::Tensor run_ours(Optimizer& opt, at::Tensor p, double base_lr, double grad_scale, uint64_t seed,
                    std::function<std::optional<std::pair<double, double>>(int)> betas = {}) {
  for (int t = 1; t <= kSteps; ++t) {
    const at::Tensor g = make_grad(p.numel(), t, seed) * grad_scale;
    StepContext ctx;
    ctx.lr = step_lr(base_lr, t);
    ctx.step = t;
    ctx.grad_scale = grad_scale;
    if (betas) ctx.betas_override = betas(t);
    opt.step(p, g, ctx);
  }
  return p;
}

// Runs a torch::optim optimizer on a copy of the same parameters with the unscaled gradients.
template <class TorchOpt, class Options>
std::pair<at::Tensor, TorchOpt*> run_torch(std::unique_ptr<TorchOpt>& holder, const at::Tensor& p0,
                                           Options options, double base_lr, uint64_t seed) {
  at::Tensor p = p0.clone().set_requires_grad(true);
  holder = std::make_unique<TorchOpt>(std::vector<at::Tensor>{p}, options);
  for (int t = 1; t <= kSteps; ++t) {
    p.mutable_grad() = make_grad(p.numel(), t, seed);
    static_cast<Options&>(holder->param_groups()[0].options()).lr(step_lr(base_lr, t));
    holder->step();
  }
  return {p.detach(), holder.get()};
}

// The torch::optim state of the single parameter (iterated, since the map's key type differs
// between libtorch 1.x and 2.x).
template <class State>
const State& torch_state(torch::optim::Optimizer& opt, const at::Tensor& /*p*/) {
  EXPECT_EQ(opt.state().size(), 1u);
  return static_cast<const State&>(*opt.state().begin()->second);
}

std::string label(KernelPath path, int64_t n) {
  return std::string("path=") + to_string(path) + " n=" + std::to_string(n);
}

// ----- Adam / AdamW vs torch::optim -----------------------------------------------------------
struct AdamCase {
  bool adam_w_mode;
  double weight_decay;
  double grad_scale;
};

TEST(OptimAdam, MatchesTorchAdamAndAdamWOnEveryPathAndSize) {
  const std::vector<AdamCase> cases = {{true, 0.0, 1.0},     {true, 0.05, 1.0},
                                       {true, 0.05, 1024.0}, {false, 0.0, 3.0},
                                       {false, 0.05, 1.0},   {false, 0.05, 1024.0}};
  const double lr = 1e-2;
  for (KernelPath path : paths()) {
    ScopedKernelPath force(path);
    for (int64_t n : kSizes) {
      for (const AdamCase& c : cases) {
        SCOPED_TRACE(label(path, n) + " adam_w_mode=" + std::to_string(c.adam_w_mode) +
                     " wd=" + std::to_string(c.weight_decay) +
                     " grad_scale=" + std::to_string(c.grad_scale));
        AdamParams ap;
        ap.lr = lr;
        ap.betas = {0.9, 0.99};
        ap.eps = 1e-8;
        ap.weight_decay = c.weight_decay;
        ap.adam_w_mode = c.adam_w_mode;
        const uint64_t seed = 17 + n;
        const at::Tensor p0 = make_params(n, seed);
        Adam ours(ap, n, at::kFloat);
        const at::Tensor p = run_ours(ours, p0.clone(), lr, c.grad_scale, seed);

        at::Tensor ref;
        at::Tensor ref_m, ref_v;
        if (c.adam_w_mode) {
          std::unique_ptr<torch::optim::AdamW> holder;
          auto opts = torch::optim::AdamWOptions(lr)
                          .betas({0.9, 0.99})
                          .eps(1e-8)
                          .weight_decay(c.weight_decay);
          auto [rp, opt] = run_torch(holder, p0, opts, lr, seed);
          ref = rp;
          const auto& st = torch_state<torch::optim::AdamWParamState>(*opt, rp);
          ref_m = st.exp_avg();
          ref_v = st.exp_avg_sq();
        } else {
          std::unique_ptr<torch::optim::Adam> holder;
          auto opts = torch::optim::AdamOptions(lr)
                          .betas({0.9, 0.99})
                          .eps(1e-8)
                          .weight_decay(c.weight_decay);
          auto [rp, opt] = run_torch(holder, p0, opts, lr, seed);
          ref = rp;
          const auto& st = torch_state<torch::optim::AdamParamState>(*opt, rp);
          ref_m = st.exp_avg();
          ref_v = st.exp_avg_sq();
        }
        EXPECT_LE(rel_err(p, ref), kTol);
        auto state = ours.state();
        ASSERT_EQ(state.size(), 2u);
        EXPECT_EQ(state[0].first, "exp_avg");
        EXPECT_EQ(state[1].first, "exp_avg_sq");
        EXPECT_LE(rel_err(state[0].second, ref_m), kTol);
        EXPECT_LE(rel_err(state[1].second, ref_v), kTol);
      }
    }
  }
}

// Adam without bias correction (DeepSpeed's bias_correction false; torch has no such switch),
// and with per-step betas (OneCycle), against an fp64 loop written from the rule.
TEST(OptimAdam, NoBiasCorrectionAndBetasOverrideMatchPlainReference) {
  const double lr = 1e-2, eps = 1e-8;
  for (KernelPath path : paths()) {
    ScopedKernelPath force(path);
    for (int64_t n : kSizes) {
      for (bool adamw : {true, false}) {
        for (bool bias_correction : {false, true}) {
          SCOPED_TRACE(label(path, n) + " adamw=" + std::to_string(adamw) +
                       " bias_correction=" + std::to_string(bias_correction));
          const double wd = 0.03, grad_scale = 8.0;
          auto betas = [](int t) { return std::make_pair(0.95 - 0.01 * t, 0.99); };
          AdamParams ap;
          ap.lr = lr;
          ap.eps = eps;
          ap.weight_decay = wd;
          ap.adam_w_mode = adamw;
          ap.bias_correction = bias_correction;
          const uint64_t seed = 99 + n;
          const at::Tensor p0 = make_params(n, seed);
          Adam ours(ap, n, at::kFloat);
          const at::Tensor p = run_ours(ours, p0.clone(), lr, grad_scale, seed, betas);

          at::Tensor rp = p0.to(at::kDouble), m = at::zeros_like(rp), v = at::zeros_like(rp);
          for (int t = 1; t <= kSteps; ++t) {
            const auto [b1, b2] = betas(t);
            const double lr_t = step_lr(lr, t);
            at::Tensor g = make_grad(n, t, seed).to(at::kDouble);
            if (!adamw) g = g + wd * rp;
            m = b1 * m + (1 - b1) * g;
            v = b2 * v + (1 - b2) * g * g;
            const double bc1 = bias_correction ? 1 - std::pow(b1, t) : 1.0;
            const double bc2 = bias_correction ? 1 - std::pow(b2, t) : 1.0;
            const at::Tensor update = (m / bc1) / (at::sqrt(v / bc2) + eps);
            if (adamw) rp = rp * (1 - lr_t * wd);
            rp = rp - lr_t * update;
          }
          EXPECT_LE(rel_err(p, rp), kTol);
          EXPECT_LE(rel_err(ours.state()[0].second, m), kTol);
          EXPECT_LE(rel_err(ours.state()[1].second, v), kTol);
        }
      }
    }
  }
}

TEST(OptimAdam, AdamWForcesDecoupledWeightDecay) {
  AdamParams ap;
  ap.adam_w_mode = false;
  ap.weight_decay = 0.1;
  AdamW w(ap, 4, at::kFloat);
  Adam a_w(
      [&] {
        AdamParams q = ap;
        q.adam_w_mode = true;
        return q;
      }(),
      4, at::kFloat);
  at::Tensor p1 = at::ones({4}), p2 = at::ones({4});
  const at::Tensor g = at::full({4}, 0.5);
  StepContext ctx;
  ctx.lr = 0.1;
  w.step(p1, g, ctx);
  a_w.step(p2, g, ctx);
  EXPECT_TRUE(at::equal(p1, p2));
  EXPECT_STREQ(w.name(), "AdamW");
}

// bf16 mixed precision's step in one pass (NOTE [bf16 in the optimizer pass]): bf16 gradients
// read and bf16 parameters written by the update give the bits of the three passes they replace
// (widen the gradients, update, round the parameters with at::Tensor::to), on every path and
// length, including values that round up, down and to even and a non-finite update.
TEST(OptimAdam, Bf16GradientsInAndParametersOutGiveTheCastsBits) {
  for (KernelPath path : paths()) {
    ScopedKernelPath force(path);
    for (int64_t n : kSizes) {
      SCOPED_TRACE(label(path, n));
      AdamParams ap;
      ap.lr = 1e-2;
      ap.weight_decay = 0.05;
      Adam fused(ap, n, at::kFloat), casts(ap, n, at::kFloat);
      at::Tensor p_fused = make_params(n, 5 + n), p_casts = p_fused.clone();
      at::Tensor p16 = at::empty({n}, at::kBFloat16);
      for (int t = 1; t <= kSteps; ++t) {
        const at::Tensor g16 = (make_grad(n, t, 5 + n) * 1024.0).to(at::kBFloat16);
        StepContext ctx;
        ctx.lr = step_lr(ap.lr, t);
        ctx.step = t;
        ctx.grad_scale = 1024.0;
        casts.step(p_casts, g16.to(at::kFloat), ctx);
        ctx.bf16_params = p16;
        fused.step(p_fused, g16, ctx);
        ASSERT_TRUE(at::equal(p_fused, p_casts)) << "step " << t;
        ASSERT_TRUE(at::equal(p16, p_casts.to(at::kBFloat16))) << "step " << t;
      }
      EXPECT_TRUE(at::equal(fused.state()[0].second, casts.state()[0].second));
      EXPECT_TRUE(at::equal(fused.state()[1].second, casts.state()[1].second));
    }
    // Rounding: exact ties to even (1 + 2^-8 down, 1 + 3 * 2^-8 up), just above a tie, the
    // largest finite float (to +inf, as c10 rounds) and NaN (to bf16's NaN). lr 0 and no decay
    // keep the parameters as they are, so the update writes these values.
    const std::vector<float> v = {1.0f + 0x1p-8f,             // a tie, rounds down to even (1)
                                  1.0f + 3 * 0x1p-8f,         // a tie, rounds up to even (1 + 2^-6)
                                  1.0f + 0x1p-8f + 0x1p-20f,  // above a tie: up
                                  -2.5f,
                                  3.4028235e38f,
                                  std::nanf("")};
    std::vector<float> row;
    for (int i = 0; i < 3; ++i) row.insert(row.end(), v.begin(), v.end());  // 18: SIMD and tail
    at::Tensor p = at::tensor(row);
    const int64_t n = p.numel();
    Adam adam(AdamParams{}, n, at::kFloat);
    StepContext ctx;
    ctx.lr = 0.0;
    ctx.bf16_params = at::empty({n}, at::kBFloat16);
    adam.step(p, at::zeros({n}, at::kBFloat16), ctx);
    const at::Tensor want = p.to(at::kBFloat16), got = ctx.bf16_params;
    const at::Tensor finite = at::isfinite(p);
    EXPECT_TRUE(at::equal(got.masked_select(finite), want.masked_select(finite)))
        << to_string(path);
    EXPECT_TRUE(at::isnan(got).equal(at::isnan(p))) << to_string(path);
    EXPECT_TRUE(at::isinf(got).equal(at::isinf(want))) << to_string(path);
  }
  // Only an optimizer that writes it may be handed bf16_params.
  SgdParams sp;
  SGD sgd(sp, 4, at::kFloat);
  at::Tensor p = at::ones({4});
  StepContext ctx;
  ctx.lr = 0.1;
  ctx.bf16_params = at::empty({4}, at::kBFloat16);
  EXPECT_THROW(sgd.step(p, at::ones({4}), ctx), Error);
  Adam adam(AdamParams{}, 4, at::kFloat);
  ctx.bf16_params = at::empty({4}, at::kFloat);
  EXPECT_THROW(adam.step(p, at::ones({4}), ctx), Error);
  ctx.bf16_params = at::empty({3}, at::kBFloat16);
  EXPECT_THROW(adam.step(p, at::ones({4}), ctx), Error);
  EXPECT_TRUE(at::equal(p, at::ones({4})));
}

// The gradient norm's sum of squares (optim::sum_squares): fp32 and bf16 read as they are, on
// every SIMD path and length, against an fp64 sum of the widened values; the same bits for any
// number of threads; nullopt where the ATen path must sum (kTorch, a strided or fp64 tensor).
TEST(OptimSumSquares, MatchesAnFp64SumOnEveryPathLengthAndDtype) {
  for (KernelPath path : paths()) {
    ScopedKernelPath force(path);
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{17}, int64_t{65}, int64_t{3000017}}) {
      for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
        SCOPED_TRACE(label(path, n) + " " + c10::toString(dtype));
        at::manual_seed(n);
        const at::Tensor x = (at::randn({n}) * 3.0).to(dtype);
        const auto got = sum_squares(x);
        if (path == KernelPath::kTorch) {
          EXPECT_FALSE(got.has_value());
          continue;
        }
        ASSERT_TRUE(got.has_value());
        const at::Tensor xd = x.to(at::kDouble);
        const double want = n ? xd.dot(xd).item<double>() : 0.0;
        EXPECT_NEAR(*got, want, 1e-12 * std::max(want, 1.0));
        const int threads = at::get_num_threads();
        at::set_num_threads(threads == 1 ? 2 : 1);
        EXPECT_EQ(*sum_squares(x), *got) << "a different number of threads";
        at::set_num_threads(threads);
      }
    }
  }
  EXPECT_FALSE(sum_squares(at::ones({16}).slice(0, 0, 16, 2)).has_value());
  EXPECT_FALSE(sum_squares(at::ones({8}, at::kDouble)).has_value());
}

// ----- SGD vs torch::optim::SGD ---------------------------------------------------------------
struct SgdCase {
  double momentum, dampening, weight_decay;
  bool nesterov;
  double grad_scale;
};

TEST(OptimSGD, MatchesTorchSGDOnEveryPathAndSize) {
  const std::vector<SgdCase> cases = {{0.0, 0.0, 0.0, false, 1.0}, {0.0, 0.0, 0.01, false, 4.0},
                                      {0.9, 0.0, 0.0, false, 1.0}, {0.9, 0.1, 0.01, false, 3.0},
                                      {0.9, 0.0, 0.01, true, 1.0}, {0.8, 0.0, 0.0, true, 1024.0}};
  const double lr = 0.05;
  for (KernelPath path : paths()) {
    ScopedKernelPath force(path);
    for (int64_t n : kSizes) {
      for (const SgdCase& c : cases) {
        SCOPED_TRACE(label(path, n) + " momentum=" + std::to_string(c.momentum) + " dampening=" +
                     std::to_string(c.dampening) + " wd=" + std::to_string(c.weight_decay) +
                     " nesterov=" + std::to_string(c.nesterov));
        SgdParams sp;
        sp.lr = lr;
        sp.momentum = c.momentum;
        sp.dampening = c.dampening;
        sp.weight_decay = c.weight_decay;
        sp.nesterov = c.nesterov;
        const uint64_t seed = 5 + n;
        const at::Tensor p0 = make_params(n, seed);
        SGD ours(sp, n, at::kFloat);
        const at::Tensor p = run_ours(ours, p0.clone(), lr, c.grad_scale, seed);

        std::unique_ptr<torch::optim::SGD> holder;
        auto opts = torch::optim::SGDOptions(lr)
                        .momentum(c.momentum)
                        .dampening(c.dampening)
                        .weight_decay(c.weight_decay)
                        .nesterov(c.nesterov);
        auto [rp, opt] = run_torch(holder, p0, opts, lr, seed);
        EXPECT_LE(rel_err(p, rp), kTol);
        auto state = ours.state();
        if (c.momentum == 0.0) {
          EXPECT_TRUE(state.empty());
        } else {
          ASSERT_EQ(state.size(), 1u);
          EXPECT_EQ(state[0].first, "momentum_buffer");
          const auto& st = torch_state<torch::optim::SGDParamState>(*opt, rp);
          EXPECT_LE(rel_err(state[0].second, st.momentum_buffer()), kTol);
        }
      }
    }
  }
}

// ----- Adagrad vs torch::optim::Adagrad -------------------------------------------------------
struct AdagradCase {
  double lr_decay, weight_decay, initial_accumulator_value, grad_scale;
};

TEST(OptimAdagrad, MatchesTorchAdagradOnEveryPathAndSize) {
  const std::vector<AdagradCase> cases = {
      {0.0, 0.0, 0.0, 1.0}, {0.01, 0.0, 0.1, 1.0}, {0.0, 0.02, 0.0, 16.0}, {0.05, 0.02, 0.5, 3.0}};
  const double lr = 0.05;
  for (KernelPath path : paths()) {
    ScopedKernelPath force(path);
    for (int64_t n : kSizes) {
      for (const AdagradCase& c : cases) {
        SCOPED_TRACE(label(path, n) + " lr_decay=" + std::to_string(c.lr_decay) +
                     " wd=" + std::to_string(c.weight_decay) +
                     " init=" + std::to_string(c.initial_accumulator_value));
        AdagradParams ap;
        ap.lr = lr;
        ap.lr_decay = c.lr_decay;
        ap.weight_decay = c.weight_decay;
        ap.initial_accumulator_value = c.initial_accumulator_value;
        ap.eps = 1e-10;
        const uint64_t seed = 71 + n;
        const at::Tensor p0 = make_params(n, seed);
        Adagrad ours(ap, n, at::kFloat);
        const at::Tensor p = run_ours(ours, p0.clone(), lr, c.grad_scale, seed);

        std::unique_ptr<torch::optim::Adagrad> holder;
        auto opts = torch::optim::AdagradOptions(lr)
                        .lr_decay(c.lr_decay)
                        .weight_decay(c.weight_decay)
                        .initial_accumulator_value(c.initial_accumulator_value)
                        .eps(1e-10);
        auto [rp, opt] = run_torch(holder, p0, opts, lr, seed);
        EXPECT_LE(rel_err(p, rp), kTol);
        const auto& st = torch_state<torch::optim::AdagradParamState>(*opt, rp);
        ASSERT_EQ(ours.state().size(), 1u);
        EXPECT_EQ(ours.state()[0].first, "sum");
        EXPECT_LE(rel_err(ours.state()[0].second, st.sum()), kTol);
      }
    }
  }
}

// ----- Lion vs the published rule -------------------------------------------------------------
// Gradients keep one sign per element (-1, 0 or +1 pattern) so that c = b1*m + (1-b1)*g is never
// within rounding of 0, where fp32 and fp64 could disagree on sign(c); the zeros check sign(0)=0.
at::Tensor lion_grad(int64_t n, int t, uint64_t seed) {
  at::manual_seed(static_cast<int64_t>(seed));
  const at::Tensor pattern = at::randint(-1, 2, {n}).to(at::kFloat);
  at::manual_seed(static_cast<int64_t>(seed * 7 + t));
  return pattern * (0.5 + at::rand({n}));
}

TEST(OptimLion, MatchesPublishedRuleOnEveryPathAndSize) {
  const double lr = 1e-2;
  for (KernelPath path : paths()) {
    ScopedKernelPath force(path);
    for (int64_t n : kSizes) {
      for (double wd : {0.0, 0.1}) {
        for (double grad_scale : {1.0, 3.0}) {
          SCOPED_TRACE(label(path, n) + " wd=" + std::to_string(wd));
          LionParams lp;
          lp.lr = lr;
          lp.betas = {0.9, 0.99};
          lp.weight_decay = wd;
          const uint64_t seed = 3 + n;
          at::Tensor p = make_params(n, seed);
          at::Tensor rp = p.to(at::kDouble), m = at::zeros_like(rp);
          Lion ours(lp, n, at::kFloat);
          for (int t = 1; t <= kSteps; ++t) {
            const at::Tensor g = lion_grad(n, t, seed);
            StepContext ctx;
            ctx.lr = step_lr(lr, t);
            ctx.step = t;
            ctx.grad_scale = grad_scale;
            ours.step(p, g * grad_scale, ctx);
            // Chen et al. 2023, Algorithm 2 with decoupled weight decay.
            const at::Tensor gd = g.to(at::kDouble);
            const at::Tensor c = 0.9 * m + 0.1 * gd;
            rp = rp - ctx.lr * (at::sign(c) + wd * rp);
            m = 0.99 * m + 0.01 * gd;
          }
          EXPECT_LE(rel_err(p, rp), kTol);
          ASSERT_EQ(ours.state().size(), 1u);
          EXPECT_LE(rel_err(ours.state()[0].second, m), kTol);
        }
      }
    }
  }
}

// ----- Lamb vs DeepSpeed's FusedLamb rule -----------------------------------------------------
struct LambCase {
  bool bias_correction, eps_inside_sqrt;
  double weight_decay, max_grad_norm, grad_scale;
  bool segmented;
};

// fp64 FusedLamb (csrc/lamb/fused_lamb_cuda_kernel.cu) over the given segments (covering all).
void lamb_reference(at::Tensor& p, at::Tensor& m, at::Tensor& v, const at::Tensor& g_in,
                    const LambParams& lp, double lr, int t,
                    const std::vector<std::pair<int64_t, int64_t>>& segs,
                    std::vector<double>* coeffs) {
  const auto [b1, b2] = lp.betas;
  at::Tensor g = g_in;
  if (lp.max_grad_norm > 0) {
    const double clip = (g.norm().item<double>() + 1e-6) / lp.max_grad_norm;
    if (clip > 1) g = g / clip;
  }
  m = b1 * m + (1 - b1) * g;
  v = b2 * v + (1 - b2) * g * g;
  const at::Tensor denom = lp.eps_inside_sqrt ? at::sqrt(v + lp.eps) : at::sqrt(v) + lp.eps;
  const at::Tensor update = m / denom + lp.weight_decay * p;
  const double step_size =
      lp.bias_correction ? lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t)) : lr;
  coeffs->clear();
  for (const auto& [off, len] : segs) {
    const double w = p.narrow(0, off, len).norm().item<double>();
    const double u = update.narrow(0, off, len).norm().item<double>();
    double coeff = 1.0;
    if (w != 0 && u != 0) coeff = std::clamp(w / u, lp.min_coeff, lp.max_coeff);
    coeffs->push_back(coeff);
    p.narrow(0, off, len).sub_(step_size * coeff * update.narrow(0, off, len));
  }
}

TEST(OptimLamb, MatchesFusedLambRuleOnEveryPathAndSize) {
  const std::vector<LambCase> cases = {{true, false, 0.0, 0.0, 1.0, false},
                                       {true, false, 0.01, 0.0, 1.0, true},
                                       {false, true, 0.01, 0.0, 4.0, true},
                                       {true, true, 0.0, 0.5, 2.0, true},
                                       {true, false, 0.1, 1e6, 1.0, false}};
  const double lr = 1e-2;
  for (KernelPath path : paths()) {
    ScopedKernelPath force(path);
    for (int64_t n : kSizes) {
      for (const LambCase& c : cases) {
        SCOPED_TRACE(label(path, n) + " bias_correction=" + std::to_string(c.bias_correction) +
                     " eps_inside_sqrt=" + std::to_string(c.eps_inside_sqrt) +
                     " wd=" + std::to_string(c.weight_decay) + " max_grad_norm=" +
                     std::to_string(c.max_grad_norm) + " segmented=" + std::to_string(c.segmented));
        LambParams lp;
        lp.lr = lr;
        lp.bias_correction = c.bias_correction;
        lp.eps_inside_sqrt = c.eps_inside_sqrt;
        lp.weight_decay = c.weight_decay;
        lp.max_grad_norm = c.max_grad_norm;
        lp.max_coeff = 10.0;
        lp.min_coeff = 0.01;
        // Segments given: [0, n/3) and [n/3 + 1, n) (the element at n/3 is a gap, which
        // becomes its own segment); reference segments cover everything explicitly.
        std::vector<std::pair<int64_t, int64_t>> given, covering;
        if (c.segmented && n >= 3) {
          const int64_t a = n / 3;
          given = {{a + 1, n - a - 1}, {0, a}};  // unsorted on purpose
          covering = {{0, a}, {a, 1}, {a + 1, n - a - 1}};
        } else {
          covering = {{0, n}};
        }
        covering.erase(std::remove_if(covering.begin(), covering.end(),
                                      [](const auto& s) { return s.second == 0; }),
                       covering.end());
        const uint64_t seed = 41 + n;
        at::Tensor p = make_params(n, seed);
        at::Tensor rp = p.to(at::kDouble), m = at::zeros_like(rp), v = at::zeros_like(rp);
        Lamb ours(lp, n, at::kFloat, given);
        std::vector<double> ref_coeffs;
        for (int t = 1; t <= kSteps; ++t) {
          const at::Tensor g = make_grad(n, t, seed);
          StepContext ctx;
          ctx.lr = step_lr(lr, t);
          ctx.step = t;
          ctx.grad_scale = c.grad_scale;
          ours.step(p, g * c.grad_scale, ctx);
          lamb_reference(rp, m, v, g.to(at::kDouble), lp, ctx.lr, t, covering, &ref_coeffs);
        }
        EXPECT_LE(rel_err(p, rp), kTol);
        EXPECT_LE(rel_err(ours.state()[0].second, m), kTol);
        EXPECT_LE(rel_err(ours.state()[1].second, v), kTol);
        ASSERT_EQ(ours.lamb_coeffs().size(), ref_coeffs.size());
        for (size_t s = 0; s < ref_coeffs.size(); ++s)
          EXPECT_NEAR(ours.lamb_coeffs()[s], ref_coeffs[s], 1e-5 * ref_coeffs[s])
              << "segment " << s;
      }
    }
  }
}

TEST(OptimLamb, TrustRatioIsClampedAndOneForZeroNorms) {
  LambParams lp;
  lp.max_coeff = 2.0;
  lp.min_coeff = 0.5;
  // Segment 0: parameters zero (ratio 1). Segment 1: huge parameters (clamped to 2).
  // Segment 2: tiny parameters (clamped to 0.5).
  Lamb lamb(lp, 12, at::kFloat, {{0, 4}, {4, 4}, {8, 4}});
  at::Tensor p = at::cat({at::zeros({4}), at::full({4}, 1e3), at::full({4}, 1e-6)});
  StepContext ctx;
  ctx.lr = 1e-3;
  lamb.step(p, at::ones({12}), ctx);
  ASSERT_EQ(lamb.lamb_coeffs().size(), 3u);
  EXPECT_EQ(lamb.lamb_coeffs()[0], 1.0);
  EXPECT_EQ(lamb.lamb_coeffs()[1], 2.0);
  EXPECT_EQ(lamb.lamb_coeffs()[2], 0.5);
}

// ----- dispatch, threads, factory, errors -----------------------------------------------------
TEST(OptimDispatch, ResultsDoNotDependOnTheThreadCount) {
  const int64_t n = 1000003;
  const int threads = at::get_num_threads();
  for (KernelPath path : paths()) {
    if (path == KernelPath::kTorch) continue;
    ScopedKernelPath force(path);
    at::Tensor results[2];
    for (int k = 0; k < 2; ++k) {
      at::set_num_threads(k == 0 ? 1 : std::max(2, threads));
      AdamParams ap;
      Adam adam(ap, n, at::kFloat);
      results[k] = run_ours(adam, make_params(n, 1), 1e-2, 2.0, 1);
    }
    at::set_num_threads(threads);
    EXPECT_TRUE(at::equal(results[0], results[1])) << to_string(path);
  }
}

TEST(OptimDispatch, EnvironmentSelectsThePathAndRejectsWhatTheCpuLacks) {
  {
    testing::ScopedEnv simd("DSCPP_OPTIM_SIMD", "scalar");
    EXPECT_EQ(active_kernel_path(), KernelPath::kScalar);
    simd.set("torch");
    EXPECT_EQ(active_kernel_path(), KernelPath::kTorch);
    simd.set("auto");
    EXPECT_EQ(active_kernel_path(), best_kernel_path());
    simd.set("avx1024");
    EXPECT_THROW(active_kernel_path(), Error);
    for (KernelPath p : {KernelPath::kAvx2, KernelPath::kAvx512}) {
      simd.set(to_string(p));
      if (cpu_supports(p)) {
        EXPECT_EQ(active_kernel_path(), p);
      } else {
        EXPECT_THROW(active_kernel_path(), Error);
        EXPECT_THROW(ScopedKernelPath{p}, Error);
      }
    }
    {
      ScopedKernelPath force(KernelPath::kScalar);  // an override wins over the environment
      EXPECT_EQ(active_kernel_path(), KernelPath::kScalar);
    }
  }  // DSCPP_OPTIM_SIMD is as it was
  EXPECT_EQ(parse_kernel_path("avx512"), KernelPath::kAvx512);
  EXPECT_FALSE(parse_kernel_path("AVX512").has_value());
}

TEST(OptimFactory, MakesEveryConfiguredTypeAndRejectsNone) {
  OptimizerConfig cfg;
  for (const char* type : {"Adam", "AdamW", "SGD", "Adagrad", "Lamb", "Lion", "Muon"}) {
    cfg.type = type;
    auto opt = make_optimizer(cfg, 10, at::kFloat);
    EXPECT_STREQ(opt->name(), type);
    EXPECT_EQ(opt->numel(), 10);
  }
  cfg.type = "SGD";
  EXPECT_FALSE(make_optimizer(cfg, 3, at::kFloat)->betas().has_value());
  cfg.type = "Adam";
  cfg.adam.betas = {0.8, 0.95};
  EXPECT_EQ(make_optimizer(cfg, 3, at::kFloat)->betas(), std::make_pair(0.8, 0.95));
  cfg.type = "";
  EXPECT_THROW(make_optimizer(cfg, 3, at::kFloat), ConfigError);
  cfg.type = "Adafactor";
  EXPECT_THROW(make_optimizer(cfg, 3, at::kFloat), ConfigError);
}

TEST(OptimErrors, WrongBuffersAreRejectedBeforeAnythingChanges) {
  Adam adam(AdamParams{}, 8, at::kFloat);
  at::Tensor p = at::ones({8});
  StepContext ctx;
  ctx.lr = 1e-3;
  at::Tensor short_p = at::ones({7});
  EXPECT_THROW(adam.step(short_p, at::ones({8}), ctx), Error);
  EXPECT_THROW(adam.step(p, at::ones({9}), ctx), Error);
  at::Tensor strided = at::ones({16}).slice(0, 0, 16, 2);
  EXPECT_THROW(adam.step(strided, at::ones({8}), ctx), Error);
  ctx.step = 0;
  EXPECT_THROW(adam.step(p, at::ones({8}), ctx), Error);
  ctx.step = 1;
  ctx.grad_scale = 0.0;
  EXPECT_THROW(adam.step(p, at::ones({8}), ctx), Error);
  EXPECT_TRUE(at::equal(p, at::ones({8})));
  EXPECT_TRUE(at::equal(adam.state()[0].second, at::zeros({8})));
}

// The engine's flat parameters are leaves that require grad: every path updates them in place
// outside autograd, with the same result as on a plain tensor.
TEST(OptimPaths, LeafParametersThatRequireGradAreUpdatedInPlace) {
  OptimizerConfig cfg;
  for (KernelPath path : paths()) {
    ScopedKernelPath force(path);
    for (const char* type : {"Adam", "SGD", "Adagrad", "Lamb", "Lion"}) {
      cfg.type = type;
      auto a = make_optimizer(cfg, 40, at::kFloat);
      auto b = make_optimizer(cfg, 40, at::kFloat);
      at::Tensor leaf = make_params(40, 9).set_requires_grad(true);
      at::Tensor plain = make_params(40, 9);
      StepContext ctx;
      ctx.lr = 0.01;
      a->step(leaf, make_grad(40, 1, 9), ctx);
      b->step(plain, make_grad(40, 1, 9), ctx);
      EXPECT_TRUE(at::equal(leaf.detach(), plain)) << type << " " << to_string(path);
      EXPECT_FALSE(at::equal(plain, make_params(40, 9))) << type << " " << to_string(path);
    }
  }
}

// Stepping a buffer in pieces (StepContext::offset, as ZeRO's mixed-precision step does) is the
// same update as stepping it whole, on every path; Lamb, whose trust ratios need whole
// parameters, refuses pieces.
TEST(OptimPieces, PiecesGiveTheWholeBufferUpdate) {
  const int64_t n = 1001;
  OptimizerConfig cfg;
  cfg.sgd.momentum = 0.9;
  for (KernelPath path : paths()) {
    ScopedKernelPath force(path);
    for (const char* type : {"Adam", "AdamW", "SGD", "Adagrad", "Lion"}) {
      cfg.type = type;
      auto whole = make_optimizer(cfg, n, at::kFloat);
      auto pieces = make_optimizer(cfg, n, at::kFloat);
      at::Tensor pw = make_params(n, 4), pp = pw.clone();
      for (int t = 1; t <= kSteps; ++t) {
        const at::Tensor g = make_grad(n, t, 4);
        StepContext ctx;
        ctx.lr = step_lr(1e-2, t);
        ctx.step = t;
        whole->step(pw, g, ctx);
        // Piece boundaries on multiples of 16 elements, as the engine's pieces are: the SIMD
        // kernels' scalar tails may round an element differently from their vector bodies.
        const std::vector<int64_t> cuts = {0, 320, 336, 992, n};
        for (size_t k = 0; k + 1 < cuts.size(); ++k) {
          const int64_t off = cuts[k], end = cuts[k + 1];
          at::Tensor p = pp.narrow(0, off, end - off);
          ctx.offset = off;
          pieces->step(p, g.narrow(0, off, end - off), ctx);
        }
      }
      EXPECT_TRUE(at::equal(pp, pw)) << type << " " << to_string(path);
    }
  }
  // A shorter buffer without an offset is a mistake, not a piece.
  cfg.type = "Adam";
  auto adam = make_optimizer(cfg, n, at::kFloat);
  at::Tensor prefix = make_params(n, 4).narrow(0, 0, 10);
  StepContext whole;
  whole.lr = 1e-2;
  EXPECT_THROW(adam->step(prefix, make_grad(n, 1, 4).narrow(0, 0, 10), whole), Error);
  cfg.type = "Lamb";
  auto lamb = make_optimizer(cfg, n, at::kFloat);
  EXPECT_FALSE(lamb->supports_pieces());
  at::Tensor p = make_params(n, 4).narrow(0, 0, 10);
  StepContext ctx;
  ctx.lr = 1e-2;
  ctx.offset = 0;
  EXPECT_THROW(lamb->step(p, make_grad(n, 1, 4).narrow(0, 0, 10), ctx), Error);
}

// sin(i * a + b) for i in [0, n): the inputs of the Muon references below, which DeepSpeed
// 0.19.8's own code produced from the same formula (runtime/zero/muon/original_muon.py, in fp32).
// Computed in fp32 as torch did there: Newton-Schulz magnifies a last-bit difference of the input
// a hundredfold.
at::Tensor sines(int64_t n, double a, double b) {
  return (at::arange(n, at::kFloat) * a + b).sin();
}

void expect_values(const at::Tensor& got, const std::vector<double>& want, double tol,
                   const std::string& what) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size())) << what;
  const at::Tensor ref = at::tensor(want, at::kDouble);
  const double err = (got.reshape({-1}).to(at::kDouble) - ref).abs().max().item<double>();
  EXPECT_LE(err, tol) << what << ": got " << got.reshape({-1});
}

// Newton-Schulz as DeepSpeed runs it (zeropower_via_newtonschulz5 and
// zeropower_via_gram_newtonschulz, times sqrt(rows/cols) for a tall matrix), on a wide, a tall
// and a square matrix.
TEST(OptimMuon, OrthogonalisationIsDeepSpeeds) {
  struct Ref {
    int64_t rows, cols;
    NsMethod method;
    std::vector<double> want;
  };
  const std::vector<Ref> refs = {
      {3,
       5,
       NsMethod::standard,
       {-0.2209482, -0.02372551, 0.1767187, 0.3532451, 0.4819646, 0.7219577, 0.4715077, 0.1572463,
        -0.1782972, -0.4897074, -0.1769678, -0.2361692, -0.2633961, -0.2549731, -0.2120379}},
      {3,
       5,
       NsMethod::gram,
       {-0.2209497, -0.02372667, 0.1767207, 0.3532433, 0.4819703, 0.721957, 0.4715069, 0.1572472,
        -0.1782985, -0.4897045, -0.1769687, -0.2361694, -0.263393, -0.2549752, -0.2120321}},
      {5,
       3,
       NsMethod::standard,
       {-0.2288148, 0.1514255, 0.5111878, 0.3687112, 0.3529704, 0.2894594, 0.5567241, 0.1624685,
        -0.2537593, 0.1263945, -0.2084799, -0.5151355, -0.4443132, -0.3478845, -0.2043568}},
      {5,
       3,
       NsMethod::gram,
       {-0.2288151, 0.1514256, 0.5111877, 0.3687087, 0.3529737, 0.2894576, 0.5567278, 0.1624615,
        -0.2537546, 0.1263937, -0.2084781, -0.5151361, -0.4443078, -0.3478939, -0.2043524}},
      {4,
       4,
       NsMethod::gram,
       {-0.2605672, 0.01926968, 0.2964962, 0.5335851, 0.4894817, 0.3310661, 0.1278617, -0.09267586,
        0.3493263, 0.04077232, -0.2733057, -0.5503962, -0.4261335, -0.3236831, -0.1774049,
        -0.00714469}},
  };
  for (const Ref& r : refs) {
    const at::Tensor m = sines(r.rows * r.cols, 0.37, 0.1).reshape({r.rows, r.cols});
    const std::string what = std::to_string(r.rows) + "x" + std::to_string(r.cols) +
                             (r.method == NsMethod::gram ? " gram" : " standard");
    expect_values(muon_orthogonalize(m, r.method), r.want, 2e-5, what);
    // The scale of the input does not matter (it is normalised first), nor its dtype.
    expect_values(muon_orthogonalize(m.to(at::kDouble) * 1e3, r.method), r.want, 2e-5,
                  what + " scaled");
  }
  EXPECT_THROW(muon_orthogonalize(at::ones({4}), NsMethod::gram), Error);
  EXPECT_EQ(parse_ns_method("standard"), NsMethod::standard);
  EXPECT_THROW(parse_ns_method("Gram"), ConfigError);
}

// Three steps of Muon over [W 5x3, V 2x4, b 5] against DeepSpeed 0.19.8's MuonWithAuxAdam with
// its inline Adam (W and V in a Muon group with lr 0.02, momentum 0.9, weight_decay 0.1, gram; b
// in an Adam group with lr 0.003, betas (0.8, 0.95), eps 1e-10, weight_decay 0.1), the gradient of
// parameter i at step s being sin(k * (0.11 * (s + 1) + 0.07 * i) + 0.3 * s) * (0.5 + s). The
// matrix range stepped whole, in pieces, and with the Adam half's lr given per step.
TEST(OptimMuon, ThreeStepsAreMuonWithAuxAdams) {
  MuonParams mp;
  mp.muon_lr = 0.02;
  mp.adam_lr = 0.003;
  mp.momentum = 0.9;
  mp.weight_decay = 0.1;
  mp.betas = {0.8, 0.95};
  const std::vector<std::pair<int64_t, int64_t>> ranges = {{0, 15}, {15, 8}};
  const std::vector<std::vector<int64_t>> shapes = {{5, 3}, {2, 4}};
  for (bool pieces : {false, true}) {
    Muon muon(mp, 28, at::kFloat, ranges);
    EXPECT_DOUBLE_EQ(muon.lr(), 0.02);
    EXPECT_DOUBLE_EQ(muon.adam_lr(), 0.003);
    EXPECT_FALSE(muon.betas().has_value());
    at::Tensor params = at::cat({sines(15, 0.37, 0.1), sines(8, 0.23, 0.4), sines(5, 0.51, 0.2)});
    for (int s = 0; s < 3; ++s) {
      std::vector<at::Tensor> g;
      for (int i = 0; i < 3; ++i) {
        const int64_t n = i == 0 ? 15 : i == 1 ? 8 : 5;
        g.push_back(sines(n, 0.11 * (s + 1) + 0.07 * i, 0.3 * s) * (0.5 + s));
      }
      // The loss scale divides the gradients out of fold_momentum and the Adam half alike.
      const at::Tensor grads = at::cat(g) * 4.0;
      for (size_t k = 0; k < ranges.size(); ++k) {
        const auto [off, len] = ranges[k];
        const at::Tensor u = muon.fold_momentum(off, grads.narrow(0, off, len), 4.0);
        muon.set_update(off,
                        muon_orthogonalize(u.view({shapes[k][0], shapes[k][1]}), NsMethod::gram));
      }
      StepContext ctx;
      ctx.lr = 0.02;
      ctx.step = s + 1;
      ctx.grad_scale = 4.0;
      if (s == 2) ctx.adam_lr = 0.003;  // what the engine passes; unset: the ratio of the lrs
      if (!pieces) {
        muon.step(params, grads, ctx);
      } else {
        for (auto [lo, hi] : {std::pair<int64_t, int64_t>{0, 7}, {7, 20}, {20, 28}}) {
          at::Tensor p = params.narrow(0, lo, hi - lo);
          ctx.offset = lo;
          muon.step(p, grads.narrow(0, lo, hi - lo), ctx);
        }
      }
    }
    const std::string what = pieces ? "in pieces" : "whole";
    expect_values(params.narrow(0, 0, 15),
                  {0.11524735, 0.45561987, 0.69256735, 0.9255479, 0.98244655, 0.89293504,
                   0.70730513, 0.42009699, 0.072610468, -0.31167042, -0.60843408, -0.84656882,
                   -1.0092601, -0.95935529, -0.83190262},
                  2e-6, "W " + what);
    expect_values(params.narrow(0, 15, 8),
                  {0.40559301, 0.58401382, 0.73234993, 0.84320116, 0.92674893, 0.96947241,
                   0.96160781, 0.90267378},
                  2e-6, "V " + what);
    expect_values(params.narrow(0, 23, 5),
                  {0.19367945, 0.64306062, 0.92990023, 0.97796237, 0.77496529}, 2e-6, "b " + what);
  }
  // A matrix element without an update this step is an error, not a zero update.
  Muon muon(mp, 28, at::kFloat, ranges);
  // The second moment is held for the 5 Adam elements only; a checkpoint reads it as [numel]
  // with zeros on the matrices and writes it back the same way.
  EXPECT_EQ(muon.state_bytes(), (28 + 5) * 4);
  EXPECT_EQ(muon.state().size(), 1u);
  EXPECT_EQ(muon.state_names(), (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  const at::Tensor saved = at::cat({at::zeros({23}), at::arange(1, 6, at::kFloat)});
  muon.load_state_values(1, 20, saved.narrow(0, 20, 8));
  EXPECT_TRUE(at::equal(muon.state_values(1, 0, 28), saved));
  EXPECT_TRUE(at::equal(muon.state_values(1, 22, 3), saved.narrow(0, 22, 3)));
  EXPECT_FALSE(muon.state_values_are_views(1));
  EXPECT_THROW(muon.load_state_values(1, 0, at::ones({4})), Error);  // non-zero on a matrix
  at::Tensor p = at::zeros({28});
  StepContext ctx;
  ctx.lr = 0.02;
  EXPECT_THROW(muon.step(p, at::ones({28}), ctx), Error);
  EXPECT_THROW(muon.fold_momentum(10, at::ones({8}), 1.0), Error);    // across two matrices
  EXPECT_THROW(Muon(mp, 28, at::kFloat, {{0, 15}, {10, 8}}), Error);  // overlapping
}

// bf16.bf16_optimizer_states with Muon: both states held in bf16 (half the bytes), and each step
// is exactly the fp32 step with the states rounded to bf16 after each fold and each step (the
// fold's update uses the momentum before rounding, as the engine's store does for the other
// optimizers' bf16 states).
TEST(OptimMuon, Bf16StatesAreTheFp32StepRoundedOnce) {
  MuonParams mp;
  mp.muon_lr = 0.02;
  mp.adam_lr = 0.003;
  mp.weight_decay = 0.1;
  // Adam elements before, between and after the matrices, the last run longer than the piece
  // the Adam half widens at a time (2^20 elements).
  const int64_t tail = (int64_t{1} << 20) + 3, n = 3 + 15 + 2 + 8 + tail;
  const std::vector<std::pair<int64_t, int64_t>> ranges = {{3, 15}, {20, 8}};
  const std::vector<std::vector<int64_t>> shapes = {{5, 3}, {2, 4}};
  Muon bf16(mp, n, at::kBFloat16, ranges), twin(mp, n, at::kFloat, ranges),
      plain(mp, n, at::kFloat, ranges);  // fp32 states, never rounded
  EXPECT_EQ(bf16.state_bytes(), (n + n - 23) * 2);
  auto round_states = [&](int64_t off, int64_t len) {
    for (size_t i = 0; i < 2; ++i)
      twin.load_state_values(i, off,
                             twin.state_values(i, off, len).to(at::kBFloat16).to(at::kFloat));
  };
  at::Tensor p16 = sines(n, 0.37, 0.1);
  at::Tensor p32 = p16.clone(), pplain = p16.clone();
  for (int s = 0; s < 4; ++s) {
    const at::Tensor grads = sines(n, 0.11 * (s + 1), 0.3 * s) * (0.5 + s);
    for (size_t k = 0; k < ranges.size(); ++k) {
      const auto [off, len] = ranges[k];
      const at::Tensor u16 = bf16.fold_momentum(off, grads.narrow(0, off, len), 2.0);
      const at::Tensor u32 = twin.fold_momentum(off, grads.narrow(0, off, len), 2.0);
      const at::Tensor uplain = plain.fold_momentum(off, grads.narrow(0, off, len), 2.0);
      round_states(off, len);
      EXPECT_TRUE(at::equal(u16, u32)) << "step " << s << " matrix " << k;
      const at::Tensor update =
          muon_orthogonalize(u16.view({shapes[k][0], shapes[k][1]}), NsMethod::gram);
      bf16.set_update(off, update);
      twin.set_update(off, update.clone());
      plain.set_update(
          off, muon_orthogonalize(uplain.view({shapes[k][0], shapes[k][1]}), NsMethod::gram));
    }
    StepContext ctx;
    ctx.lr = 0.02;
    ctx.step = s + 1;
    ctx.grad_scale = 2.0;
    bf16.step(p16, grads, ctx);
    twin.step(p32, grads, ctx);
    plain.step(pplain, grads, ctx);
    round_states(0, n);
    EXPECT_TRUE(at::equal(p16, p32)) << "step " << s;
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_TRUE(at::equal(bf16.state_values(i, 0, n).to(at::kFloat), twin.state_values(i, 0, n)))
          << "state " << i << " step " << s;
    }
  }
  // The rounding is real: fp32 states give other weights.
  EXPECT_FALSE(at::equal(p16, pplain));
  EXPECT_EQ(bf16.state_values(0, 0, n).scalar_type(), at::kBFloat16);
  EXPECT_THROW(Muon(mp, n, at::kHalf, ranges), Error);
}

// The ATen path on CUDA against the fused CPU kernel (skipped without a GPU).
TEST(OptimCuda, TorchPathOnCudaMatchesCpuKernel) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const int64_t n = 100003;
  OptimizerConfig cfg;
  for (const char* type : {"Adam", "SGD", "Adagrad", "Lamb", "Lion"}) {
    cfg.type = type;
    cfg.sgd.momentum = 0.9;
    auto cpu = make_optimizer(cfg, n, at::kFloat);
    auto gpu = make_optimizer(cfg, n, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA));
    at::Tensor pc = make_params(n, 2), pg = pc.to(at::kCUDA);
    for (int t = 1; t <= kSteps; ++t) {
      const at::Tensor g = make_grad(n, t, 2) * 4.0;
      StepContext ctx;
      ctx.lr = step_lr(1e-2, t);
      ctx.step = t;
      ctx.grad_scale = 4.0;
      cpu->step(pc, g, ctx);
      at::Tensor gg = g.to(at::kCUDA);
      gpu->step(pg, gg, ctx);
    }
    EXPECT_LE(rel_err(pg.cpu(), pc), kTol) << type;
  }
}

}  // namespace
}  // namespace dscpp::optim
