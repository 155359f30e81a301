// The one-float-at-a-time member of the GPT kernels' vector interface (see kernels_impl.h): the
// tail of every AVX-512 loop and the whole of the scalar table. It extends the optimizer kernels'
// Scalar (fp32 and bf16 load/store, set1, add, sub, mul, div, fmadd/fnmadd rounded as the
// vector lanes are, sqrt) with what the GPT's kernels need. Include only inside an anonymous
// namespace of a kernels_<isa>.cpp, before kernels_impl.h; it includes nothing else itself.

namespace optim_ops {
#include "optim/kernels_scalar_ops.h"
}  // namespace optim_ops

struct Scalar : optim_ops::Scalar {
  using T = float;
  static T zero() { return 0.0f; }
  static T reciprocal(T a) { return 1.0f / a; }
  // a > b ? a : b and a < b ? a : b: the second operand when either is NaN, as MAXPS/MINPS.
  static T max(T a, T b) { return a > b ? a : b; }
  static T min(T a, T b) { return a < b ? a : b; }
  static T abs(T a) { return __builtin_fabsf(a); }
  static T round(T a) { return __builtin_rintf(a); }  // to nearest even
  // 2^n for an integral n in [-126, 127], 0 for n = -127 (the exponent field's zero); NaN for
  // a NaN n (the cast below would be undefined).
  static T pow2(T n) {
    if (n != n) return n;
    const uint32_t u = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
    float x;
    __builtin_memcpy(&x, &u, sizeof x);
    return x;
  }
  // x < 0 ? if_negative : otherwise
  static T select_negative(T x, T if_negative, T otherwise) {
    return x < 0.0f ? if_negative : otherwise;
  }
  static float reduce_add(T a) { return a; }
  static float reduce_max(T a) { return a; }
};
