// Vector attention chunk kernels (AVX-512, AVX2+FMA+F16C) for head dims 64 and 128.
// Sharing without changing any row's bits: each key (value) row is loaded into registers
// once and used by every row that sees it; a row's own operation sequence is fixed
// (dot: lane-wise fma over D, then one fixed horizontal sum; softmax: lane j % W of a
// chunk-aligned vector; acc: one fma per key in key order), whatever rows come along.
#pragma once
#include <immintrin.h>

#include <type_traits>

#include "mtp/x86/vec.h"  // load16 / load8 (widening loads of fp32/bf16/fp16), hsum8

namespace mtp::x86 {

template <DType T>
using Elem = std::conditional_t<T == DType::F32, float, uint16_t>;

// Software prefetch of row j of kv (when it exists): the hardware prefetchers stop at 4 KiB
// pages, a handful of keys each, and strided (permuted) caches defeat them more.
template <int D, DType T>
inline void prefetch_row(const KvRows& kv, int64_t j, int64_t n) {
  if (j >= n) return;
  const char* r = static_cast<const char*>(kv.row(j));
  constexpr int64_t bytes = D * int64_t(sizeof(Elem<T>));
  if (kv.d_stride != 1) return;
  for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(r + o, _MM_HINT_T0);
}
constexpr int64_t kPrefetchAhead = 24;  // keys

// ---- AVX-512: 16 lanes.
MTP_TARGET_AVX512 inline __m512 exp_avx512(__m512 x) {  // x <= 0; ~1 ulp; exp(-inf) = 0
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);  // p * 2^n, underflowing to 0
}

MTP_TARGET_AVX512 inline __mmask16 tail_mask16(int64_t left) {
  return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
}

// Lane i of the result = the sum of a[i]'s 16 lanes by the tree (l, l+8), (l, l+4),
// (l, l+2), (l, l+1): the same for every i, whatever the other vectors hold.
MTP_TARGET_AVX512 inline __m512 sum16(const __m512* a) {
  __m512 s[8], u[4], x[2];
  for (int i = 0; i < 8; ++i)  // 128-bit blocks 0,1 of a[2i] + blocks 2,3; likewise a[2i+1]
    s[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xee));
  for (int i = 0; i < 4; ++i)  // block b of u[i] holds vector 4i + b
    u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(s[2 * i], s[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(s[2 * i], s[2 * i + 1], 0xdd));
  for (int i = 0; i < 2; ++i)  // block b: lanes 0,1 vector 8i + b; lanes 2,3 vector 8i + 4 + b
    x[i] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * i], u[2 * i + 1], 0x44), _mm512_shuffle_ps(u[2 * i], u[2 * i + 1], 0xee));
  const __m512 z = _mm512_add_ps(_mm512_shuffle_ps(x[0], x[1], 0x88), _mm512_shuffle_ps(x[0], x[1], 0xdd));
  // z[4b + l] = vector 4l + b
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), z);
}

template <DType T, int D>
struct Avx512Attention {
  static constexpr int NV = D / 16;

