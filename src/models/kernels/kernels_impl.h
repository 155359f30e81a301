// The bodies of the GPT's fused bf16 kernels (kernels.h), written once over a tiny vector
// interface and instantiated by each kernels_<isa>.cpp with its own `struct Vec`. Include this
// header only from those files, INSIDE an anonymous namespace, after scalar_ops.h and Vec: every
// function here then has internal linkage, so the linker can never substitute an AVX-512
// instantiation for a scalar one (NOTE [optimizer SIMD dispatch] in optim/dispatch.h).
//
// Scalar and Vec provide: kWidth (floats per register); type T; load/store (fp32) and
// load_bf16/store_bf16 (unaligned); set1, zero; add, sub, mul, reciprocal (1/a to ~1e-7
// relative); fmadd(a, b, c) = a*b + c;
// fnmadd(a, b, c) = c - a*b; max/min (the second operand when either is NaN); abs; sqrt; round
// (to nearest even); pow2(n) = 2^n for integral n in [-126, 127] and 0 for n = -127;
// select_negative(x, a, b) = x < 0 ? a : b; reduce_add and reduce_max over the lanes.
//
// A loop over a row runs Vec over its largest multiple of kWidth elements and Scalar over the
// rest (each, sum_of, max_of below), so any length works and no load reads past the row.

// Not a pragma-once header on purpose: it is included once per instruction-set file.
// NOLINTBEGIN(build/include_what_you_use)

// f(W{}, j) for j in [begin, end), W = Vec on whole vectors, then Scalar on the tail.
template <class F>
void each(int64_t begin, int64_t end, const F& f) {
  const int64_t split = begin + (end - begin) / Vec::kWidth * Vec::kWidth;
  for (int64_t j = begin; j < split; j += Vec::kWidth) f(Vec{}, j);
  for (int64_t j = split; j < end; ++j) f(Scalar{}, j);
}

// The sum over j in [0, n) of f(W{}, j), accumulated per lane in fp32.
template <class F>
float sum_of(int64_t n, const F& f) {
  const int64_t split = n / Vec::kWidth * Vec::kWidth;
  typename Vec::T acc = Vec::zero();
  for (int64_t j = 0; j < split; j += Vec::kWidth) acc = Vec::add(acc, f(Vec{}, j));
  float s = Vec::reduce_add(acc);
  for (int64_t j = split; j < n; ++j) s += f(Scalar{}, j);
  return s;
}

// The maximum over j in [0, n), n >= 1, of f(W{}, j).
template <class F>
float max_of(int64_t n, const F& f) {
  const int64_t split = n / Vec::kWidth * Vec::kWidth;
  float m = -__builtin_inff();
  if (split > 0) {
    typename Vec::T acc = Vec::set1(-__builtin_inff());
    for (int64_t j = 0; j < split; j += Vec::kWidth) acc = Vec::max(f(Vec{}, j), acc);
    m = Vec::reduce_max(acc);
  }
  for (int64_t j = split; j < n; ++j) m = Scalar::max(f(Scalar{}, j), m);
  return m;
}

// exp(x) in fp32 (Cephes' expf: x = n ln2 + r, |r| <= ln2/2, a degree-6 polynomial in r;
// relative error ~1e-7). x is clamped to [-88, 88]; below about -87.7 (where exp(x) would be
// subnormal) n rounds to -127 and the result is exactly 0, so exp(-inf) = 0. A NaN stays NaN
// (the clamp keeps the second operand of max/min, here x).
template <class W>
typename W::T exp_approx(typename W::T x) {
  using T = typename W::T;
  x = W::min(W::set1(88.0f), W::max(W::set1(-88.0f), x));
  const T n = W::round(W::mul(x, W::set1(1.44269504088896341f)));
  T r = W::fnmadd(n, W::set1(0.693359375f), x);
  r = W::fnmadd(n, W::set1(-2.12194440e-4f), r);
  T p = W::set1(1.9875691500e-4f);
  p = W::fmadd(p, r, W::set1(1.3981999507e-3f));
  p = W::fmadd(p, r, W::set1(8.3334519073e-3f));
  p = W::fmadd(p, r, W::set1(4.1665795894e-2f));
  p = W::fmadd(p, r, W::set1(1.6666665459e-1f));
  p = W::fmadd(p, r, W::set1(5.0000001201e-1f));
  p = W::fmadd(p, W::mul(r, r), W::add(r, W::set1(1.0f)));
  return W::mul(p, W::pow2(n));
}

