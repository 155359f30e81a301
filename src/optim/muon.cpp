// Muon with DeepSpeed's semantics (runtime/zero/muon/original_muon.py of DeepSpeed 0.19.8): the
// Newton-Schulz orthogonalisation of a matrix (both of its iterations) and the optimizer that
// applies it to the matrix elements of a flat buffer and Adam to the rest. The orthogonalisation
// of whole matrices across ranks is zero::MuonMatrices' (src/zero/muon_matrices.h).
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>

#include "dscpp/error.h"
#include "dscpp/optim.h"

namespace dscpp::optim {
namespace {

constexpr int kNsSteps = 5;
constexpr double kA = 3.4445, kB = -4.7750, kC = 2.0315;

// The dtype the iteration runs in: DeepSpeed's on CUDA (gram fp16, standard bf16); fp32 on the
// CPU, where DeepSpeed would use fp32 for gram too on a CPU without AVX512-FP16 and the cost of
// bf16 here is precision rather than speed.
at::ScalarType compute_dtype(const at::Tensor& m, NsMethod method) {
  if (!m.is_cuda()) return at::kFloat;
  return method == NsMethod::gram ? at::kHalf : at::kBFloat16;
}

// The standard quintic iteration on X, wide (rows <= cols) and already normalised.
at::Tensor standard_iterations(at::Tensor x) {
  for (int i = 0; i < kNsSteps; ++i) {
    const at::Tensor a = at::matmul(x, x.t());
    const at::Tensor b = a * kB + at::matmul(a, a) * kC;
    x = x * kA + at::matmul(b, x);
  }
  return x;
}

// The Gram form on X (n x m, n < m, normalised): iterates on R = X X^T (n x n) and the
// accumulated left factor Q, restarting from X <- Q X at step 2; returns Q X.
at::Tensor gram_iterations(at::Tensor x) {
  constexpr int kRestart = 2;
  at::Tensor r = at::matmul(x, x.t());
  at::Tensor q;
  for (int i = 0; i < kNsSteps; ++i) {
    if (i == kRestart) {
      x = at::matmul(q, x);
      r = at::matmul(x, x.t());
      q = at::Tensor();
    }
    const at::Tensor z = r * kB + at::matmul(r, r) * kC;
    if (!q.defined()) {
      q = z.clone();
      q.diagonal().add_(kA);
    } else {
      q = q * kA + at::matmul(z, q);
    }
    if (i < kNsSteps - 1 && i + 1 != kRestart) {
      const at::Tensor rz = r * kA + at::matmul(z, r);
      r = rz * kA + at::matmul(z, rz);
    }
  }
  return at::matmul(q, x);
}

}  // namespace

NsMethod parse_ns_method(const std::string& name) {
  if (name == "gram") return NsMethod::gram;
  DSCPP_CHECK(name == "standard", ConfigError, "optimizer.params.ns_method: '", name,
              "' is not a Newton-Schulz method. HINT: use \"gram\" or \"standard\"");
  return NsMethod::standard;
}

at::Tensor muon_orthogonalize(const at::Tensor& m, NsMethod method) {
  DSCPP_CHECK(m.dim() == 2 && m.numel() > 0 && at::isFloatingType(m.scalar_type()), Error,
              "muon_orthogonalize: needs a non-empty floating-point matrix, got ", m.sizes(), " ",
              m.scalar_type());
  const c10::AutoGradMode no_grad(false);
  const int64_t rows = m.size(0), cols = m.size(1);
  const bool tall = rows > cols;
  const at::ScalarType dtype = compute_dtype(m, method);
  at::Tensor x;
  if (method == NsMethod::standard) {
    // DeepSpeed casts first and normalises in the iteration's dtype.
    x = m.to(dtype);
    if (tall) x = x.t();
    x = x / (x.norm() + 1e-7);
    x = standard_iterations(x);
  } else {
    // Normalised before the cast (fp16 would overflow on a large gradient), in fp32 when m is
    // fp16, as DeepSpeed's gram path does.
    x = m.scalar_type() == at::kHalf ? m.to(at::kFloat) : m;
    if (tall) x = x.t();
    x = (x / (x.norm() + 1e-7)).to(dtype);
    x = std::min(rows, cols) == std::max(rows, cols) ? standard_iterations(x) : gram_iterations(x);
  }
  if (tall) x = x.t();
  x = x.to(at::kFloat);
  if (tall) x.mul_(std::sqrt(static_cast<double>(rows) / static_cast<double>(cols)));
  return x.contiguous();
}

namespace {

// bf16 states are widened this many elements at a time for the Adam half's step.
constexpr int64_t kBf16StatePiece = int64_t{1} << 20;

AdamParams adam_half(const MuonParams& p) {
  AdamParams a;
  a.lr = p.adam_lr_or_default();
  a.betas = p.betas;
  a.eps = p.eps;
  a.weight_decay = p.weight_decay;
  a.bias_correction = true;
  a.adam_w_mode = p.adam_w_mode;
  return a;
}

}  // namespace

Muon::Muon(const MuonParams& params, int64_t numel, at::TensorOptions options,
           std::vector<std::pair<int64_t, int64_t>> matrix_ranges)
    : Optimizer(numel),
      params_(params),
      ns_method_(parse_ns_method(params.ns_method)),
      adam_(adam_half(params), 0, options.dtype(at::kFloat)) {
  DSCPP_CHECK(options.dtype() == at::kFloat || options.dtype() == at::kBFloat16, Error,
              "Muon: the state is fp32 or bf16 (bf16.bf16_optimizer_states), not ",
              options.dtype());
  std::sort(matrix_ranges.begin(), matrix_ranges.end());
  int64_t at = 0;
  for (const auto& [offset, length] : matrix_ranges) {
    DSCPP_CHECK(offset >= at && length >= 0 && offset + length <= numel, Error,
                "Muon: matrix range [", offset, ", ", offset + length,
                ") overlaps another or lies outside the buffer of ", numel, " elements");
    if (length == 0) continue;
    compact_.push_back(matrix_numel_);
    ranges_.emplace_back(offset, length);
    matrix_numel_ += length;
    at = offset + length;
  }
  exp_avg_ = at::zeros({numel}, options);
  exp_avg_sq_ = at::zeros({numel - matrix_numel_}, options);
}

int64_t Muon::matrix_before(int64_t pos) const {
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(),
                             std::make_pair(pos, std::numeric_limits<int64_t>::max()));
  if (it == ranges_.begin()) return 0;
  --it;
  const size_t i = static_cast<size_t>(it - ranges_.begin());
  return compact_[i] + std::min(pos - it->first, it->second);
}