  // Scores of 16 consecutive keys per row at once: one accumulator per key (lane-wise fma
  // over D), then a transposing reduction (sum16) whose tree per key is fixed, so a key's
  // score does not depend on the other keys of its group (missing keys are zero vectors).
  MTP_TARGET_AVX512 static void scores(const float* q, int64_t r0, int64_t R, const int64_t* n, const KvRows& k,
                                       int64_t, float scale, float* s) {
    alignas(64) float kbuf[16][D];  // the group widened to fp32 (or packed) when it is not usable in place
    alignas(64) Elem<T> tmp[D];
    const float* kp[16];
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int64_t j0 = 0; j0 < n[R - 1]; j0 += 16) {
      while (n[r0] <= j0) ++r0;  // rows that see key j0: a suffix (n is non-decreasing)
      const int64_t cnt = std::min<int64_t>(16, n[R - 1] - j0);
      for (int64_t i = 0; i < cnt; ++i) {
        prefetch_row<D, T>(k, j0 + i + 2 * kPrefetchAhead, n[R - 1]);
        if (T == DType::F32 && k.d_stride == 1) {
          kp[i] = static_cast<const float*>(k.row(j0 + i));
        } else {
          const void* kj = kv_row_unit(k, j0 + i, D, tmp);
          for (int v = 0; v < NV; ++v) _mm512_store_ps(kbuf[i] + 16 * v, load16<T>(kj, 16 * v));
          kp[i] = kbuf[i];
        }
      }
      for (int64_t r = r0; r < R; ++r) {
        const int64_t c = std::min<int64_t>(16, n[r] - j0);
        __m512 qv[NV];
        for (int v = 0; v < NV; ++v) qv[v] = _mm512_loadu_ps(q + r * D + 16 * v);
        __m512 acc[16];
        for (int i = 0; i < 16; ++i) {
          if (i < c) {
            acc[i] = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kp[i]));
            for (int v = 1; v < NV; ++v) acc[i] = _mm512_fmadd_ps(qv[v], _mm512_loadu_ps(kp[i] + 16 * v), acc[i]);
          } else {
            acc[i] = _mm512_setzero_ps();
          }
        }
        _mm512_mask_storeu_ps(s + r * kAttnChunk + j0, tail_mask16(c), _mm512_mul_ps(sum16(acc), vscale));
      }
    }
  }

  MTP_TARGET_AVX512 static void softmax(float* s, int64_t n, float* m_out, float* l_out) {
    const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    __m512 vm = ninf;
    for (int64_t i = 0; i < n; i += 16) vm = _mm512_max_ps(vm, _mm512_mask_loadu_ps(ninf, tail_mask16(n - i), s + i));
    const float m = _mm512_reduce_max_ps(vm);
    const __m512 mm = _mm512_set1_ps(m);
    __m512 vl = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 t = tail_mask16(n - i);
      const __m512 p = _mm512_maskz_mov_ps(t, exp_avx512(_mm512_sub_ps(_mm512_mask_loadu_ps(ninf, t, s + i), mm)));
      _mm512_mask_storeu_ps(s + i, t, p);
      vl = _mm512_add_ps(vl, p);
    }
    *m_out = m;
    *l_out = _mm512_reduce_add_ps(vl);
  }

  // RB rows x 64 columns of acc in registers; each value row is loaded once per tile.
  template <int RB>
  MTP_TARGET_AVX512 static void acc_tile(const float* p, int64_t n, const KvRows& v, int col, float* acc, int64_t ld,
                                         Elem<T>* tmp) {
    __m512 a[RB][4];
    for (int r = 0; r < RB; ++r)
      for (int i = 0; i < 4; ++i) a[r][i] = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; ++j) {
      prefetch_row<D, T>(v, j + kPrefetchAhead, n);
      const void* vj = kv_row_unit(v, j, D, tmp);
      __m512 vv[4];
      for (int i = 0; i < 4; ++i) vv[i] = load16<T>(vj, col + 16 * i);
      for (int r = 0; r < RB; ++r) {
        const __m512 pr = _mm512_set1_ps(p[r * kAttnChunk + j]);
        for (int i = 0; i < 4; ++i) a[r][i] = _mm512_fmadd_ps(pr, vv[i], a[r][i]);
      }
    }
    for (int r = 0; r < RB; ++r)
      for (int i = 0; i < 4; ++i) _mm512_storeu_ps(acc + r * ld + col + 16 * i, a[r][i]);
  }

  MTP_TARGET_AVX512 static void accumulate(const float* p, int64_t rows, int64_t n, const KvRows& v, int64_t,
                                           float* acc, int64_t ld) {
    alignas(64) Elem<T> tmp[D];
    for (int64_t r = 0; r < rows; r += 4)
      for (int col = 0; col < D; col += 64) {
        const float* pr = p + r * kAttnChunk;
        float* ar = acc + r * ld;
        switch (std::min<int64_t>(4, rows - r)) {
          case 4: acc_tile<4>(pr, n, v, col, ar, ld, tmp); break;
          case 3: acc_tile<3>(pr, n, v, col, ar, ld, tmp); break;
          case 2: acc_tile<2>(pr, n, v, col, ar, ld, tmp); break;
          default: acc_tile<1>(pr, n, v, col, ar, ld, tmp);
        }
      }
  }
};