// ----- causal softmax -------------------------------------------------------------------------
void softmax_forward(const SoftmaxArgs& a, int64_t row_begin, int64_t row_end) {
  const int64_t t = a.t;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const int64_t n = r % t + 1;  // keys 0..i are visible to query i
    const uint16_t* x = a.in + r * t;
    uint16_t* y = a.out + r * t;
    // The scale is positive, so the largest scaled score is the scaled largest score.
    const float m = a.scale * max_of(n, [&](auto w, int64_t j) {
                      using W = decltype(w);
                      return W::load_bf16(x + j);
                    });
    const auto e = [&](auto w, int64_t j) {
      using W = decltype(w);
      return exp_approx<W>(W::fnmadd(W::set1(-a.scale), W::load_bf16(x + j), W::set1(-m)));
    };
    const float inv_sum = 1.0f / sum_of(n, e);
    each(0, n, [&](auto w, int64_t j) {
      using W = decltype(w);
      W::store_bf16(y + j, W::mul(e(w, j), W::set1(inv_sum)));
    });
    each(n, t, [&](auto w, int64_t j) {
      using W = decltype(w);
      W::store_bf16(y + j, W::zero());
    });
  }
}

void softmax_backward(const SoftmaxArgs& a, int64_t row_begin, int64_t row_end) {
  const int64_t t = a.t;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const int64_t n = r % t + 1;
    const uint16_t* y = a.in + r * t;
    const uint16_t* gy = a.gy + r * t;
    uint16_t* gx = a.out + r * t;
    const float dot = sum_of(n, [&](auto w, int64_t j) {
      using W = decltype(w);
      return W::mul(W::load_bf16(gy + j), W::load_bf16(y + j));
    });
    each(0, n, [&](auto w, int64_t j) {
      using W = decltype(w);
      const auto d = W::sub(W::load_bf16(gy + j), W::set1(dot));
      W::store_bf16(gx + j, W::mul(W::mul(W::load_bf16(y + j), d), W::set1(a.scale)));
    });
    each(n, t, [&](auto w, int64_t j) {
      using W = decltype(w);
      W::store_bf16(gx + j, W::zero());
    });
  }
}

// ----- layer norm -----------------------------------------------------------------------------
void layer_norm_forward(const LayerNormArgs& a, int64_t row_begin, int64_t row_end) {
  const int64_t c = a.c;
  const float inv_c = 1.0f / static_cast<float>(c);
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint16_t* x = a.x + r * c;
    uint16_t* y = a.y + r * c;
    const float mean = inv_c * sum_of(c, [&](auto w, int64_t j) {
                         using W = decltype(w);
                         return W::load_bf16(x + j);
                       });
    const float var = inv_c * sum_of(c, [&](auto w, int64_t j) {
                        using W = decltype(w);
                        const auto d = W::sub(W::load_bf16(x + j), W::set1(mean));
                        return W::mul(d, d);
                      });
    const float rstd = 1.0f / Scalar::sqrt(var + a.eps);
    a.mean[r] = mean;
    a.rstd[r] = rstd;
    each(0, c, [&](auto w, int64_t j) {
      using W = decltype(w);
      const auto xhat = W::mul(W::sub(W::load_bf16(x + j), W::set1(mean)), W::set1(rstd));
      W::store_bf16(y + j, W::fmadd(xhat, W::load_bf16(a.w + j), W::load_bf16(a.b + j)));
    });
  }
}

