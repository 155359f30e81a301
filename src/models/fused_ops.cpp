// Tensor-level wrappers and autograd functions of the GPT's fused bf16 kernels
// (NOTE [GPT fused kernels] in fused_ops.h).
#include "models/fused_ops.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "dscpp/error.h"
#include "models/kernels/kernels.h"
#include "optim/dispatch.h"

namespace dscpp::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

const kernels::Table& table() {
  switch (active_gpt_kernels()) {
#if defined(DSCPP_GPT_HAVE_X86_KERNELS)
    case GptKernels::kAvx512:
      return kernels::kAvx512Table;
#endif
    default:
      return kernels::kScalarTable;
  }
}

const uint16_t* bits(const at::Tensor& t) {
  return reinterpret_cast<const uint16_t*>(t.data_ptr<at::BFloat16>());
}
uint16_t* mutable_bits(const at::Tensor& t) {
  return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>());
}

// The backwards below are computed by the kernels, outside autograd: a graph built through them
// (backward with create_graph, as for a gradient penalty) would silently miss their terms.
void refuse_double_backward(const char* op) {
  DSCPP_CHECK(!at::GradMode::is_enabled(), Error, "fused GPT kernels: ", op,
              " has no double backward (backward ran with create_graph=true). HINT: run with "
              "DSCPP_GPT_KERNELS=torch, whose ops are twice differentiable");
}

// A gradient as the kernels read it: contiguous bf16.
at::Tensor dense_bf16(const at::Tensor& g) {
  DSCPP_CHECK(g.scalar_type() == at::kBFloat16, Error, "fused GPT kernels: gradient of dtype ",
              g.scalar_type(), " for a bf16 output");
  return g.contiguous();
}

// ----- causal softmax -------------------------------------------------------------------------
struct CausalSoftmax : torch::autograd::Function<CausalSoftmax> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& scores, double scale) {
    RECORD_FUNCTION("dscpp::causal_softmax", std::vector<c10::IValue>());
    const int64_t t = scores.size(-1);
    at::Tensor y = at::empty_like(scores);
    const kernels::SoftmaxArgs args{bits(scores), nullptr, mutable_bits(y), t,
                                    static_cast<float>(scale)};
    const auto fn = table().softmax_forward;
    optim::parallel_items((t > 0 ? scores.numel() / t : 0),
                          [&](int64_t b, int64_t e) { fn(args, b, e); });
    ctx->save_for_backward({y});
    ctx->saved_data["scale"] = scale;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    RECORD_FUNCTION("dscpp::causal_softmax_backward", std::vector<c10::IValue>());
    refuse_double_backward("causal softmax");
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    const at::Tensor y = ctx->get_saved_variables()[0];
    const at::Tensor gy = dense_bf16(grads[0]);
    const int64_t t = y.size(-1);
    at::Tensor gx = at::empty_like(y);
    const kernels::SoftmaxArgs args{bits(y), bits(gy), mutable_bits(gx), t,
                                    static_cast<float>(ctx->saved_data["scale"].toDouble())};
    const auto fn = table().softmax_backward;
    optim::parallel_items((t > 0 ? y.numel() / t : 0),
                          [&](int64_t b, int64_t e) { fn(args, b, e); });
    return {gx, at::Tensor()};
  }
};

// ----- layer norm -----------------------------------------------------------------------------
// The backward's row chunks (their partial sums of the weight and bias gradients): enough to
// keep 32 threads busy.
constexpr int64_t kLayerNormChunks = 32;

