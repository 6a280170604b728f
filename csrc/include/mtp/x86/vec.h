// Shared x86 vector helpers: fp32/bf16/fp16 loads widened to fp32 lanes, horizontal ops,
// and the vector traits (V512, V256) the simd/ kernels are written over.
#pragma once
#include <immintrin.h>

#include <algorithm>

#include "mtp/common.h"
#include "mtp/isa.h"

namespace mtp::x86 {

template <DType T>
MTP_TARGET(Avx512) inline __m512 load16(const void* x, int64_t i) {
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
MTP_TARGET(Avx2) inline __m256 load8(const void* x, int64_t i) {
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

MTP_TARGET(Avx2) inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

MTP_TARGET(Avx2) inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// ---- AVX-512: 16 lanes; acc tiles of 4 rows x 64 columns; linear tiles of up to 8 rows x
// linear_cols(rows) columns (8 to 20 accumulators; 5 rows take 4 columns only with wide
// tiles: x read from memory and at most two vectors per weight chunk, see simd/linear.h).
struct V512 {
  using F = __m512;
  using Mask = __mmask16;
  static constexpr int W = 16, kAccRows = 4, kLinearRows = 8;
  static constexpr int linear_cols(int rows, bool wide) { return rows <= 2 ? 8 : rows <= (wide ? 5 : 4) ? 4 : 2; }
  static void prefetch(const char* p) { _mm_prefetch(p, _MM_HINT_T0); }
  static void prefetch_l2(const char* p) { _mm_prefetch(p, _MM_HINT_T1); }
  MTP_TARGET(Avx512) static F zero() { return _mm512_setzero_ps(); }
  MTP_TARGET(Avx512) static F set1(float x) { return _mm512_set1_ps(x); }
  MTP_TARGET(Avx512) static F loadu(const float* p) { return _mm512_loadu_ps(p); }
  template <DType T>
  MTP_TARGET(Avx512) static F load(const void* p, int64_t i) {
    return load16<T>(p, i);
  }
  MTP_TARGET(Avx512) static void storeu(float* p, F v) { _mm512_storeu_ps(p, v); }
  MTP_TARGET(Avx512) static F add(F a, F b) { return _mm512_add_ps(a, b); }
  MTP_TARGET(Avx512) static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  MTP_TARGET(Avx512) static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  MTP_TARGET(Avx512) static F max(F a, F b) { return _mm512_max_ps(a, b); }
  MTP_TARGET(Avx512) static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  MTP_TARGET(Avx512) static F fnmadd(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
  MTP_TARGET(Avx512) static F round(F x) {
    return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  MTP_TARGET(Avx512) static F pow2i(F n) {  // 2^n for integral n in [-126, 127]
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  MTP_TARGET(Avx512) static F where_ge(F x, F lo, F v) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ), v);
  }
  MTP_TARGET(Avx512) static Mask tail(int64_t left) { return left >= 16 ? Mask(0xffff) : Mask((1u << left) - 1); }
  MTP_TARGET(Avx512) static F load_tail(const float* p, Mask m, F fill) {
    return _mm512_mask_loadu_ps(fill, m, p);
  }
  MTP_TARGET(Avx512) static void store_tail(float* p, Mask m, F v) { _mm512_mask_storeu_ps(p, m, v); }
  MTP_TARGET(Avx512) static float hsum(F v) { return _mm512_reduce_add_ps(v); }
  MTP_TARGET(Avx512) static float hmax(F v) { return _mm512_reduce_max_ps(v); }
  MTP_TARGET(Avx512) static bool any_nan(F v) { return _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) != 0; }
  // Lane i = the sum of a[i]'s 16 lanes by the tree (l, l+8), (l, l+4), (l, l+2), (l, l+1):
  // the same for every i, whatever the other vectors hold.
  MTP_TARGET(Avx512) static F sum_each(const F* a) {
    F s[8], u[4], x[2];
    for (int i = 0; i < 8; ++i)  // blocks 0,1 of a[2i] + blocks 2,3; likewise a[2i+1]
      s[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                           _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xee));
    for (int i = 0; i < 4; ++i)  // block b of u[i] holds vector 4i + b
      u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(s[2 * i], s[2 * i + 1], 0x88),
                           _mm512_shuffle_f32x4(s[2 * i], s[2 * i + 1], 0xdd));
    for (int i = 0; i < 2; ++i)  // block b: lanes 0,1 vector 8i + b; lanes 2,3 vector 8i + 4 + b
      x[i] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * i], u[2 * i + 1], 0x44),
                           _mm512_shuffle_ps(u[2 * i], u[2 * i + 1], 0xee));
    const F z = _mm512_add_ps(_mm512_shuffle_ps(x[0], x[1], 0x88), _mm512_shuffle_ps(x[0], x[1], 0xdd));
    // z[4b + l] = vector 4l + b
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), z);
  }
  // 16 int8 at p widened to fp32 lanes (exact).
  MTP_TARGET(Avx512) static F load_i8(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
};

