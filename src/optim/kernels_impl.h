// The bodies of the fused optimizer kernels, written once over a tiny vector interface and
// instantiated by each kernels_<isa>.cpp with its own vector type. Include this header only from
// those files, INSIDE an anonymous namespace, after defining `struct Vec` (see below): every
// function here then has internal linkage, so the linker can never substitute an AVX-512
// instantiation for a scalar one (NOTE [optimizer SIMD dispatch] in dispatch.h).
//
// Scalar (kernels_scalar_ops.h, included first) and Vec provide: kWidth (floats per register);
// type T; load/store (unaligned); set1; add, sub, mul, div; fmadd(a, b, c) = a*b + c;
// fnmadd(a, b, c) = c - a*b; sqrt; sign (-1, 0, +1); and for Lamb's norms an fp64 accumulator
// Acc with acc_zero(), acc_sq(Acc&, T) (acc += x*x per lane in fp64) and acc_sum(const Acc&).
//
// Each kernel runs Vec over the largest multiple of kWidth elements of [begin, end) and Scalar
// over the remaining tail, so any length works and no load reads past `end`.

// Not a pragma-once header on purpose: it is included once per instruction-set file.
// NOLINTBEGIN(build/include_what_you_use)

// Splits [begin, end) into the vector body and the scalar tail and runs `body<V>` on each.
#define DSCPP_OPTIM_SPLIT(body, args, begin, end)                                   \
  do {                                                                              \
    const int64_t split_ = (begin) + ((end) - (begin)) / Vec::kWidth * Vec::kWidth; \
    body<Vec>(args, begin, split_);                                                 \
    body<Scalar>(args, split_, end);                                                \
  } while (0)

// ----- Adam -----------------------------------------------------------------------------------
// NOTE [bf16 in the optimizer pass]: under bf16 mixed precision the step used to be three passes
// over the part: cast the bf16 gradients into an fp32 scratch, update the fp32 master weights,
// cast them into the bf16 parameters. Reading the bf16 gradients and writing the rounded
// parameters inside the update's own loop (DeepSpeed's CPU Adam does the same for its fp16
// parameters) leaves one pass and the same bits: widening bf16 is exact, and store_bf16 rounds
// as at::Tensor::to does.
template <class V, bool kGradBf16, bool kParamsBf16>
void adam_loop(const AdamArgs& a, int64_t begin, int64_t end) {
  using T = typename V::T;
  const T b1 = V::set1(a.beta1), omb1 = V::set1(a.one_minus_beta1);
  const T b2 = V::set1(a.beta2), omb2 = V::set1(a.one_minus_beta2);
  const T eps = V::set1(a.eps), step_size = V::set1(a.step_size);
  const T inv_sqrt_bc2 = V::set1(a.inv_sqrt_bc2), l2 = V::set1(a.l2);
  const T decay = V::set1(a.decay), inv_scale = V::set1(a.inv_scale);
  for (int64_t i = begin; i < end; i += V::kWidth) {
    T p = V::load(a.p + i);
    T g = V::mul(kGradBf16 ? V::load_bf16(a.g_bf16 + i) : V::load(a.g + i), inv_scale);
    g = V::fmadd(l2, p, g);
    const T m = V::fmadd(b1, V::load(a.m + i), V::mul(omb1, g));
    const T v = V::fmadd(b2, V::load(a.v + i), V::mul(omb2, V::mul(g, g)));
    const T denom = V::fmadd(V::sqrt(v), inv_sqrt_bc2, eps);
    p = V::fnmadd(step_size, V::div(m, denom), V::mul(p, decay));
    V::store(a.m + i, m);
    V::store(a.v + i, v);
    V::store(a.p + i, p);
    if constexpr (kParamsBf16) V::store_bf16(a.p_bf16 + i, p);
  }
}

template <class V>
void adam_range(const AdamArgs& a, int64_t begin, int64_t end) {
  const bool g16 = a.g_bf16 != nullptr, p16 = a.p_bf16 != nullptr;
  if (g16 && p16) return adam_loop<V, true, true>(a, begin, end);
  if (g16) return adam_loop<V, true, false>(a, begin, end);
  if (p16) return adam_loop<V, false, true>(a, begin, end);
  adam_loop<V, false, false>(a, begin, end);
}

