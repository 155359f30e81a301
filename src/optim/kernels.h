// The fused CPU optimizer kernels as plain functions over raw fp32 pointers and an element range
// [begin, end), one table per instruction set (scalar, AVX2+FMA, AVX-512F). The tables are
// defined in kernels_<isa>.cpp, each compiled with its own -m flags; this header includes no
// library headers, so nothing inline from libtorch or the standard library is compiled with
// those flags (NOTE [optimizer SIMD dispatch] in dispatch.h). All scalars are precomputed per
// step by the caller; the kernels do only elementwise work (and Lamb's norms).
#pragma once

#include <cstdint>

namespace dscpp::optim::kernels {

// Adam / AdamW. Per element (g = grad * inv_scale):
//   g += l2 * p;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g;
//   p = p*decay - step_size * m / (sqrt(v)*inv_sqrt_bc2 + eps)
// Under bf16 mixed precision the gradients may be read as bf16 (g_bf16 instead of g), and the
// updated p written also as bf16 (p_bf16), in the same pass (NOTE [bf16 in the optimizer pass]).
struct AdamArgs {
  float* p;                          // [n] parameters, updated
  const float* g;                    // [n] gradients (unused when g_bf16 is set)
  const uint16_t* g_bf16 = nullptr;  // [n] bf16 gradients (bit patterns), or nullptr
  uint16_t* p_bf16 = nullptr;        // [n] receives p rounded to bf16, or nullptr
  float* m;                          // [n] exp_avg, updated
  float* v;                          // [n] exp_avg_sq, updated
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float eps;
  float step_size;     // lr / (1 - beta1^t), or lr without bias correction
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t), or 1
  float l2;            // weight decay added to the gradient (adam_w_mode false), else 0
  float decay;         // 1 - lr*wd (adam_w_mode true), else 1
  float inv_scale;     // 1 / grad_scale
};

// SGD. d = grad*inv_scale + wd*p; with buf: buf = buf_keep*buf + d_keep*d,
// d = nest_d*d + nest_buf*buf; p = p - lr*d.
struct SgdArgs {
  float* p;
  const float* g;
  float* buf;  // [n] momentum buffer, or nullptr for plain SGD
  float lr, wd, inv_scale;
  float buf_keep, d_keep;  // (0, 1) on the first step, else (momentum, 1 - dampening)
  float nest_d, nest_buf;  // (1, momentum) for nesterov, else (0, 1)
};

// Adagrad. d = grad*inv_scale + wd*p; sum += d*d; p = p - clr * d / (sqrt(sum) + eps).
struct AdagradArgs {
  float* p;
  const float* g;
  float* sum;
  float clr, wd, eps, inv_scale;
};

// Lion. g = grad*inv_scale; c = b1*m + (1-b1)*g; p = p*decay - lr*sign(c);
// m = b2*m + (1-b2)*g.
struct LionArgs {
  float* p;
  const float* g;
  float* m;
  float lr, decay, beta1, one_minus_beta1, beta2, one_minus_beta2, inv_scale;
};

// Lamb, pass 1 over [begin, end): moments as Adam (no bias correction), then
// u = m / (sqrt(v + eps_in) + eps_out) + wd*p, returning sum(p^2) and sum(u^2) (fp64).
// Pass 2 recomputes u from the new m, v and p and applies p = p - step*u.
struct LambArgs {
  float* p;
  const float* g;
  float* m;
  float* v;
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float eps_in, eps_out;  // (eps, 0) with eps_inside_sqrt, else (0, eps)
  float wd, inv_scale;
};
struct SumSq {
  double w2 = 0.0;  // sum of p^2
  double u2 = 0.0;  // sum of update^2
};

// The sum of x^2 over [begin, end), accumulated in fp64 lanes: the gradient norm's, read from the
// gradients as they are (fp32 x32, or bf16 bit patterns x16), with no widened copy.
struct SumSqArgs {
  const float* x32 = nullptr;
  const uint16_t* x16 = nullptr;
};

using AdamFn = void (*)(const AdamArgs&, int64_t begin, int64_t end);
using SgdFn = void (*)(const SgdArgs&, int64_t begin, int64_t end);
using AdagradFn = void (*)(const AdagradArgs&, int64_t begin, int64_t end);
using LionFn = void (*)(const LionArgs&, int64_t begin, int64_t end);
using LambNormsFn = SumSq (*)(const LambArgs&, int64_t begin, int64_t end);
using LambApplyFn = void (*)(const LambArgs&, float step, int64_t begin, int64_t end);
using SumSqFn = double (*)(const SumSqArgs&, int64_t begin, int64_t end);

struct Table {
  const char* name;
  AdamFn adam;
  SgdFn sgd;
  AdagradFn adagrad;
  LionFn lion;
  LambNormsFn lamb_norms;
  LambApplyFn lamb_apply;
  SumSqFn sum_sq;
};

// Defined in kernels_scalar.cpp, kernels_avx2.cpp and kernels_avx512.cpp. Calling a function
// of the AVX2 or AVX-512 table on a CPU without that instruction set is undefined (SIGILL):
// only dispatch.cpp picks a table, after checking the CPU.
extern const Table kScalarTable;
extern const Table kAvx2Table;
extern const Table kAvx512Table;

}  // namespace dscpp::optim::kernels