void Muon::for_each_run(int64_t begin, int64_t end,
                        const std::function<void(int64_t, int64_t, bool)>& fn) const {
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(),
                             std::make_pair(begin, std::numeric_limits<int64_t>::max()));
  if (it != ranges_.begin() && std::prev(it)->first + std::prev(it)->second > begin) --it;
  int64_t at = begin;
  for (; it != ranges_.end() && it->first < end; ++it) {
    const int64_t lo = std::max(it->first, begin), hi = std::min(it->first + it->second, end);
    if (at < lo) fn(at, lo, false);
    fn(lo, hi, true);
    at = hi;
  }
  if (at < end) fn(at, end, false);
}

at::Tensor Muon::state_values(size_t i, int64_t offset, int64_t n) {
  if (i == 0) return exp_avg_.narrow(0, offset, n);
  DSCPP_CHECK(i == 1, Error, "Muon has 2 states, not ", i + 1);
  at::Tensor out = at::zeros({n}, exp_avg_sq_.options());
  for_each_run(offset, offset + n, [&](int64_t lo, int64_t hi, bool matrix) {
    if (!matrix)
      out.narrow(0, lo - offset, hi - lo)
          .copy_(exp_avg_sq_.narrow(0, lo - matrix_before(lo), hi - lo));
  });
  return out;
}

void Muon::load_state_values(size_t i, int64_t offset, const at::Tensor& values) {
  const int64_t n = values.numel();
  if (i == 0) return exp_avg_.narrow(0, offset, n).copy_(values), void();
  DSCPP_CHECK(i == 1, Error, "Muon has 2 states, not ", i + 1);
  for_each_run(offset, offset + n, [&](int64_t lo, int64_t hi, bool matrix) {
    const at::Tensor v = values.narrow(0, lo - offset, hi - lo);
    if (!matrix) {
      exp_avg_sq_.narrow(0, lo - matrix_before(lo), hi - lo).copy_(v);
    } else {
      DSCPP_CHECK(v.count_nonzero().item<int64_t>() == 0, Error,
                  "Muon: the loaded exp_avg_sq is not zero on matrix elements [", lo, ", ", hi,
                  "), which take Muon's update and have no second moment. HINT: the state was "
                  "saved by another optimizer (or another split of the parameters)");
    }
  });
}

int64_t Muon::state_bytes() {
  return static_cast<int64_t>(exp_avg_.nbytes() + exp_avg_sq_.nbytes());
}

size_t Muon::range_of(int64_t offset, int64_t n, const char* what) const {
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(),
                             std::make_pair(offset, std::numeric_limits<int64_t>::max()));
  DSCPP_CHECK(it != ranges_.begin(), Error, "Muon.", what, ": elements [", offset, ", ", offset + n,
              ") are not in a matrix range");
  --it;
  DSCPP_CHECK(offset + n <= it->first + it->second, Error, "Muon.", what, ": elements [", offset,
              ", ", offset + n, ") are not inside one matrix range");
  return static_cast<size_t>(it - ranges_.begin());
}

