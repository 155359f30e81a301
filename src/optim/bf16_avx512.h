// bf16 <-> fp32 on 16 lanes with AVX-512F, for the vector types of the optimizer kernels and the
// GPT's kernels: widening is a shift; narrowing rounds to nearest even and makes a NaN the quiet
// NaN 0x7FC0, as c10::BFloat16 does (the Scalar members in optim/kernels_scalar_ops.h, one lane
// at a time). Include only inside an anonymous namespace of a file compiled with -mavx512f, after
// <immintrin.h> and <cstdint> (NOTE [optimizer SIMD dispatch] in optim/dispatch.h).

// Not a pragma-once header on purpose, like kernels_impl.h.
// NOLINTBEGIN(build/include_what_you_use)

inline __m512 bf16x16_load(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

inline void bf16x16_store(uint16_t* p, __m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}

// NOLINTEND(build/include_what_you_use)
