// Vector argmax for contiguous rows on generic::argmax_blocks: each block is reduced to
// its maximum with plain vmaxps (one op per vector) while a NaN check rides along.
#pragma once
#include <immintrin.h>

namespace mtp::x86 {

// ---- AVX-512: 16 lanes, four independent accumulators per block.
template <DType T>
MTP_TARGET_AVX512 inline __m512 load16(const void* x, int64_t i) {
  if constexpr (T == DType::F32) {
    return _mm512_loadu_ps(static_cast<const float*>(x) + i);
  } else {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(x) + i));
    if constexpr (T == DType::BF16)
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    else
      return _mm512_cvtph_ps(h);
  }
}

template <DType T>
MTP_TARGET_AVX512 inline float block_max_avx512(const void* x, int64_t i, bool* has_nan) {
  __m512 m0 = load16<T>(x, i), m1 = load16<T>(x, i + 16);
  __m512 m2 = load16<T>(x, i + 32), m3 = load16<T>(x, i + 48);
  __mmask16 nan = _mm512_cmp_ps_mask(m0, m0, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(m1, m1, _CMP_UNORD_Q) |
                  _mm512_cmp_ps_mask(m2, m2, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(m3, m3, _CMP_UNORD_Q);
  for (int64_t j = 64; j < generic::kArgmaxBlock; j += 64) {
    __m512 v0 = load16<T>(x, i + j), v1 = load16<T>(x, i + j + 16);
    __m512 v2 = load16<T>(x, i + j + 32), v3 = load16<T>(x, i + j + 48);
    nan |= _mm512_cmp_ps_mask(v0, v0, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(v1, v1, _CMP_UNORD_Q) |
           _mm512_cmp_ps_mask(v2, v2, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(v3, v3, _CMP_UNORD_Q);
    m0 = _mm512_max_ps(m0, v0);
    m1 = _mm512_max_ps(m1, v1);
    m2 = _mm512_max_ps(m2, v2);
    m3 = _mm512_max_ps(m3, v3);
  }
  *has_nan = nan != 0;
  return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
}

template <DType T>
MTP_TARGET_AVX512 inline ArgmaxResult argmax_avx512_typed(const void* x, int64_t begin, int64_t end) {
  return generic::argmax_blocks<T>(x, begin, end, [x](int64_t i, bool* nan) MTP_TARGET_AVX512 {
    return block_max_avx512<T>(x, i, nan);
  });
}

inline ArgmaxResult argmax_avx512(const void* x, DType dt, int64_t begin, int64_t end) {
  return with_dtype(dt, [&](auto t) { return argmax_avx512_typed<decltype(t)::value>(x, begin, end); });
}

// ---- AVX2 (+F16C): 8 lanes, four accumulators per block.
template <DType T>
MTP_TARGET_AVX2 inline __m256 load8(const void* x, int64_t i) {
  if constexpr (T == DType::F32) {
    return _mm256_loadu_ps(static_cast<const float*>(x) + i);
  } else {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(x) + i));
    if constexpr (T == DType::BF16)
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    else
      return _mm256_cvtph_ps(h);
  }
}

MTP_TARGET_AVX2 inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

template <DType T>
MTP_TARGET_AVX2 inline float block_max_avx2(const void* x, int64_t i, bool* has_nan) {
  __m256 m0 = load8<T>(x, i), m1 = load8<T>(x, i + 8);
  __m256 m2 = load8<T>(x, i + 16), m3 = load8<T>(x, i + 24);
  __m256 nan = _mm256_or_ps(_mm256_or_ps(_mm256_cmp_ps(m0, m0, _CMP_UNORD_Q), _mm256_cmp_ps(m1, m1, _CMP_UNORD_Q)),
                            _mm256_or_ps(_mm256_cmp_ps(m2, m2, _CMP_UNORD_Q), _mm256_cmp_ps(m3, m3, _CMP_UNORD_Q)));
  for (int64_t j = 32; j < generic::kArgmaxBlock; j += 32) {
    __m256 v0 = load8<T>(x, i + j), v1 = load8<T>(x, i + j + 8);
    __m256 v2 = load8<T>(x, i + j + 16), v3 = load8<T>(x, i + j + 24);
    nan = _mm256_or_ps(nan, _mm256_or_ps(_mm256_or_ps(_mm256_cmp_ps(v0, v0, _CMP_UNORD_Q), _mm256_cmp_ps(v1, v1, _CMP_UNORD_Q)),
                                         _mm256_or_ps(_mm256_cmp_ps(v2, v2, _CMP_UNORD_Q), _mm256_cmp_ps(v3, v3, _CMP_UNORD_Q))));
    m0 = _mm256_max_ps(m0, v0);
    m1 = _mm256_max_ps(m1, v1);
    m2 = _mm256_max_ps(m2, v2);
    m3 = _mm256_max_ps(m3, v3);
  }
  *has_nan = _mm256_movemask_ps(nan) != 0;
  return hmax8(_mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
}

template <DType T>
MTP_TARGET_AVX2 inline ArgmaxResult argmax_avx2_typed(const void* x, int64_t begin, int64_t end) {
  return generic::argmax_blocks<T>(x, begin, end, [x](int64_t i, bool* nan) MTP_TARGET_AVX2 {
    return block_max_avx2<T>(x, i, nan);
  });
}

inline ArgmaxResult argmax_avx2(const void* x, DType dt, int64_t begin, int64_t end) {
  return with_dtype(dt, [&](auto t) { return argmax_avx2_typed<decltype(t)::value>(x, begin, end); });
}

}  // namespace mtp::x86