void adam(const AdamArgs& a, int64_t begin, int64_t end) {
  DSCPP_OPTIM_SPLIT(adam_range, a, begin, end);
}

// ----- SGD ------------------------------------------------------------------------------------
template <class V>
void sgd_range(const SgdArgs& a, int64_t begin, int64_t end) {
  using T = typename V::T;
  const T lr = V::set1(a.lr), wd = V::set1(a.wd), inv_scale = V::set1(a.inv_scale);
  if (a.buf == nullptr) {
    for (int64_t i = begin; i < end; i += V::kWidth) {
      const T p = V::load(a.p + i);
      const T d = V::fmadd(wd, p, V::mul(V::load(a.g + i), inv_scale));
      V::store(a.p + i, V::fnmadd(lr, d, p));
    }
    return;
  }
  const T buf_keep = V::set1(a.buf_keep), d_keep = V::set1(a.d_keep);
  const T nest_d = V::set1(a.nest_d), nest_buf = V::set1(a.nest_buf);
  for (int64_t i = begin; i < end; i += V::kWidth) {
    const T p = V::load(a.p + i);
    T d = V::fmadd(wd, p, V::mul(V::load(a.g + i), inv_scale));
    const T buf = V::fmadd(buf_keep, V::load(a.buf + i), V::mul(d_keep, d));
    d = V::fmadd(nest_buf, buf, V::mul(nest_d, d));
    V::store(a.buf + i, buf);
    V::store(a.p + i, V::fnmadd(lr, d, p));
  }
}

void sgd(const SgdArgs& a, int64_t begin, int64_t end) {
  DSCPP_OPTIM_SPLIT(sgd_range, a, begin, end);
}

// ----- Adagrad --------------------------------------------------------------------------------
template <class V>
void adagrad_range(const AdagradArgs& a, int64_t begin, int64_t end) {
  using T = typename V::T;
  const T clr = V::set1(a.clr), wd = V::set1(a.wd), eps = V::set1(a.eps);
  const T inv_scale = V::set1(a.inv_scale);
  for (int64_t i = begin; i < end; i += V::kWidth) {
    const T p = V::load(a.p + i);
    const T d = V::fmadd(wd, p, V::mul(V::load(a.g + i), inv_scale));
    const T sum = V::fmadd(d, d, V::load(a.sum + i));
    const T denom = V::add(V::sqrt(sum), eps);
    V::store(a.sum + i, sum);
    V::store(a.p + i, V::fnmadd(clr, V::div(d, denom), p));
  }
}

void adagrad(const AdagradArgs& a, int64_t begin, int64_t end) {
  DSCPP_OPTIM_SPLIT(adagrad_range, a, begin, end);
}

// ----- Lion -----------------------------------------------------------------------------------
template <class V>
void lion_range(const LionArgs& a, int64_t begin, int64_t end) {
  using T = typename V::T;
  const T lr = V::set1(a.lr), decay = V::set1(a.decay), inv_scale = V::set1(a.inv_scale);
  const T b1 = V::set1(a.beta1), omb1 = V::set1(a.one_minus_beta1);
  const T b2 = V::set1(a.beta2), omb2 = V::set1(a.one_minus_beta2);
  for (int64_t i = begin; i < end; i += V::kWidth) {
    const T g = V::mul(V::load(a.g + i), inv_scale);
    const T m = V::load(a.m + i);
    const T c = V::fmadd(b1, m, V::mul(omb1, g));
    const T p = V::fnmadd(lr, V::sign(c), V::mul(V::load(a.p + i), decay));
    V::store(a.p + i, p);
    V::store(a.m + i, V::fmadd(b2, m, V::mul(omb2, g)));
  }
}

void lion(const LionArgs& a, int64_t begin, int64_t end) {
  DSCPP_OPTIM_SPLIT(lion_range, a, begin, end);
}

