// The optimizer kernels on 16 floats at a time with AVX-512F. This file alone is compiled with
// -mavx512f (src/optim/sources.cmake) and includes no header with inline library code, so no
// AVX-512 instruction can leak into code other CPUs run (NOTE [optimizer SIMD dispatch] in
// dispatch.h).
#include <immintrin.h>

#include <cstdint>

#include "optim/kernels.h"

namespace dscpp::optim::kernels {
namespace {
#include "optim/bf16_avx512.h"
#include "optim/kernels_scalar_ops.h"

struct Vec {
  static constexpr int64_t kWidth = 16;
  using T = __m512;
  struct Acc {
    __m512d lo, hi;  // fp64 sums of lanes 0-7 and 8-15
  };
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, T x) { _mm512_storeu_ps(p, x); }
  static T set1(float x) { return _mm512_set1_ps(x); }
  static T add(T a, T b) { return _mm512_add_ps(a, b); }
  static T sub(T a, T b) { return _mm512_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static T div(T a, T b) { return _mm512_div_ps(a, b); }
  static T fmadd(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T fnmadd(T a, T b, T c) { return _mm512_fnmadd_ps(a, b, c); }
  static T sqrt(T a) { return _mm512_sqrt_ps(a); }
  static T load_bf16(const uint16_t* p) { return bf16x16_load(p); }
  static void store_bf16(uint16_t* p, T x) { bf16x16_store(p, x); }
  static T sign(T a) {
    const T zero = _mm512_setzero_ps();
    const __mmask16 pos = _mm512_cmp_ps_mask(a, zero, _CMP_GT_OQ);
    const __mmask16 neg = _mm512_cmp_ps_mask(a, zero, _CMP_LT_OQ);
    T r = _mm512_mask_mov_ps(zero, pos, _mm512_set1_ps(1.0f));
    return _mm512_mask_mov_ps(r, neg, _mm512_set1_ps(-1.0f));
  }
  static Acc acc_zero() { return Acc{_mm512_setzero_pd(), _mm512_setzero_pd()}; }
  static void acc_sq(Acc& acc, T x) {
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    const __m512d hi =
        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    acc.lo = _mm512_fmadd_pd(lo, lo, acc.lo);
    acc.hi = _mm512_fmadd_pd(hi, hi, acc.hi);
  }
  static double acc_sum(const Acc& acc) {
    return _mm512_reduce_add_pd(_mm512_add_pd(acc.lo, acc.hi));
  }
};

#include "optim/kernels_impl.h"
}  // namespace

const Table kAvx512Table = {"avx512", adam, sgd, adagrad, lion, lamb_norms, lamb_apply, sum_sq};

}  // namespace dscpp::optim::kernels
