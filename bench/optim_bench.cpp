// optim_bench: the fused Adam(W) step over one flat fp32 buffer against torch::optim::AdamW on
// the same tensors, and a STREAM-style triad (a = b + s*c) measured in the same run, all
// interleaved (fused per path, torch, triad, fused, torch, triad, ...) and reported as median
// time per step. Bandwidth: Adam reads p, g, m, v and writes p, m, v = 28 bytes per parameter;
// the triad moves 24 bytes per element (3 x 4 B; the write-allocate read of `a` is not counted,
// as in STREAM). Targets (issue 3): fused Adam >= 80% of triad bandwidth, >= 4x torch AdamW.
//
//   build/bench/optim_bench --params 100000000 --iters 7 --threads 2
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "dscpp/optim.h"
#include "optim/dispatch.h"

using namespace dscpp;
using Clock = std::chrono::steady_clock;

namespace {

double seconds(const std::function<void()>& fn) {
  const auto t0 = Clock::now();
  fn();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One thread's share of the triad (vectorised by the compiler: -O3, restrict).
__attribute__((noinline)) void triad_range(float* __restrict a, const float* __restrict b,
                                           const float* __restrict c, float s, int64_t begin,
                                           int64_t end) {
  for (int64_t i = begin; i < end; ++i) a[i] = b[i] + s * c[i];
}

// a[i] = b[i] + s*c[i] over the same parallel loop the optimizer kernels use.
void triad(float* a, const float* b, const float* c, float s, int64_t n) {
  optim::parallel_elements(
      n, [=](int64_t begin, int64_t end) { triad_range(a, b, c, s, begin, end); });
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n = 100'000'000;
  int iters = 7;
  int threads = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--params" && i + 1 < argc) {
      n = std::atoll(argv[++i]);
    } else if (a == "--iters" && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else if (a == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else {
      fmt::print(stderr, "usage: optim_bench [--params N] [--iters K] [--threads T]\n");
      return 2;
    }
  }
  if (threads > 0) at::set_num_threads(threads);
  fmt::print("optim_bench: {} fp32 parameters, {} iterations (median), {} threads\n", n, iters,
             at::get_num_threads());

  at::manual_seed(0);
  at::Tensor p = at::empty({n}).uniform_(-1, 1);
  at::Tensor g = at::empty({n}).uniform_(-1e-2, 1e-2);
  at::Tensor ta = at::empty({n}).fill_(0.0f), tb = at::empty({n}).fill_(1.0f),
             tc = at::empty({n}).fill_(2.0f);

  // The fused optimizer, once per SIMD path this CPU has (state allocated and touched here).
  AdamParams ap;
  ap.lr = 1e-4;
  ap.weight_decay = 0.01;
  std::vector<optim::KernelPath> paths;
  for (auto path :
       {optim::KernelPath::kScalar, optim::KernelPath::kAvx2, optim::KernelPath::kAvx512}) {
    if (optim::cpu_supports(path)) paths.push_back(path);
  }
  optim::AdamW fused(ap, n, at::kFloat);

  // torch::optim::AdamW on the same parameter and gradient tensors (its own state, 8 B/param).
  p.mutable_grad() = g;
  torch::optim::AdamW torch_adamw(std::vector<at::Tensor>{p},
                                  torch::optim::AdamWOptions(1e-4).weight_decay(0.01));

  int64_t step = 0;
  auto fused_step = [&](optim::KernelPath path) {
    optim::ScopedKernelPath force(path);
    optim::StepContext ctx;
    ctx.lr = 1e-4;
    ctx.step = ++step;
    fused.step(p, g, ctx);
  };
  // Warm-up: first touch of the torch state, page faults, thread pool.
  for (auto path : paths) fused_step(path);
  torch_adamw.step();
  triad(ta.data_ptr<float>(), tb.data_ptr<float>(), tc.data_ptr<float>(), 3.0f, n);

  std::vector<std::vector<double>> t_fused(paths.size());
  std::vector<double> t_torch, t_triad;
  for (int it = 0; it < iters; ++it) {
    for (size_t k = 0; k < paths.size(); ++k)
      t_fused[k].push_back(seconds([&] { fused_step(paths[k]); }));
    t_torch.push_back(seconds([&] { torch_adamw.step(); }));
    t_triad.push_back(seconds(
        [&] { triad(ta.data_ptr<float>(), tb.data_ptr<float>(), tc.data_ptr<float>(), 3.0f, n); }));
  }

  const double triad_s = median(t_triad), torch_s = median(t_torch);
  const double triad_gbs = 24.0 * n / triad_s / 1e9;
  fmt::print("\n| step | median ms | GB/s | % of triad | vs torch AdamW |\n");
  fmt::print("| --- | ---: | ---: | ---: | ---: |\n");
  fmt::print("| triad a = b + s*c (24 B/elem) | {:.1f} | {:.1f} | 100% | |\n", triad_s * 1e3,
             triad_gbs);
  for (size_t k = 0; k < paths.size(); ++k) {
    const double s = median(t_fused[k]);
    const double gbs = 28.0 * n / s / 1e9;
    fmt::print("| dscpp fused AdamW, {} (28 B/param) | {:.1f} | {:.1f} | {:.0f}% | {:.1f}x |\n",
               optim::to_string(paths[k]), s * 1e3, gbs, 100.0 * gbs / triad_gbs, torch_s / s);
  }
  const double torch_gbs = 28.0 * n / torch_s / 1e9;
  fmt::print("| torch::optim::AdamW (28 B/param nominal) | {:.1f} | {:.1f} | {:.0f}% | 1.0x |\n",
             torch_s * 1e3, torch_gbs, 100.0 * torch_gbs / triad_gbs);
  return 0;
}