void layer_norm_backward(const LayerNormArgs& a, int64_t row_begin, int64_t row_end) {
  const int64_t c = a.c;
  const float inv_c = 1.0f / static_cast<float>(c);
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint16_t* x = a.x + r * c;
    const uint16_t* gy = a.gy + r * c;
    uint16_t* gx = a.gx + r * c;
    const float mean = a.mean[r], rstd = a.rstd[r];
    const auto xhat = [&](auto w, int64_t j) {
      using W = decltype(w);
      return W::mul(W::sub(W::load_bf16(x + j), W::set1(mean)), W::set1(rstd));
    };
    const auto g = [&](auto w, int64_t j) {
      using W = decltype(w);
      return W::mul(W::load_bf16(gy + j), W::load_bf16(a.w + j));
    };
    const float mean_g = inv_c * sum_of(c, g);
    const float mean_gx = inv_c * sum_of(c, [&](auto w, int64_t j) {
                            using W = decltype(w);
                            return W::mul(g(w, j), xhat(w, j));
                          });
    each(0, c, [&](auto w, int64_t j) {
      using W = decltype(w);
      const auto xh = xhat(w, j);
      const auto gyj = W::load_bf16(gy + j);
      const auto d = W::fnmadd(xh, W::set1(mean_gx), W::sub(g(w, j), W::set1(mean_g)));
      W::store_bf16(gx + j, W::mul(d, W::set1(rstd)));
      W::store(a.gw + j, W::fmadd(gyj, xh, W::load(a.gw + j)));
      W::store(a.gb + j, W::add(gyj, W::load(a.gb + j)));
    });
  }
}

// ----- GELU -----------------------------------------------------------------------------------
// Phi(x) and exp(-x^2/2) for the GELU: erfc(z) ~ poly(t) * exp(-z^2), t = 1 / (1 + p z) for
// z = |x| / sqrt(2) >= 0 (Abramowitz and Stegun 7.1.26); Phi(-|x|) = erfc(z) / 2 directly (no
// 1 - (1 - tail) cancellation), Phi(|x|) = 1 - Phi(-|x|). z is capped at 10, where exp(-z^2)
// is already 0 in fp32: an infinite z would make the vector reciprocal's Newton step inf * 0.
// So gelu(inf) = inf (the limit; libtorch 2.15 returns NaN), and gelu(-inf) and both gradients
// at +-inf are NaN, as in libtorch.
template <class W>
void normal_cdf(typename W::T x, typename W::T& phi, typename W::T& gauss) {
  using T = typename W::T;
  const T z = W::min(W::set1(10.0f), W::mul(W::abs(x), W::set1(0.70710678118654752f)));
  const T t = W::reciprocal(W::fmadd(W::set1(0.3275911f), z, W::set1(1.0f)));
  T poly = W::set1(1.061405429f);
  poly = W::fmadd(poly, t, W::set1(-1.453152027f));
  poly = W::fmadd(poly, t, W::set1(1.421413741f));
  poly = W::fmadd(poly, t, W::set1(-0.284496736f));
  poly = W::fmadd(poly, t, W::set1(0.254829592f));
  poly = W::mul(poly, t);
  gauss = exp_approx<W>(W::mul(W::sub(W::zero(), z), z));
  const T tail = W::mul(W::mul(W::set1(0.5f), poly), gauss);
  phi = W::select_negative(x, tail, W::sub(W::set1(1.0f), tail));
}

void gelu_forward(const GeluArgs& a, int64_t begin, int64_t end) {
  each(begin, end, [&](auto w, int64_t j) {
    using W = decltype(w);
    const auto x = W::load_bf16(a.x + j);
    typename W::T phi, gauss;
    normal_cdf<W>(x, phi, gauss);
    W::store_bf16(a.y + j, W::mul(x, phi));
  });
}

void gelu_backward(const GeluArgs& a, int64_t begin, int64_t end) {
  each(begin, end, [&](auto w, int64_t j) {
    using W = decltype(w);
    const auto x = W::load_bf16(a.x + j);
    typename W::T phi, gauss;
    normal_cdf<W>(x, phi, gauss);
    const auto slope = W::fmadd(W::mul(x, gauss), W::set1(0.39894228040143268f), phi);
    W::store_bf16(a.gx + j, W::mul(W::load_bf16(a.gy + j), slope));
  });
}

// NOLINTEND(build/include_what_you_use)
