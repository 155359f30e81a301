// The built-in GPT's fused bf16 CPU operations: causal softmax with the scores' scale, layer
// norm and exact GELU, each one pass per direction over bf16 data with fp32 arithmetic, as
// autograd functions.
//
// NOTE [GPT fused kernels]: in a bf16 step of the benchmark GPT the matmuls take half the time;
// libtorch 1.13's CPU kernels for the rest read and write bf16 several times per operation
// (scale, mask and softmax are three passes over the [B, nh, T, T] scores, and again in the
// backward; the layer norm is unvectorized in bf16, and computing it in fp32 costs four casts).
// These kernels (models/kernels/, AVX-512F where the CPU has it) do each in one pass per
// direction, skip the masked half of the scores, and round each result once. They replace
// libtorch's ops only for contiguous bf16 CPU tensors; fp32 and fp16 run libtorch's ops, so
// fp32 stays identical to tests/golden/gpt_reference.py. Their backwards are not themselves
// differentiable: a backward with create_graph through them throws. Measured gains:
// docs/benchmarks.md, "bf16 levers".
//
// DSCPP_GPT_KERNELS chooses: auto (the default: avx512 where the CPU has AVX-512F, else torch),
// avx512, scalar (the fused kernels one float at a time; slower than libtorch's vectorized ops,
// for tests and CPUs without AVX-512 only on request), torch (libtorch's ops). An unknown value
// or one the CPU cannot run is a ConfigError.
#pragma once

#include <ATen/core/Tensor.h>

namespace dscpp::models {

enum class GptKernels { kTorch, kScalar, kAvx512 };

const char* to_string(GptKernels kernels);
// The path DSCPP_GPT_KERNELS chooses (read at each call).
GptKernels active_gpt_kernels();
// Whether an operation on x runs the fused kernels: x is a contiguous bf16 CPU tensor and the
// active path is not torch.
bool use_fused_kernels(const at::Tensor& x);

// softmax(scale * scores + causal mask) over the last dimension of contiguous bf16 scores
// [..., T, T]: row i sees keys 0..i.
at::Tensor fused_causal_softmax(const at::Tensor& scores, double scale);
// Layer norm over the last dimension of x ([..., C] bf16) with weight and bias ([C] bf16).
at::Tensor fused_layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                            double eps);
// Exact (erf) GELU of bf16 x.
at::Tensor fused_gelu(const at::Tensor& x);

// NOTE [GPT attention]: the GPT's causal self-attention runs one of two ways:
// - math: scores = q k^T, the causal softmax of the scaled scores (the fused kernel above in bf16
//   on the CPU, libtorch's ops otherwise), y = att v; [B, nh, T, T] scores are kept for backward;
// - sdpa: at::scaled_dot_product_attention with is_causal (libtorch 2.x: a flash-attention kernel
//   on the CPU and on CUDA, forward and backward in blocks, no [T, T] scores kept).
// DSCPP_GPT_ATTENTION chooses: auto (the default: the faster of the two for the tensors' device
// and dtype, by the side-by-side measurement in docs/benchmarks.md), sdpa or math. The two agree
// to rounding (the Golden tests hold both to PyTorch's twin). Anything else is a ConfigError.
enum class GptAttention { kMath, kSdpa };

const char* to_string(GptAttention attention);
// The attention DSCPP_GPT_ATTENTION chooses for q (read at each call), or for tensors of
// `dtype` on `device`.
GptAttention active_gpt_attention(const at::Tensor& q);
GptAttention active_gpt_attention(c10::DeviceType device, c10::ScalarType dtype);

}  // namespace dscpp::models
