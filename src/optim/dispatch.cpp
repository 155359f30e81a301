// Kernel path selection (CPU features, DSCPP_OPTIM_SIMD, test overrides) and the parallel
// loops of the fused optimizers. This file is compiled with OpenMP and without the precompiled
// header (src/optim/sources.cmake): libtorch's at::parallel_for is a header template that runs
// in parallel only where _OPENMP is defined, i.e. in the file that calls it.
#include "optim/dispatch.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "dscpp/error.h"
#include "util/log.h"

namespace dscpp::optim {
namespace {

constexpr int64_t kUnit = 64;      // elements; chunk boundaries are multiples of this
constexpr int64_t kGrain = 32768;  // elements per chunk at least

// -1: no override; else a KernelPath.
std::atomic<int> g_override{-1};

}  // namespace

const char* to_string(KernelPath path) {
  switch (path) {
    case KernelPath::kScalar:
      return "scalar";
    case KernelPath::kAvx2:
      return "avx2";
    case KernelPath::kAvx512:
      return "avx512";
    case KernelPath::kTorch:
      return "torch";
  }
  return "?";
}

std::optional<KernelPath> parse_kernel_path(std::string_view name) {
  for (KernelPath p :
       {KernelPath::kScalar, KernelPath::kAvx2, KernelPath::kAvx512, KernelPath::kTorch}) {
    if (name == to_string(p)) return p;
  }
  return std::nullopt;
}

bool cpu_supports(KernelPath path) {
  switch (path) {
    case KernelPath::kScalar:
    case KernelPath::kTorch:
      return true;
#if defined(DSCPP_OPTIM_HAVE_X86_KERNELS)
    case KernelPath::kAvx2:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case KernelPath::kAvx512:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx512f");
#else
    case KernelPath::kAvx2:
    case KernelPath::kAvx512:
      return false;
#endif
  }
  return false;
}

KernelPath best_kernel_path() {
  static const KernelPath best = [] {
    if (cpu_supports(KernelPath::kAvx512)) return KernelPath::kAvx512;
    if (cpu_supports(KernelPath::kAvx2)) return KernelPath::kAvx2;
    return KernelPath::kScalar;
  }();
  return best;
}

KernelPath active_kernel_path() {
  const int forced = g_override.load(std::memory_order_relaxed);
  if (forced >= 0) return static_cast<KernelPath>(forced);
  const char* env = std::getenv("DSCPP_OPTIM_SIMD");
  if (env == nullptr || *env == '\0' || std::string_view(env) == "auto") return best_kernel_path();
  const std::optional<KernelPath> path = parse_kernel_path(env);
  DSCPP_CHECK(path.has_value(), Error, "DSCPP_OPTIM_SIMD='", env,
              "' names no optimizer kernel path. HINT: use scalar, avx2, avx512, torch or auto");
  DSCPP_CHECK(cpu_supports(*path), Error, "DSCPP_OPTIM_SIMD=", env,
              " but this CPU does not support it (best: ", to_string(best_kernel_path()),
              "). HINT: unset DSCPP_OPTIM_SIMD or choose a narrower path");
  return *path;
}

ScopedKernelPath::ScopedKernelPath(KernelPath path) {
  DSCPP_CHECK(cpu_supports(path), Error, "optimizer kernel path ", to_string(path),
              " is not supported by this CPU. HINT: check cpu_supports() first");
  const int prev = g_override.exchange(static_cast<int>(path));
  if (prev >= 0) previous_ = static_cast<KernelPath>(prev);
}

ScopedKernelPath::~ScopedKernelPath() {
  g_override.store(previous_ ? static_cast<int>(*previous_) : -1);
}

const kernels::Table& kernel_table(KernelPath path) {
  DSCPP_CHECK(path != KernelPath::kTorch, Error, "kernel_table: the torch path has no table");
  DSCPP_CHECK(cpu_supports(path), Error, "optimizer kernel path ", to_string(path),
              " is not supported by this CPU");
  static std::atomic<bool> logged{false};
  if (!logged.exchange(true)) DSCPP_LOG_DEBUG("optimizer kernels: {}", to_string(path));
  switch (path) {
#if defined(DSCPP_OPTIM_HAVE_X86_KERNELS)
    case KernelPath::kAvx512:
      return kernels::kAvx512Table;
    case KernelPath::kAvx2:
      return kernels::kAvx2Table;
#endif
    default:
      return kernels::kScalarTable;
  }
}

void parallel_elements(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int64_t units = (n + kUnit - 1) / kUnit;
  at::parallel_for(0, units, kGrain / kUnit, [&](int64_t begin, int64_t end) {
    fn(begin * kUnit, std::min(end * kUnit, n));
  });
}

void parallel_items(int64_t count, const std::function<void(int64_t, int64_t)>& fn) {
  if (count <= 0) return;
  at::parallel_for(0, count, 1, fn);
}

std::optional<double> sum_squares(const at::Tensor& t) {
  const bool bf16 = t.scalar_type() == at::kBFloat16;
  if (!t.device().is_cpu() || !t.is_contiguous() || !(bf16 || t.scalar_type() == at::kFloat))
    return std::nullopt;
  const KernelPath path = active_kernel_path();
  if (path == KernelPath::kTorch) return std::nullopt;
  kernels::SumSqArgs a;
  if (bf16) {
    a.x16 = reinterpret_cast<const uint16_t*>(t.const_data_ptr());
  } else {
    a.x32 = t.const_data_ptr<float>();
  }
  const kernels::SumSqFn fn = kernel_table(path).sum_sq;
  constexpr int64_t kChunk = kSquaresChunk;
  const int64_t n = t.numel(), chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
  parallel_items(chunks, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c)
      partial[static_cast<size_t>(c)] = fn(a, c * kChunk, std::min(n, (c + 1) * kChunk));
  });
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

double squared_norm(const at::Tensor& t) {
  // On the CPU the kernels read the gradients as they are; a widened fp64 copy of each chunk cost
  // more than the sum (bf16, benchmark GPT: 12 ms of a 260 ms step).
  if (const auto s = sum_squares(t)) return *s;
  at::Tensor total = at::zeros({}, t.options().dtype(at::kDouble));
  for (int64_t i = 0; i < t.numel(); i += kSquaresChunk) {
    at::Tensor c = t.narrow(0, i, std::min(kSquaresChunk, t.numel() - i)).to(at::kDouble);
    total.add_(c.dot(c));
  }
  return total.item<double>();
}

}  // namespace dscpp::optim
