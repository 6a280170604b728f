// Vector attention chunk kernels for head dims 64, 128 and 256, written once over a
// vector-traits class V (x86: V512 / V256 in x86/vec.h; aarch64: V128 in neon/vec.h) and
// compiled per instruction set: each entry point is a `flatten` wrapper (target-attributed
// where the set is not the build's baseline) that inlines the whole kernel, so the traits'
// intrinsics land in a function of the right target.
// Sharing without changing any row's bits: each key (value) row is loaded once and used by
// every row that sees it; a row's own operation sequence is fixed (scores: lane-wise fma
// over D per key, then a transposing reduction with a fixed tree per key; softmax: lane
// j % W of chunk-aligned vectors; acc: one fma per key in key order), whatever rows come.
// Different traits (lane counts, reduction trees) give different bits: within one
// instruction set the result is shape-invariant, across sets it agrees to rounding.
#pragma once
#include <cstdint>
#include <type_traits>

#include "mtp/common.h"
#include "mtp/attention_args.h"
#include "mtp/kv_rows.h"

namespace mtp::simd {

template <DType T>
using Elem = std::conditional_t<T == DType::F32, float, uint16_t>;

// Software prefetch of row j of kv (when it exists): the hardware prefetchers stop at 4 KiB
// pages, a handful of keys each, and strided (permuted) caches defeat them more.
template <class V, int D, DType T>
inline void prefetch_row(const KvRows& kv, int64_t j, int64_t n) {
  if (j >= n || kv.d_stride != 1) return;
  const char* r = static_cast<const char*>(kv.row(j));
  for (int64_t o = 0; o < D * int64_t(sizeof(Elem<T>)); o += 64) V::prefetch(r + o);
}
constexpr int64_t kPrefetchAhead = 24;  // keys

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
        prefetch_row<V, D, T>(k, j0 + i + 2 * kPrefetchAhead, n[R - 1]);
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

  // l is NaN when a score is not finite (-inf included; the row's output is NaN, see
  // write_row): vz sums s * 0, which is 0 for a finite s and NaN for inf or NaN. Padding lanes
  // hold -FLT_MAX (finite, below any real maximum but -inf, which makes the row NaN anyway).
  static void softmax(float* s, int64_t n, float* m_out, float* l_out) {
    const F ninf = V::set1(-std::numeric_limits<float>::infinity()), zero = V::zero();
    const F lowest = V::set1(std::numeric_limits<float>::lowest());
    F vm = ninf, vz = zero;
    for (int64_t i = 0; i < n; i += W) {
      const F x = V::load_tail(s + i, V::tail(n - i), lowest);
      vm = V::max(vm, x);
      vz = V::fmadd(x, zero, vz);
    }
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
    *l_out = V::hsum(vz) == 0.f ? V::hsum(vl) : std::numeric_limits<float>::quiet_NaN();
  }

  // RB rows x 4W columns of acc in registers; each value row is loaded once per tile.
  template <int RB>
  static void acc_tile(const float* p, int64_t n, const KvRows& v, int col, float* acc, int64_t ld, Elem<T>* tmp) {
    F a[RB][4];
    for (int r = 0; r < RB; ++r)
      for (int i = 0; i < 4; ++i) a[r][i] = V::zero();
    for (int64_t j = 0; j < n; ++j) {
      prefetch_row<V, D, T>(v, j + kPrefetchAhead, n);
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

}  // namespace mtp::simd

// Entry points (the K of attend_chunk), for a struct template <DType T, int D>: whole kernels
// inlined into functions of one target (TARGET may be empty: the baseline set).
#define MTP_ATTENTION_ENTRY_POINTS(TARGET, V)                                                                      \
  using Impl = simd::VecAttention<V, T, D>;                                                                        \
  TARGET __attribute__((flatten)) static void scores(const float* q, int64_t r0, int64_t R, const int64_t* n,      \
                                                     const KvRows& k, int64_t, float scale, float* s) {            \
    Impl::scores(q, r0, R, n, k, scale, s);                                                                        \
  }                                                                                                                \
  TARGET __attribute__((flatten)) static void softmax(float* s, int64_t n, float* m, float* l) {                   \
    Impl::softmax(s, n, m, l);                                                                                     \
  }                                                                                                                \
  TARGET __attribute__((flatten)) static void accumulate(const float* p, int64_t rows, int64_t n, const KvRows& v, \
                                                         int64_t, float* acc, int64_t ld) {                        \
    Impl::accumulate(p, rows, n, v, acc, ld);                                                                      \
  }
