// The GPT kernels on 16 floats at a time with AVX-512F. This file alone is compiled with
// -mavx512f (src/models/sources.cmake) and includes no header with inline library code, so no
// AVX-512 instruction can leak into code other CPUs run (NOTE [optimizer SIMD dispatch] in
// optim/dispatch.h). bf16 is widened by a shift and rounded with integer ops, so AVX-512F is
// all it needs, and it rounds as c10::BFloat16 does.
#include <immintrin.h>

#include <cstdint>

#include "models/kernels/kernels.h"

namespace dscpp::models::kernels {
namespace {
#include "models/kernels/scalar_ops.h"
#include "optim/bf16_avx512.h"

struct Vec {
  static constexpr int64_t kWidth = 16;
  using T = __m512;
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, T x) { _mm512_storeu_ps(p, x); }
  static T load_bf16(const uint16_t* p) { return bf16x16_load(p); }
  static void store_bf16(uint16_t* p, T x) { bf16x16_store(p, x); }
  static T set1(float x) { return _mm512_set1_ps(x); }
  static T zero() { return _mm512_setzero_ps(); }
  static T add(T a, T b) { return _mm512_add_ps(a, b); }
  static T sub(T a, T b) { return _mm512_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  // 1/a: the 14-bit estimate and one Newton step (relative error ~1e-7), a third of a division.
  static T reciprocal(T a) {
    const T r = _mm512_rcp14_ps(a);
    return _mm512_mul_ps(r, _mm512_fnmadd_ps(a, r, _mm512_set1_ps(2.0f)));
  }
  static T fmadd(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T fnmadd(T a, T b, T c) { return _mm512_fnmadd_ps(a, b, c); }
  static T max(T a, T b) { return _mm512_max_ps(a, b); }
  static T min(T a, T b) { return _mm512_min_ps(a, b); }
  static T abs(T a) { return _mm512_abs_ps(a); }
  static T sqrt(T a) { return _mm512_sqrt_ps(a); }
  static T round(T a) {
    return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static T pow2(T n) {
    const __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
    return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
  }
  static T select_negative(T x, T if_negative, T otherwise) {
    const __mmask16 neg = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
    return _mm512_mask_blend_ps(neg, otherwise, if_negative);
  }
  static float reduce_add(T a) { return _mm512_reduce_add_ps(a); }
  static float reduce_max(T a) { return _mm512_reduce_max_ps(a); }
};

#include "models/kernels/kernels_impl.h"
}  // namespace

const Table kAvx512Table = {"avx512",           softmax_forward,     softmax_backward,
                            layer_norm_forward, layer_norm_backward, gelu_forward,
                            gelu_backward};

}  // namespace dscpp::models::kernels