// ----- Lamb -----------------------------------------------------------------------------------
template <class V>
void lamb_norms_range(const LambArgs& a, int64_t begin, int64_t end, typename V::Acc& w2,
                      typename V::Acc& u2) {
  using T = typename V::T;
  const T b1 = V::set1(a.beta1), omb1 = V::set1(a.one_minus_beta1);
  const T b2 = V::set1(a.beta2), omb2 = V::set1(a.one_minus_beta2);
  const T eps_in = V::set1(a.eps_in), eps_out = V::set1(a.eps_out);
  const T wd = V::set1(a.wd), inv_scale = V::set1(a.inv_scale);
  for (int64_t i = begin; i < end; i += V::kWidth) {
    const T p = V::load(a.p + i);
    const T g = V::mul(V::load(a.g + i), inv_scale);
    const T m = V::fmadd(b1, V::load(a.m + i), V::mul(omb1, g));
    const T v = V::fmadd(b2, V::load(a.v + i), V::mul(omb2, V::mul(g, g)));
    const T u = V::fmadd(wd, p, V::div(m, V::add(V::sqrt(V::add(v, eps_in)), eps_out)));
    V::store(a.m + i, m);
    V::store(a.v + i, v);
    V::acc_sq(w2, p);
    V::acc_sq(u2, u);
  }
}

SumSq lamb_norms(const LambArgs& a, int64_t begin, int64_t end) {
  const int64_t split = begin + (end - begin) / Vec::kWidth * Vec::kWidth;
  typename Vec::Acc w2 = Vec::acc_zero(), u2 = Vec::acc_zero();
  lamb_norms_range<Vec>(a, begin, split, w2, u2);
  Scalar::Acc tw2, tu2;
  lamb_norms_range<Scalar>(a, split, end, tw2, tu2);
  SumSq out;
  out.w2 = Vec::acc_sum(w2) + tw2.s;
  out.u2 = Vec::acc_sum(u2) + tu2.s;
  return out;
}

template <class V>
void lamb_apply_range(const LambArgs& a, float step_f, int64_t begin, int64_t end) {
  using T = typename V::T;
  const T eps_in = V::set1(a.eps_in), eps_out = V::set1(a.eps_out);
  const T wd = V::set1(a.wd), step = V::set1(step_f);
  for (int64_t i = begin; i < end; i += V::kWidth) {
    const T p = V::load(a.p + i);
    const T m = V::load(a.m + i);
    const T v = V::load(a.v + i);
    const T u = V::fmadd(wd, p, V::div(m, V::add(V::sqrt(V::add(v, eps_in)), eps_out)));
    V::store(a.p + i, V::fnmadd(step, u, p));
  }
}

void lamb_apply(const LambArgs& a, float step, int64_t begin, int64_t end) {
  const int64_t split = begin + (end - begin) / Vec::kWidth * Vec::kWidth;
  lamb_apply_range<Vec>(a, step, begin, split);
  lamb_apply_range<Scalar>(a, step, split, end);
}

#undef DSCPP_OPTIM_SPLIT
// ----- the gradient norm's sum of squares -----------------------------------------------------
template <class V, bool kBf16>
double sum_sq_loop(const SumSqArgs& a, int64_t begin, int64_t end) {
  typename V::Acc acc = V::acc_zero();
  for (int64_t i = begin; i < end; i += V::kWidth) {
    V::acc_sq(acc, kBf16 ? V::load_bf16(a.x16 + i) : V::load(a.x32 + i));
  }
  return V::acc_sum(acc);
}

double sum_sq(const SumSqArgs& a, int64_t begin, int64_t end) {
  const int64_t split = begin + (end - begin) / Vec::kWidth * Vec::kWidth;
  if (a.x16 != nullptr) {
    return sum_sq_loop<Vec, true>(a, begin, split) + sum_sq_loop<Scalar, true>(a, split, end);
  }
  return sum_sq_loop<Vec, false>(a, begin, split) + sum_sq_loop<Scalar, false>(a, split, end);
}

// NOLINTEND(build/include_what_you_use)
