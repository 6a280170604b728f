// Vector argmax for contiguous rows on generic::argmax_blocks: each block is reduced to
// its maximum with plain vmaxps (one op per vector) while a NaN check rides along.
#pragma once
#include "mtp/x86/vec.h"

namespace mtp::x86 {

// ---- AVX-512: 16 lanes, four independent accumulators per block.
// NaN check for free: fma(v, 0, acc) turns NaN (and +-inf) lanes into a sticky NaN in
// acc; a block that sets it is rescanned exactly (a false alarm from inf only costs time).
template <DType T>
MTP_TARGET_AVX512 inline float block_max_avx512(const void* x, int64_t i, bool* has_nan) {
  const __m512 zero = _mm512_setzero_ps();
  __m512 m[4], z[4];
  for (int u = 0; u < 4; ++u) {
    m[u] = load16<T>(x, i + 16 * u);
    z[u] = _mm512_mul_ps(m[u], zero);
  }
  for (int64_t j = 64; j < generic::kArgmaxBlock; j += 64)
    for (int u = 0; u < 4; ++u) {
      __m512 v = load16<T>(x, i + j + 16 * u);
      m[u] = _mm512_max_ps(m[u], v);
      z[u] = _mm512_fmadd_ps(v, zero, z[u]);
    }
  __m512 zs = _mm512_add_ps(_mm512_add_ps(z[0], z[1]), _mm512_add_ps(z[2], z[3]));
  *has_nan = _mm512_cmp_ps_mask(zs, zs, _CMP_UNORD_Q) != 0;
  return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m[0], m[1]), _mm512_max_ps(m[2], m[3])));
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
MTP_TARGET_AVX2 inline float block_max_avx2(const void* x, int64_t i, bool* has_nan) {
  const __m256 zero = _mm256_setzero_ps();
  __m256 m[4], z[4];
  for (int u = 0; u < 4; ++u) {
    m[u] = load8<T>(x, i + 8 * u);
    z[u] = _mm256_mul_ps(m[u], zero);
  }
  for (int64_t j = 32; j < generic::kArgmaxBlock; j += 32)
    for (int u = 0; u < 4; ++u) {
      __m256 v = load8<T>(x, i + j + 8 * u);
      m[u] = _mm256_max_ps(m[u], v);
      z[u] = _mm256_fmadd_ps(v, zero, z[u]);
    }
  __m256 zs = _mm256_add_ps(_mm256_add_ps(z[0], z[1]), _mm256_add_ps(z[2], z[3]));
  *has_nan = _mm256_movemask_ps(_mm256_cmp_ps(zs, zs, _CMP_UNORD_Q)) != 0;
  return hmax8(_mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3])));
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
