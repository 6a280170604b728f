// Vector attention chunk kernels (AVX-512, AVX2+FMA+F16C) for head dims 64 and 128.
// Written once (VecAttention, over a vector-traits class V512 / V256) and compiled per
// instruction set: each entry point is a target-attributed `flatten` wrapper that inlines
// the whole kernel, so the traits' intrinsics land in a function of the right target.
// Sharing without changing any row's bits: each key (value) row is loaded once and used by
// every row that sees it; a row's own operation sequence is fixed (scores: lane-wise fma
// over D per key, then a transposing reduction with a fixed tree per key; softmax: lane
// j % W of chunk-aligned vectors; acc: one fma per key in key order), whatever rows come.
#pragma once
#include <immintrin.h>

#include <type_traits>

#include "mtp/x86/vec.h"  // load16 / load8 (widening loads of fp32/bf16/fp16), hmax8

namespace mtp::x86 {

template <DType T>
using Elem = std::conditional_t<T == DType::F32, float, uint16_t>;

// Software prefetch of row j of kv (when it exists): the hardware prefetchers stop at 4 KiB
// pages, a handful of keys each, and strided (permuted) caches defeat them more.
template <int D, DType T>
inline void prefetch_row(const KvRows& kv, int64_t j, int64_t n) {
  if (j >= n || kv.d_stride != 1) return;
  const char* r = static_cast<const char*>(kv.row(j));
  for (int64_t o = 0; o < D * int64_t(sizeof(Elem<T>)); o += 64) _mm_prefetch(r + o, _MM_HINT_T0);
}
constexpr int64_t kPrefetchAhead = 24;  // keys

// ---- AVX-512: 16 lanes; acc tiles of 4 rows x 64 columns.
struct V512 {
  using F = __m512;
  using Mask = __mmask16;
  static constexpr int W = 16, kAccRows = 4;
  MTP_TARGET_AVX512 static F zero() { return _mm512_setzero_ps(); }
  MTP_TARGET_AVX512 static F set1(float x) { return _mm512_set1_ps(x); }
  MTP_TARGET_AVX512 static F loadu(const float* p) { return _mm512_loadu_ps(p); }
  template <DType T>
  MTP_TARGET_AVX512 static F load(const void* p, int64_t i) { return load16<T>(p, i); }
  MTP_TARGET_AVX512 static void storeu(float* p, F v) { _mm512_storeu_ps(p, v); }
  MTP_TARGET_AVX512 static F add(F a, F b) { return _mm512_add_ps(a, b); }
  MTP_TARGET_AVX512 static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  MTP_TARGET_AVX512 static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  MTP_TARGET_AVX512 static F max(F a, F b) { return _mm512_max_ps(a, b); }
  MTP_TARGET_AVX512 static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  MTP_TARGET_AVX512 static F fnmadd(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
  MTP_TARGET_AVX512 static F round(F x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  MTP_TARGET_AVX512 static F pow2i(F n) {  // 2^n for integral n in [-126, 127]
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  MTP_TARGET_AVX512 static F where_ge(F x, F lo, F v) { return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ), v); }
  MTP_TARGET_AVX512 static Mask tail(int64_t left) { return left >= 16 ? Mask(0xffff) : Mask((1u << left) - 1); }
  MTP_TARGET_AVX512 static F load_tail(const float* p, Mask m, F fill) { return _mm512_mask_loadu_ps(fill, m, p); }
  MTP_TARGET_AVX512 static void store_tail(float* p, Mask m, F v) { _mm512_mask_storeu_ps(p, m, v); }
  MTP_TARGET_AVX512 static float hsum(F v) { return _mm512_reduce_add_ps(v); }
  MTP_TARGET_AVX512 static float hmax(F v) { return _mm512_reduce_max_ps(v); }
  // Lane i = the sum of a[i]'s 16 lanes by the tree (l, l+8), (l, l+4), (l, l+2), (l, l+1):
  // the same for every i, whatever the other vectors hold.
  MTP_TARGET_AVX512 static F sum_each(const F* a) {
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
};

// ---- AVX2 + FMA + F16C: 8 lanes; acc tiles of 2 rows x 32 columns (16 registers).
struct V256 {
  using F = __m256;
  using Mask = __m256i;
  static constexpr int W = 8, kAccRows = 2;
  MTP_TARGET_AVX2 static F zero() { return _mm256_setzero_ps(); }
  MTP_TARGET_AVX2 static F set1(float x) { return _mm256_set1_ps(x); }
  MTP_TARGET_AVX2 static F loadu(const float* p) { return _mm256_loadu_ps(p); }
  template <DType T>
  MTP_TARGET_AVX2 static F load(const void* p, int64_t i) { return load8<T>(p, i); }
  MTP_TARGET_AVX2 static void storeu(float* p, F v) { _mm256_storeu_ps(p, v); }
  MTP_TARGET_AVX2 static F add(F a, F b) { return _mm256_add_ps(a, b); }
  MTP_TARGET_AVX2 static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  MTP_TARGET_AVX2 static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  MTP_TARGET_AVX2 static F max(F a, F b) { return _mm256_max_ps(a, b); }
  MTP_TARGET_AVX2 static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  MTP_TARGET_AVX2 static F fnmadd(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  MTP_TARGET_AVX2 static F round(F x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  MTP_TARGET_AVX2 static F pow2i(F n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  MTP_TARGET_AVX2 static F where_ge(F x, F lo, F v) { return _mm256_and_ps(_mm256_cmp_ps(x, lo, _CMP_GE_OQ), v); }
  MTP_TARGET_AVX2 static Mask tail(int64_t left) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(std::min<int64_t>(left, 8))), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  MTP_TARGET_AVX2 static F load_tail(const float* p, Mask m, F fill) {
    return _mm256_blendv_ps(fill, _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
  }
  MTP_TARGET_AVX2 static void store_tail(float* p, Mask m, F v) { _mm256_maskstore_ps(p, m, v); }
  MTP_TARGET_AVX2 static float hsum(F v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
  }
  MTP_TARGET_AVX2 static float hmax(F v) { return hmax8(v); }
  // Lane i = the sum of a[i]'s 8 lanes by the tree (l, l+4), (l, l+2), (l, l+1).
  MTP_TARGET_AVX2 static F sum_each(const F* a) {
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
};

// The kernels, once, over V. Only ever inlined into the flatten wrappers below.
template <class V, DType T, int D>
struct VecAttention {
  using F = typename V::F;
  static constexpr int W = V::W, NV = D / W;

  static F exp(F x) {  // x <= 0; ~1 ulp; below -87.3 (and -inf): 0
    const F lo = V::set1(-87.3f), x0 = x;
    x = V::max(x, lo);
    const F n = V::round(V::mul(x, V::set1(1.44269504088896341f)));
    F r = V::fnmadd(n, V::set1(0.693359375f), x);
    r = V::fnmadd(n, V::set1(-2.12194440e-4f), r);
    F p = V::set1(1.f / 720);
    for (float c : {1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f}) p = V::fmadd(p, r, V::set1(c));
    return V::where_ge(x0, lo, V::mul(p, V::pow2i(n)));
  }

  // Scores of W consecutive keys per row at once: one accumulator per key, then sum_each.
  static void scores(const float* q, int64_t r0, int64_t R, const int64_t* n, const KvRows& k, float scale, float* s) {
    alignas(64) float kbuf[W][D];  // the group widened to fp32 (or packed) when not usable in place
    alignas(64) Elem<T> tmp[D];
    const float* kp[W];
    const F vscale = V::set1(scale);
    for (int64_t j0 = 0; j0 < n[R - 1]; j0 += W) {
      while (n[r0] <= j0) ++r0;  // rows that see key j0: a suffix (n is non-decreasing)
      const int64_t cnt = std::min<int64_t>(W, n[R - 1] - j0);
      for (int64_t i = 0; i < cnt; ++i) {
        prefetch_row<D, T>(k, j0 + i + 2 * kPrefetchAhead, n[R - 1]);
        if (T == DType::F32 && k.d_stride == 1) {
          kp[i] = static_cast<const float*>(k.row(j0 + i));
        } else {
          const void* kj = kv_row_unit(k, j0 + i, D, tmp);
          for (int v = 0; v < NV; ++v) V::storeu(kbuf[i] + W * v, V::template load<T>(kj, W * v));
          kp[i] = kbuf[i];
        }
      }
      for (int64_t r = r0; r < R; ++r) {
        const int64_t c = std::min<int64_t>(W, n[r] - j0);
        const float* qr = q + r * D;
        F acc[W];
        for (int i = 0; i < W; ++i) {
          if (i < c) {
            acc[i] = V::mul(V::loadu(qr), V::loadu(kp[i]));
            for (int v = 1; v < NV; ++v) acc[i] = V::fmadd(V::loadu(qr + W * v), V::loadu(kp[i] + W * v), acc[i]);
          } else {
            acc[i] = V::zero();
          }
        }
        V::store_tail(s + r * kAttnChunk + j0, V::tail(c), V::mul(V::sum_each(acc), vscale));
      }
    }
  }

  static void softmax(float* s, int64_t n, float* m_out, float* l_out) {
    const F ninf = V::set1(-std::numeric_limits<float>::infinity());
    F vm = ninf;
    for (int64_t i = 0; i < n; i += W) vm = V::max(vm, V::load_tail(s + i, V::tail(n - i), ninf));
    const float m = V::hmax(vm);
    const F mm = V::set1(m);
    F vl = V::zero();
    for (int64_t i = 0; i < n; i += W) {
      const auto t = V::tail(n - i);
      const F p = exp(V::sub(V::load_tail(s + i, t, ninf), mm));  // masked lanes: exp(-inf) = 0
      V::store_tail(s + i, t, p);
      vl = V::add(vl, p);
    }
    *m_out = m;
    *l_out = V::hsum(vl);
  }

  // RB rows x 4W columns of acc in registers; each value row is loaded once per tile.
  template <int RB>
  static void acc_tile(const float* p, int64_t n, const KvRows& v, int col, float* acc, int64_t ld, Elem<T>* tmp) {
    F a[RB][4];
    for (int r = 0; r < RB; ++r)
      for (int i = 0; i < 4; ++i) a[r][i] = V::zero();
    for (int64_t j = 0; j < n; ++j) {
      prefetch_row<D, T>(v, j + kPrefetchAhead, n);
      const void* vj = kv_row_unit(v, j, D, tmp);
      F vv[4];
      for (int i = 0; i < 4; ++i) vv[i] = V::template load<T>(vj, col + W * i);
      for (int r = 0; r < RB; ++r) {
        const F pr = V::set1(p[r * kAttnChunk + j]);
        for (int i = 0; i < 4; ++i) a[r][i] = V::fmadd(pr, vv[i], a[r][i]);
      }
    }
    for (int r = 0; r < RB; ++r)
      for (int i = 0; i < 4; ++i) V::storeu(acc + r * ld + col + W * i, a[r][i]);
  }

  template <int RB>
  static void acc_rows(const float* p, int64_t rows, int64_t n, const KvRows& v, float* acc, int64_t ld, Elem<T>* tmp) {
    if constexpr (RB > 1) {
      if (rows < RB) return acc_rows<RB - 1>(p, rows, n, v, acc, ld, tmp);
    }
    for (int col = 0; col < D; col += 4 * W) acc_tile<RB>(p, n, v, col, acc, ld, tmp);
  }

  static void accumulate(const float* p, int64_t rows, int64_t n, const KvRows& v, float* acc, int64_t ld) {
    alignas(64) Elem<T> tmp[D];
    for (int64_t r = 0; r < rows; r += V::kAccRows)
      acc_rows<V::kAccRows>(p + r * kAttnChunk, rows - r, n, v, acc + r * ld, ld, tmp);
  }
};

// Entry points (the K of attend_chunk): whole kernels inlined into functions of one target.
#define MTP_ATTENTION_ENTRY_POINTS(TARGET, V)                                                                  \
  using Impl = VecAttention<V, T, D>;                                                                          \
  TARGET __attribute__((flatten)) static void scores(const float* q, int64_t r0, int64_t R, const int64_t* n,   \
                                                     const KvRows& k, int64_t, float scale, float* s) {         \
    Impl::scores(q, r0, R, n, k, scale, s);                                                                    \
  }                                                                                                            \
  TARGET __attribute__((flatten)) static void softmax(float* s, int64_t n, float* m, float* l) {               \
    Impl::softmax(s, n, m, l);                                                                                 \
  }                                                                                                            \
  TARGET __attribute__((flatten)) static void accumulate(const float* p, int64_t rows, int64_t n,               \
                                                         const KvRows& v, int64_t, float* acc, int64_t ld) {    \
    Impl::accumulate(p, rows, n, v, acc, ld);                                                                  \
  }

template <DType T, int D>
struct Avx512Attention {
  MTP_ATTENTION_ENTRY_POINTS(MTP_TARGET_AVX512, V512)
};

template <DType T, int D>
struct Avx2Attention {
  MTP_ATTENTION_ENTRY_POINTS(MTP_TARGET_AVX2, V256)
};

#undef MTP_ATTENTION_ENTRY_POINTS

}  // namespace mtp::x86
