// The optimizer kernels on 8 floats at a time with AVX2 and FMA. This file alone is compiled
// with -mavx2 -mfma (src/optim/sources.cmake) and includes no header with inline library code,
// so no AVX instruction can leak into code a CPU without AVX2 runs (NOTE [optimizer SIMD
// dispatch] in dispatch.h).
#include <immintrin.h>

#include <cstdint>

#include "optim/kernels.h"

namespace dscpp::optim::kernels {
namespace {
#include "optim/kernels_scalar_ops.h"

struct Vec {
  static constexpr int64_t kWidth = 8;
  using T = __m256;
  struct Acc {
    __m256d lo, hi;  // fp64 sums of lanes 0-3 and 4-7
  };
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, T x) { _mm256_storeu_ps(p, x); }
  static T set1(float x) { return _mm256_set1_ps(x); }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static T sub(T a, T b) { return _mm256_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T div(T a, T b) { return _mm256_div_ps(a, b); }
  static T fmadd(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T fnmadd(T a, T b, T c) { return _mm256_fnmadd_ps(a, b, c); }
  static T sqrt(T a) { return _mm256_sqrt_ps(a); }
  static T load_bf16(const uint16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static void store_bf16(uint16_t* p, T x) {  // Scalar::store_bf16 on 8 lanes
    const __m256i bits = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), nan);
    // 8 x 32 -> 8 x 16: packus works within 128-bit lanes; gather lanes' low halves first.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xD8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
  static T sign(T a) {
    const T zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
    const T pos = _mm256_and_ps(_mm256_cmp_ps(a, zero, _CMP_GT_OQ), one);
    const T neg = _mm256_and_ps(_mm256_cmp_ps(a, zero, _CMP_LT_OQ), one);
    return _mm256_sub_ps(pos, neg);
  }
  static Acc acc_zero() { return Acc{_mm256_setzero_pd(), _mm256_setzero_pd()}; }
  static void acc_sq(Acc& acc, T x) {
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    acc.lo = _mm256_fmadd_pd(lo, lo, acc.lo);
    acc.hi = _mm256_fmadd_pd(hi, hi, acc.hi);
  }
  static double acc_sum(const Acc& acc) {
    const __m256d s = _mm256_add_pd(acc.lo, acc.hi);
    const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
  }
};

#include "optim/kernels_impl.h"
}  // namespace

const Table kAvx2Table = {"avx2", adam, sgd, adagrad, lion, lamb_norms, lamb_apply, sum_sq};

}  // namespace dscpp::optim::kernels