// ---- AVX2 + FMA + F16C: 8 lanes; acc tiles of 2 rows x 32 columns (16 registers); linear
// tiles of up to 4 rows x linear_cols(rows) columns (8 accumulators).
struct V256 {
  using F = __m256;
  using Mask = __m256i;
  static constexpr int W = 8, kAccRows = 2, kLinearRows = 4;
  static constexpr int linear_cols(int rows, bool) { return rows <= 1 ? 8 : rows <= 2 ? 4 : 2; }
  static void prefetch(const char* p) { _mm_prefetch(p, _MM_HINT_T0); }
  static void prefetch_l2(const char* p) { _mm_prefetch(p, _MM_HINT_T1); }
  MTP_TARGET(Avx2) static F zero() { return _mm256_setzero_ps(); }
  MTP_TARGET(Avx2) static F set1(float x) { return _mm256_set1_ps(x); }
  MTP_TARGET(Avx2) static F loadu(const float* p) { return _mm256_loadu_ps(p); }
  template <DType T>
  MTP_TARGET(Avx2) static F load(const void* p, int64_t i) {
    return load8<T>(p, i);
  }
  MTP_TARGET(Avx2) static void storeu(float* p, F v) { _mm256_storeu_ps(p, v); }
  MTP_TARGET(Avx2) static F add(F a, F b) { return _mm256_add_ps(a, b); }
  MTP_TARGET(Avx2) static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  MTP_TARGET(Avx2) static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  MTP_TARGET(Avx2) static F max(F a, F b) { return _mm256_max_ps(a, b); }
  MTP_TARGET(Avx2) static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  MTP_TARGET(Avx2) static F fnmadd(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  MTP_TARGET(Avx2) static F round(F x) {
    return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  MTP_TARGET(Avx2) static F pow2i(F n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  MTP_TARGET(Avx2) static F where_ge(F x, F lo, F v) { return _mm256_and_ps(_mm256_cmp_ps(x, lo, _CMP_GE_OQ), v); }
  MTP_TARGET(Avx2) static Mask tail(int64_t left) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(std::min<int64_t>(left, 8))),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  MTP_TARGET(Avx2) static F load_tail(const float* p, Mask m, F fill) {
    return _mm256_blendv_ps(fill, _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
  }
  MTP_TARGET(Avx2) static void store_tail(float* p, Mask m, F v) { _mm256_maskstore_ps(p, m, v); }
  MTP_TARGET(Avx2) static float hsum(F v) { return hsum8(v); }
  MTP_TARGET(Avx2) static float hmax(F v) { return hmax8(v); }
  MTP_TARGET(Avx2) static bool any_nan(F v) { return _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0; }
  // Lane i = the sum of a[i]'s 8 lanes by the tree (l, l+4), (l, l+2), (l, l+1).
  MTP_TARGET(Avx2) static F sum_each(const F* a) {
    F s[4], u[2];
    for (int i = 0; i < 4; ++i)  // half 0: vector 2i, half 1: vector 2i+1
      s[i] = _mm256_add_ps(_mm256_permute2f128_ps(a[2 * i], a[2 * i + 1], 0x20),
                           _mm256_permute2f128_ps(a[2 * i], a[2 * i + 1], 0x31));
    for (int i = 0; i < 2; ++i)  // half h: lanes 0,1 vector 4i + h, lanes 2,3 vector 4i + 2 + h
      u[i] = _mm256_add_ps(_mm256_shuffle_ps(s[2 * i], s[2 * i + 1], 0x44),
                           _mm256_shuffle_ps(s[2 * i], s[2 * i + 1], 0xee));
    const F z = _mm256_add_ps(_mm256_shuffle_ps(u[0], u[1], 0x88), _mm256_shuffle_ps(u[0], u[1], 0xdd));
    // z = vectors 0, 2, 4, 6, 1, 3, 5, 7
    return _mm256_permutevar8x32_ps(z, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  }
  // 8 int8 at p widened to fp32 lanes (exact).
  MTP_TARGET(Avx2) static F load_i8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
};

}  // namespace mtp::x86