at::Tensor Muon::fold_momentum(int64_t offset, const at::Tensor& grads, double grad_scale) {
  const int64_t n = grads.numel();
  range_of(offset, n, "fold_momentum");
  DSCPP_CHECK(std::isfinite(grad_scale) && grad_scale > 0.0, Error,
              "Muon.fold_momentum: grad_scale ", grad_scale, " must be finite and > 0");
  const c10::AutoGradMode no_grad(false);
  const double beta = params_.momentum;
  at::Tensor held = exp_avg_.narrow(0, offset, n);
  // bf16 momentum (bf16.bf16_optimizer_states): widened, folded in fp32 and rounded back once,
  // as the store does with the other optimizers' bf16 states; the update uses the fp32 value.
  at::Tensor m = held.scalar_type() == at::kFloat ? held : held.to(at::kFloat);
  at::Tensor g = grads.reshape({-1}).to(m.options(), /*non_blocking=*/false, /*copy=*/true);
  if (grad_scale != 1.0) g.mul_(1.0 / grad_scale);
  m.lerp_(g, 1.0 - beta);
  if (!m.is_same(held)) held.copy_(m);
  return g.lerp_(m, beta);  // Nesterov: (1-b)*g + b*m
}

void Muon::set_update(int64_t offset, const at::Tensor& update) {
  const int64_t n = update.numel();
  const size_t i = range_of(offset, n, "set_update");
  DSCPP_CHECK(offset == ranges_[i].first && n == ranges_[i].second, Error,
              "Muon.set_update: elements [", offset, ", ", offset + n,
              ") are not a whole matrix range [", ranges_[i].first, ", ",
              ranges_[i].first + ranges_[i].second, ")");
  if (updates_.empty()) {
    updates_.resize(ranges_.size());
    applied_ = 0;
  }
  updates_[i] = update.reshape({-1});
}

void Muon::step(at::Tensor& params, const at::Tensor& grads, const StepContext& ctx) {
  check_step_args(params, grads, ctx, exp_avg_);
  DSCPP_CHECK(ctx.state.empty(), Error,
              "Muon.step: the caller's state (StepContext::state) is not supported: Muon keeps "
              "its momentum itself");
  const int64_t begin = ctx.offset.value_or(0), end = begin + params.numel();
  const double lr = ctx.lr;
  double adam_lr = adam_.lr();
  if (ctx.adam_lr) {
    adam_lr = *ctx.adam_lr;
  } else if (this->lr() > 0) {
    adam_lr = ctx.lr * adam_.lr() / this->lr();
  }
  StepContext adam_ctx = ctx;
  adam_ctx.lr = adam_lr;
  adam_ctx.offset.reset();
  adam_ctx.bf16_params = at::Tensor();
  const c10::AutoGradMode no_grad(false);
  for_each_run(begin, end, [&](int64_t lo, int64_t hi, bool matrix) {
    at::Tensor p = params.narrow(0, lo - begin, hi - lo);
    if (!matrix) {  // the Adam half, on this optimizer's state for [lo, hi)
      const int64_t compact = lo - matrix_before(lo);
      if (exp_avg_.scalar_type() == at::kFloat) {
        adam_ctx.state = {exp_avg_.narrow(0, lo, hi - lo), exp_avg_sq_.narrow(0, compact, hi - lo)};
        adam_.step(p, grads.narrow(0, lo - begin, hi - lo), adam_ctx);
        return;
      }
      // bf16 states: a piece at a time widened, stepped and rounded back once.
      for (int64_t at = lo; at < hi; at += kBf16StatePiece) {
        const int64_t len = std::min(kBf16StatePiece, hi - at);
        at::Tensor m = exp_avg_.narrow(0, at, len),
                   v = exp_avg_sq_.narrow(0, compact + at - lo, len);
        adam_ctx.state = {m.to(at::kFloat), v.to(at::kFloat)};
        at::Tensor piece = params.narrow(0, at - begin, len);
        adam_.step(piece, grads.narrow(0, at - begin, len), adam_ctx);
        m.copy_(adam_ctx.state[0]);
        v.copy_(adam_ctx.state[1]);
      }
      return;
    }
    const size_t i = range_of(lo, hi - lo, "step");
    DSCPP_CHECK(!updates_.empty() && updates_[i].defined(), Error,
                "Muon.step: no update was set for matrix elements [", lo, ", ", hi,
                "). HINT: call fold_momentum and set_update for every matrix piece first "
                "(the engine's zero::MuonMatrices does)");
    const at::Tensor u = updates_[i].narrow(0, lo - ranges_[i].first, hi - lo);
    if (params_.weight_decay != 0.0) p.mul_(1.0 - lr * params_.weight_decay);
    p.add_(u.to(p.scalar_type()), -lr);
    applied_ += hi - lo;
  });
  if (applied_ >= matrix_numel_) updates_.clear();  // every matrix element is stepped
}

}  // namespace dscpp::optim
