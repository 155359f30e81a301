// The built-in GPT's fused bf16 CPU kernels (NOTE [GPT fused kernels] in models/fused_ops.h) as
// plain functions over raw pointers and a range of rows or elements, one table per instruction
// set: kernels_scalar.cpp and kernels_avx512.cpp (compiled with -mavx512f). As for the
// optimizer's kernels (NOTE [optimizer SIMD dispatch] in optim/dispatch.h), this header includes
// no library header, so nothing inline from libtorch or the standard library is compiled with
// the AVX-512 flags. A bf16 value is passed as its 16 raw bits; every kernel computes in fp32
// and rounds each result once, to nearest even, as c10::BFloat16 does.
#pragma once

#include <cstdint>

namespace dscpp::models::kernels {

// Causal softmax over the rows of a contiguous [N, T, T] tensor of attention scores, row r being
// query position i = r % T, with the scores' scale s > 0 folded in:
//   forward:  y[j] = exp(s*x[j] - max_k<=i s*x[k]) / sum_k<=i exp(...)  for j <= i, 0 for j > i
//   backward: gx[j] = s * y[j] * (gy[j] - sum_k<=i gy[k]*y[k])           for j <= i, 0 for j > i
// The forward reads x from `in` and writes y to `out`; the backward reads y from `in` and gy,
// and writes gx to `out`.
struct SoftmaxArgs {
  const uint16_t* in;
  const uint16_t* gy;
  uint16_t* out;
  int64_t t;
  float scale;
};
using SoftmaxFn = void (*)(const SoftmaxArgs&, int64_t row_begin, int64_t row_end);

// Layer norm over rows of c elements with weight w and bias b ([c], bf16):
//   forward:  mean, rstd = 1/sqrt(var + eps) per row (fp32, kept for the backward);
//             y = (x - mean) * rstd * w + b
//   backward: xhat = (x - mean) * rstd, g = gy * w;
//             gx = rstd * (g - mean_j(g) - xhat * mean_j(g * xhat));
//             gw += gy * xhat and gb += gy, summed over the rows into fp32 [c] buffers.
struct LayerNormArgs {
  const uint16_t* x;
  const uint16_t* w;
  const uint16_t* b;
  uint16_t* y;
  float* mean;
  float* rstd;
  const uint16_t* gy;
  uint16_t* gx;
  float* gw;
  float* gb;
  int64_t c;
  float eps;
};
using LayerNormFn = void (*)(const LayerNormArgs&, int64_t row_begin, int64_t row_end);

// Exact (erf) GELU, elementwise over [begin, end):
//   forward:  y = x * Phi(x), Phi(x) = (1 + erf(x / sqrt(2))) / 2
//   backward: gx = gy * (Phi(x) + x * exp(-x^2 / 2) / sqrt(2 pi))
// erf by Abramowitz and Stegun 7.1.26 (absolute error < 1.5e-7, the approximation libtorch's
// vectorized erf uses), with Phi of a negative x computed from the tail directly so that it keeps
// its relative precision.
struct GeluArgs {
  const uint16_t* x;
  uint16_t* y;
  const uint16_t* gy;
  uint16_t* gx;
};
using GeluFn = void (*)(const GeluArgs&, int64_t begin, int64_t end);

struct Table {
  const char* name;
  SoftmaxFn softmax_forward;
  SoftmaxFn softmax_backward;
  LayerNormFn layer_norm_forward;
  LayerNormFn layer_norm_backward;
  GeluFn gelu_forward;
  GeluFn gelu_backward;
};

// Defined in kernels_scalar.cpp and kernels_avx512.cpp. Calling the AVX-512 table on a CPU
// without AVX-512F is undefined (SIGILL): only fused_ops.cpp picks a table, after checking.
extern const Table kScalarTable;
extern const Table kAvx512Table;

}  // namespace dscpp::models::kernels
