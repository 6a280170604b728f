// Vector argmax for contiguous rows on generic::argmax_blocks, written once over the
// vector traits V (vec.h): each block is reduced to its maximum with plain vector max (one
// op per vector, four accumulators) while a NaN check rides along for free: fma(v, 0, z)
// turns NaN (and +-inf) lanes into a sticky NaN in z; a block that sets it is rescanned
// exactly (a false alarm from an infinity only costs time).
#pragma once
#include "mtp/generic/argmax.h"
#include "mtp/x86/vec.h"

namespace mtp::x86 {

// Software prefetch this far ahead: the hardware prefetchers stop at 4 KiB page edges.
constexpr int64_t kArgmaxPrefetchBytes = 4096;

template <class V, DType T>
inline float block_max(const void* x, int64_t i, bool* has_nan) {
  using F = typename V::F;
  constexpr int W = V::W;
  constexpr int64_t esize = T == DType::F32 ? 4 : 2;
  const char* ahead = static_cast<const char*>(x) + i * esize + kArgmaxPrefetchBytes;
  for (int64_t o = 0; o < generic::kArgmaxBlock * esize; o += 64) _mm_prefetch(ahead + o, _MM_HINT_T0);
  const F zero = V::zero();
  F m[4], z[4];
  for (int u = 0; u < 4; ++u) {
    m[u] = V::template load<T>(x, i + W * u);
    z[u] = V::mul(m[u], zero);
  }
  for (int64_t j = 4 * W; j < generic::kArgmaxBlock; j += 4 * W)
    for (int u = 0; u < 4; ++u) {
      const F v = V::template load<T>(x, i + j + W * u);
      m[u] = V::max(m[u], v);
      z[u] = V::fmadd(v, zero, z[u]);
    }
  *has_nan = V::any_nan(V::add(V::add(z[0], z[1]), V::add(z[2], z[3])));
  return V::hmax(V::max(V::max(m[0], m[1]), V::max(m[2], m[3])));
}

template <class V, DType T>
inline ArgmaxResult argmax_vec(const void* x, int64_t begin, int64_t end) {
  return generic::argmax_blocks<T>(x, begin, end, [x](int64_t i, bool* nan) { return block_max<V, T>(x, i, nan); });
}

template <DType T>
MTP_TARGET(Avx512) __attribute__((flatten)) inline ArgmaxResult argmax_avx512_typed(const void* x, int64_t begin,
                                                                                         int64_t end) {
  return argmax_vec<V512, T>(x, begin, end);
}

template <DType T>
MTP_TARGET(Avx2) __attribute__((flatten)) inline ArgmaxResult argmax_avx2_typed(const void* x, int64_t begin,
                                                                                     int64_t end) {
  return argmax_vec<V256, T>(x, begin, end);
}

inline ArgmaxResult argmax(Avx512, const void* x, DType dt, int64_t begin, int64_t end) {
  return with_dtype(dt, [&](auto t) { return argmax_avx512_typed<decltype(t)::value>(x, begin, end); });
}

inline ArgmaxResult argmax(Avx2, const void* x, DType dt, int64_t begin, int64_t end) {
  return with_dtype(dt, [&](auto t) { return argmax_avx2_typed<decltype(t)::value>(x, begin, end); });
}

}  // namespace mtp::x86