struct LayerNorm : torch::autograd::Function<LayerNorm> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, double eps) {
    RECORD_FUNCTION("dscpp::layer_norm", std::vector<c10::IValue>());
    const int64_t c = x.size(-1), rows = (c > 0 ? x.numel() / c : 0);
    at::Tensor y = at::empty_like(x);
    const auto stats_options = x.options().dtype(at::kFloat);
    at::Tensor mean = at::empty({rows}, stats_options), rstd = at::empty({rows}, stats_options);
    kernels::LayerNormArgs args{};
    args.x = bits(x);
    args.w = bits(weight);
    args.b = bits(bias);
    args.y = mutable_bits(y);
    args.mean = mean.data_ptr<float>();
    args.rstd = rstd.data_ptr<float>();
    args.c = c;
    args.eps = static_cast<float>(eps);
    const auto fn = table().layer_norm_forward;
    optim::parallel_items(rows, [&](int64_t b, int64_t e) { fn(args, b, e); });
    ctx->save_for_backward({x, weight, mean, rstd});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    RECORD_FUNCTION("dscpp::layer_norm_backward", std::vector<c10::IValue>());
    refuse_double_backward("layer norm");
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &mean = saved[2], &rstd = saved[3];
    const at::Tensor gy = dense_bf16(grads[0]);
    const int64_t c = x.size(-1), rows = (c > 0 ? x.numel() / c : 0);
    at::Tensor gx = at::empty_like(x);
    // The weight and bias gradients are sums over the rows: each of a fixed number of chunks of
    // rows adds into its own fp32 pair of [C] partials, summed (and rounded to bf16) once at the
    // end. Fixed, not one per thread, so the bits do not depend on the thread count.
    const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(kLayerNormChunks, rows));
    at::Tensor partial = at::zeros({chunks, 2, c}, x.options().dtype(at::kFloat));
    kernels::LayerNormArgs args{};
    args.x = bits(x);
    args.w = bits(weight);
    args.mean = mean.data_ptr<float>();
    args.rstd = rstd.data_ptr<float>();
    args.gy = bits(gy);
    args.gx = mutable_bits(gx);
    args.c = c;
    const auto fn = table().layer_norm_backward;
    float* partials = partial.data_ptr<float>();
    optim::parallel_items(chunks, [&](int64_t first, int64_t last) {
      for (int64_t k = first; k < last; ++k) {
        kernels::LayerNormArgs mine = args;
        mine.gw = partials + k * 2 * c;
        mine.gb = mine.gw + c;
        fn(mine, rows * k / chunks, rows * (k + 1) / chunks);
      }
    });
    // Two separate tensors, not views of one buffer: autograd may keep either as a .grad.
    const auto sum_of = [&](int64_t which) {
      return partial.select(1, which).sum(0).to(weight.scalar_type());
    };
    return {gx, sum_of(0), sum_of(1), at::Tensor()};
  }
};

// ----- GELU -----------------------------------------------------------------------------------
struct Gelu : torch::autograd::Function<Gelu> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    RECORD_FUNCTION("dscpp::gelu", std::vector<c10::IValue>());
    at::Tensor y = at::empty_like(x);
    kernels::GeluArgs args{bits(x), mutable_bits(y), nullptr, nullptr};
    const auto fn = table().gelu_forward;
    optim::parallel_elements(x.numel(), [&](int64_t b, int64_t e) { fn(args, b, e); });
    ctx->save_for_backward({x});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    RECORD_FUNCTION("dscpp::gelu_backward", std::vector<c10::IValue>());
    refuse_double_backward("GELU");
    if (!grads[0].defined()) return {at::Tensor()};
    const at::Tensor x = ctx->get_saved_variables()[0];
    const at::Tensor gy = dense_bf16(grads[0]);
    at::Tensor gx = at::empty_like(x);
    kernels::GeluArgs args{bits(x), nullptr, bits(gy), mutable_bits(gx)};
    const auto fn = table().gelu_backward;
    optim::parallel_elements(x.numel(), [&](int64_t b, int64_t e) { fn(args, b, e); });
    return {gx};
  }
};

bool is_dense_bf16_cpu(const at::Tensor& t) {
  return t.is_cpu() && t.scalar_type() == at::kBFloat16 && t.is_contiguous();
}

}  // namespace

const char* to_string(GptKernels kernels) {
  switch (kernels) {
    case GptKernels::kTorch:
      return "torch";
    case GptKernels::kScalar:
      return "scalar";
    case GptKernels::kAvx512:
      return "avx512";
  }
  return "?";
}