// ---- AVX2 + FMA + F16C: 8 lanes.
MTP_TARGET_AVX2 inline __m256 exp_avx2(__m256 x) {  // x <= 0; ~1 ulp; below -87.3 (and -inf): 0
  const __m256 lo = _mm256_set1_ps(-87.3f);
  const __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
  x = _mm256_max_ps(x, lo);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep);
}

MTP_TARGET_AVX2 inline __m256i tail_mask8(int64_t left) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(std::min<int64_t>(left, 8))), idx);
}

template <DType T, int D>
struct Avx2Attention {
  static constexpr int NV = D / 8;

  MTP_TARGET_AVX2 static void scores(const float* q, int64_t r0, int64_t R, const int64_t* n, const KvRows& k,
                                     int64_t, float scale, float* s) {
    alignas(32) Elem<T> tmp[D];
    for (int64_t j = 0; j < n[R - 1]; ++j) {
      while (n[r0] <= j) ++r0;
      const void* kj = kv_row_unit(k, j, D, tmp);
      __m256 kv[NV];
      for (int i = 0; i < NV; ++i) kv[i] = load8<T>(kj, 8 * i);
      for (int64_t r = r0; r < R; ++r) {
        const float* qr = q + r * D;
        __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(qr), kv[0]);
        for (int i = 1; i < NV; ++i) acc = _mm256_fmadd_ps(_mm256_loadu_ps(qr + 8 * i), kv[i], acc);
        s[r * kAttnChunk + j] = hsum8(acc) * scale;
      }
    }
  }

  MTP_TARGET_AVX2 static void softmax(float* s, int64_t n, float* m_out, float* l_out) {
    const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    __m256 vm = ninf;
    for (int64_t i = 0; i < n; i += 8)
      vm = _mm256_max_ps(vm, _mm256_blendv_ps(ninf, _mm256_maskload_ps(s + i, tail_mask8(n - i)),
                                              _mm256_castsi256_ps(tail_mask8(n - i))));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float m = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    const __m256 mm = _mm256_set1_ps(m);
    __m256 vl = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) {
      const __m256i t = tail_mask8(n - i);
      const __m256 x = _mm256_blendv_ps(ninf, _mm256_maskload_ps(s + i, t), _mm256_castsi256_ps(t));
      const __m256 p = exp_avx2(_mm256_sub_ps(x, mm));  // masked lanes: exp(-inf) = 0
      _mm256_maskstore_ps(s + i, t, p);
      vl = _mm256_add_ps(vl, p);
    }
    *m_out = m;
    *l_out = hsum8(vl);
  }

  // RB rows x 32 columns of acc in registers.
  template <int RB>
  MTP_TARGET_AVX2 static void acc_tile(const float* p, int64_t n, const KvRows& v, int col, float* acc, int64_t ld,
                                       Elem<T>* tmp) {
    __m256 a[RB][4];
    for (int r = 0; r < RB; ++r)
      for (int i = 0; i < 4; ++i) a[r][i] = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; ++j) {
      const void* vj = kv_row_unit(v, j, D, tmp);
      __m256 vv[4];
      for (int i = 0; i < 4; ++i) vv[i] = load8<T>(vj, col + 8 * i);
      for (int r = 0; r < RB; ++r) {
        const __m256 pr = _mm256_set1_ps(p[r * kAttnChunk + j]);
        for (int i = 0; i < 4; ++i) a[r][i] = _mm256_fmadd_ps(pr, vv[i], a[r][i]);
      }
    }
    for (int r = 0; r < RB; ++r)
      for (int i = 0; i < 4; ++i) _mm256_storeu_ps(acc + r * ld + col + 8 * i, a[r][i]);
  }

  MTP_TARGET_AVX2 static void accumulate(const float* p, int64_t rows, int64_t n, const KvRows& v, int64_t,
                                         float* acc, int64_t ld) {
    alignas(32) Elem<T> tmp[D];
    for (int64_t r = 0; r < rows; r += 2)
      for (int col = 0; col < D; col += 32) {
        if (rows - r >= 2) acc_tile<2>(p + r * kAttnChunk, n, v, col, acc + r * ld, ld, tmp);
        else acc_tile<1>(p + r * kAttnChunk, n, v, col, acc + r * ld, ld, tmp);
      }
  }
};

}  // namespace mtp::x86
