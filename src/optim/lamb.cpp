// Lamb with DeepSpeed's FusedLamb semantics (csrc/lamb/fused_lamb_cuda_kernel.cu): Adam moments
// without bias correction inside the update, update = m/denom + wd*p, a trust ratio
// ||p|| / ||update|| per parameter segment clamped to [min_coeff, max_coeff] (1 when either
// norm is 0), and p <- p - step_size*ratio*update with step_size = lr*sqrt(1-b2^t)/(1-b1^t).
// The fused CPU step is two passes: moments + per-piece norms, then the update. The buffer is
// cut into pieces (each inside one segment, at most kPiece elements) fixed at construction, so
// the norms are summed in the same order whatever the thread count.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>

#include "dscpp/error.h"
#include "dscpp/optim.h"
#include "optim/step_util.h"

namespace dscpp::optim {
namespace {

constexpr int64_t kPiece = 32768;  // elements per work item of the fused passes

// The trust ratio of DeepSpeed's kernel: clamp(||w|| / ||u||) when both norms are non-zero.
double trust_ratio(double w_norm, double u_norm, double min_coeff, double max_coeff) {
  if (w_norm == 0.0 || u_norm == 0.0) return 1.0;
  return std::clamp(w_norm / u_norm, min_coeff, max_coeff);
}

}  // namespace

Lamb::Lamb(const LambParams& params, int64_t numel, at::TensorOptions options,
           std::vector<std::pair<int64_t, int64_t>> segments)
    : Optimizer(numel), params_(params) {
  DSCPP_CHECK(!params.amsgrad, ConfigError,
              "optimizer.params.amsgrad: true is not supported (DeepSpeed's FusedLamb rejects it "
              "too). HINT: remove it");
  DSCPP_CHECK(params.min_coeff <= params.max_coeff, ConfigError, "optimizer.params.min_coeff (",
              params.min_coeff, ") > max_coeff (", params.max_coeff, ")");
  // Sort, check and complete the segments so that they cover [0, numel) exactly.
  std::sort(segments.begin(), segments.end());
  int64_t at = 0;
  for (const auto& [offset, length] : segments) {
    DSCPP_CHECK(offset >= 0 && length >= 0 && offset + length <= numel, Error, "Lamb: segment [",
                offset, ", ", offset + length, ") lies outside the buffer of ", numel, " elements");
    DSCPP_CHECK(offset >= at, Error, "Lamb: segments overlap at element ", offset,
                ". HINT: pass each parameter's [offset, length) in the flat buffer once");
    if (length == 0) continue;
    if (offset > at) segments_.emplace_back(at, offset - at);
    segments_.emplace_back(offset, length);
    at = offset + length;
  }
  if (at < numel) segments_.emplace_back(at, numel - at);
  lamb_coeffs_.assign(segments_.size(), 1.0);
  exp_avg_ = at::zeros({numel}, options);
  exp_avg_sq_ = at::zeros({numel}, options);
}

std::optional<std::pair<double, double>> Lamb::betas() const {
  return std::make_pair(params_.betas[0], params_.betas[1]);
}

std::vector<std::pair<std::string, at::Tensor>> Lamb::state() {
  return {{"exp_avg", exp_avg_}, {"exp_avg_sq", exp_avg_sq_}};
}

void Lamb::step(at::Tensor& params, const at::Tensor& grads, const StepContext& ctx) {
  check_step_args(params, grads, ctx, exp_avg_);
  const auto [beta1, beta2] = detail::step_betas(ctx, params_.betas);
  const double wd = params_.weight_decay, eps = params_.eps;
  double step_size = ctx.lr;
  if (params_.bias_correction) {
    const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(ctx.step));
    const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(ctx.step));
    step_size = ctx.lr * std::sqrt(bc2) / bc1;
  }
  // FusedLamb's max_grad_norm: divide the gradients further by clip = (||g|| + 1e-6) / max
  // when that exceeds 1 (||g|| of the unscaled gradients of this buffer).
  double combined_scale = ctx.grad_scale;
  if (params_.max_grad_norm > 0.0) {
    const double norm = grads.norm(2, at::kDouble).item<double>() / ctx.grad_scale;
    const double clip = (norm + 1e-6) / params_.max_grad_norm;
    if (clip > 1.0) combined_scale = clip * ctx.grad_scale;
  }
  const double eps_in = params_.eps_inside_sqrt ? eps : 0.0;
  const double eps_out = params_.eps_inside_sqrt ? 0.0 : eps;
  const int64_t nseg = static_cast<int64_t>(segments_.size());

  if (const auto path = detail::fused_path(params, grads, {exp_avg_, exp_avg_sq_})) {
    kernels::LambArgs a{};
    a.p = params.data_ptr<float>();
    a.g = grads.data_ptr<float>();
    a.m = exp_avg_.data_ptr<float>();
    a.v = exp_avg_sq_.data_ptr<float>();
    a.beta1 = static_cast<float>(beta1);
    a.one_minus_beta1 = static_cast<float>(1.0 - beta1);
    a.beta2 = static_cast<float>(beta2);
    a.one_minus_beta2 = static_cast<float>(1.0 - beta2);
    a.eps_in = static_cast<float>(eps_in);
    a.eps_out = static_cast<float>(eps_out);
    a.wd = static_cast<float>(wd);
    a.inv_scale = static_cast<float>(1.0 / combined_scale);
    // Work items: (begin, end, segment), each inside one segment.
    struct Piece {
      int64_t begin, end, seg;
    };
    std::vector<Piece> pieces;
    for (int64_t s = 0; s < nseg; ++s) {
      const auto [offset, length] = segments_[s];
      for (int64_t b = offset; b < offset + length; b += kPiece)
        pieces.push_back({b, std::min(b + kPiece, offset + length), s});
    }
    const kernels::Table& table = kernel_table(*path);
    std::vector<kernels::SumSq> sums(pieces.size());
    parallel_items(static_cast<int64_t>(pieces.size()), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) sums[i] = table.lamb_norms(a, pieces[i].begin, pieces[i].end);
    });
    std::vector<double> w2(nseg, 0.0), u2(nseg, 0.0);
    for (size_t i = 0; i < pieces.size(); ++i) {
      w2[pieces[i].seg] += sums[i].w2;
      u2[pieces[i].seg] += sums[i].u2;
    }
    for (int64_t s = 0; s < nseg; ++s) {
      lamb_coeffs_[s] =
          trust_ratio(std::sqrt(w2[s]), std::sqrt(u2[s]), params_.min_coeff, params_.max_coeff);
    }
    parallel_items(static_cast<int64_t>(pieces.size()), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const float step = static_cast<float>(step_size * lamb_coeffs_[pieces[i].seg]);
        table.lamb_apply(a, step, pieces[i].begin, pieces[i].end);
      }
    });
    return;
  }

  // ATen path. The segment norms are gathered into one tensor so the device is not synchronised
  // per segment; lamb_coeffs_ is read back once at the end.
  const c10::AutoGradMode no_grad(false);  // in-place updates of leaf parameters
  const at::Tensor g = detail::unscaled_grads(grads, params, combined_scale);
  exp_avg_.mul_(beta1).add_(g, 1.0 - beta1);
  exp_avg_sq_.mul_(beta2).addcmul_(g, g, 1.0 - beta2);
  at::Tensor update = exp_avg_ / exp_avg_sq_.add(eps_in).sqrt_().add_(eps_out);
  if (wd != 0.0) update.add_(params, wd);
  std::vector<at::Tensor> w_norms, u_norms;
  for (const auto& [offset, length] : segments_) {
    w_norms.push_back(params.narrow(0, offset, length).norm());
    u_norms.push_back(update.narrow(0, offset, length).norm());
  }
  if (nseg == 0) return;
  const at::Tensor w = at::stack(w_norms).to(at::kDouble);
  const at::Tensor u = at::stack(u_norms).to(at::kDouble);
  const at::Tensor coeffs =
      at::where(w.ne(0).logical_and(u.ne(0)), (w / u).clamp(params_.min_coeff, params_.max_coeff),
                at::ones_like(w));
  const at::Tensor steps = (coeffs * -step_size).to(params.scalar_type());
  for (int64_t s = 0; s < nseg; ++s) {
    const auto [offset, length] = segments_[s];
    params.narrow(0, offset, length).addcmul_(update.narrow(0, offset, length), steps[s]);
  }
  const at::Tensor host = coeffs.cpu().contiguous();
  const double* c = host.data_ptr<double>();
  lamb_coeffs_.assign(c, c + nseg);
}

}  // namespace dscpp::optim