GptKernels active_gpt_kernels() {
  const bool avx512 = optim::cpu_supports(optim::KernelPath::kAvx512);
  const char* env = std::getenv("DSCPP_GPT_KERNELS");
  const std::string_view name = env != nullptr ? env : "";
  if (name.empty() || name == "auto") return avx512 ? GptKernels::kAvx512 : GptKernels::kTorch;
  for (GptKernels k : {GptKernels::kTorch, GptKernels::kScalar, GptKernels::kAvx512}) {
    if (name != to_string(k)) continue;
    DSCPP_CHECK(k != GptKernels::kAvx512 || avx512, ConfigError,
                "DSCPP_GPT_KERNELS=avx512 but this CPU has no AVX-512F. HINT: unset it (auto "
                "uses libtorch's ops here) or choose scalar or torch");
    return k;
  }
  DSCPP_CHECK(false, ConfigError, "DSCPP_GPT_KERNELS='", name,
              "' names no GPT kernel path. HINT: use auto, avx512, scalar or torch");
  return GptKernels::kTorch;
}

const char* to_string(GptAttention attention) {
  return attention == GptAttention::kSdpa ? "sdpa" : "math";
}

GptAttention active_gpt_attention(const at::Tensor& q) {
  // An undefined q (set-up's check of the variable): the sdpa default.
  return q.defined() ? active_gpt_attention(q.device().type(), q.scalar_type())
                     : active_gpt_attention(c10::DeviceType::CPU, at::kFloat);
}

GptAttention active_gpt_attention(c10::DeviceType device, c10::ScalarType dtype) {
  const char* env = std::getenv("DSCPP_GPT_ATTENTION");
  const std::string_view name = env != nullptr ? env : "";
  if (name == "sdpa") return GptAttention::kSdpa;
  if (name == "math") return GptAttention::kMath;
  DSCPP_CHECK(name.empty() || name == "auto", ConfigError, "DSCPP_GPT_ATTENTION='", name,
              "' names no attention path. HINT: use auto, sdpa or math");
  // The measured defaults (NOTE [GPT attention]): on the CPU in bf16 the scores' matmuls and the
  // causal softmax beat libtorch 2.15's flash kernel (0.86x the tokens/s with sdpa on the
  // benchmark GPT, 0.96x on the 150M GPT), in fp32 sdpa wins (1.04x, 1.03x). fp16 and CUDA
  // tensors take sdpa, unmeasured here.
  if (device == c10::DeviceType::CPU && dtype == at::kBFloat16) return GptAttention::kMath;
  return GptAttention::kSdpa;
}

bool use_fused_kernels(const at::Tensor& x) {
  return is_dense_bf16_cpu(x) && active_gpt_kernels() != GptKernels::kTorch;
}

at::Tensor fused_causal_softmax(const at::Tensor& scores, double scale) {
  DSCPP_CHECK(is_dense_bf16_cpu(scores) && scores.dim() >= 2 &&
                  scores.size(-1) == scores.size(-2) && scale > 0.0,
              Error,
              "fused_causal_softmax: needs contiguous bf16 CPU scores [..., T, T] and a "
              "positive scale, got ",
              scores.scalar_type(), " ", scores.sizes(), ", scale ", scale);
  return CausalSoftmax::apply(scores, scale);
}

at::Tensor fused_layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                            double eps) {
  DSCPP_CHECK(is_dense_bf16_cpu(x) && x.dim() >= 1 && is_dense_bf16_cpu(weight) &&
                  is_dense_bf16_cpu(bias) && weight.dim() == 1 && bias.dim() == 1 &&
                  weight.size(0) == x.size(-1) && bias.size(0) == x.size(-1),
              Error,
              "fused_layer_norm: needs contiguous bf16 CPU x [..., C], weight [C] and "
              "bias [C], got ",
              x.sizes(), ", ", weight.sizes(), ", ", bias.sizes());
  return LayerNorm::apply(x, weight, bias, eps);
}

at::Tensor fused_gelu(const at::Tensor& x) {
  DSCPP_CHECK(is_dense_bf16_cpu(x), Error, "fused_gelu: needs a contiguous bf16 CPU tensor, got ",
              x.scalar_type(), " ", x.sizes());
  return Gelu::apply(x);
}

}  // namespace dscpp::models
