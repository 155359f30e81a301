// The one-float-at-a-time member of the kernels' vector interface (see kernels_impl.h): the tail
// of every SIMD kernel and the whole of the scalar table. Include only inside an anonymous
// namespace of a kernels_<isa>.cpp, before kernels_impl.h; it includes nothing itself.

struct Scalar {
  static constexpr int64_t kWidth = 1;
  using T = float;
  struct Acc {
    double s = 0.0;
  };
  static T load(const float* p) { return *p; }
  static void store(float* p, T x) { *p = x; }
  static T set1(float x) { return x; }
  static T add(T a, T b) { return a + b; }
  static T sub(T a, T b) { return a - b; }
  static T mul(T a, T b) { return a * b; }
  static T div(T a, T b) { return a / b; }
  // NOTE [position-independent rounding]: in a file compiled for FMA (the SIMD kernels' tails)
  // these round once, exactly as the vector lanes do, so an element's update does not depend on
  // whether it fell in a vector or in the tail: stepping a buffer whole or in pieces (offload's
  // sub-groups, threads' chunks) gives the same bits. The scalar-only table has no FMA and rounds
  // twice for every element alike.
#if defined(__FMA__) || defined(__AVX512F__)
  static T fmadd(T a, T b, T c) { return __builtin_fmaf(a, b, c); }
  static T fnmadd(T a, T b, T c) { return __builtin_fmaf(-a, b, c); }
#else
  static T fmadd(T a, T b, T c) { return a * b + c; }
  static T fnmadd(T a, T b, T c) { return c - a * b; }
#endif
  static T sqrt(T a) { return __builtin_sqrtf(a); }
  // bf16 <-> fp32 (NOTE [bf16 in the optimizer pass]): widening is exact; narrowing rounds to
  // nearest even, and a NaN becomes the quiet NaN 0x7FC0, as c10::BFloat16 does.
  static T load_bf16(const uint16_t* p) {
    const uint32_t bits = static_cast<uint32_t>(*p) << 16;
    float x;
    __builtin_memcpy(&x, &bits, sizeof x);
    return x;
  }
  static void store_bf16(uint16_t* p, T x) {
    uint32_t bits;
    __builtin_memcpy(&bits, &x, sizeof bits);
    *p = x != x ? uint16_t{0x7FC0}
                : static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
  }
  static T sign(T a) { return a > 0.0f ? 1.0f : (a < 0.0f ? -1.0f : 0.0f); }
  static Acc acc_zero() { return Acc{}; }
  static void acc_sq(Acc& acc, T x) { acc.s += static_cast<double>(x) * static_cast<double>(x); }
  static double acc_sum(const Acc& acc) { return acc.s; }
};
