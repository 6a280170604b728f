// Vector linear, written once over a vector-traits class V (x86: V512 / V256; aarch64: V128).
// For one weight row and up to R = 4 activation rows at once (the weight chunk is loaded once
// for all of them), each output element keeps four accumulators of W lanes, fed chunk c of
// the reduction into accumulator c % 4, reduced as ((a0 + a1) + (a2 + a3)) then across lanes
// (V::hsum), then a scalar tail: the same sequence whatever R, M or the thread split is.
// The lane count W and V::hsum's tree differ between traits: each instruction set is
// shape-invariant on its own and agrees with the others to rounding.
#pragma once

namespace mtp::simd {

// Scalar tail of one output element, then the bias.
template <DType XT, DType WT>
inline float finish_dot(float acc, const void* xm, const void* wn, int64_t k0, int64_t K, const float* bias, int64_t n) {
  for (int64_t k = k0; k < K; ++k) acc += load_f32(xm, XT, k) * load_f32(wn, WT, k);
  return bias ? acc + bias[n] : acc;
}

template <class V, DType XT, DType WT>
struct VecLinear {
  using F = typename V::F;
  static constexpr int W = V::W;

  template <int R>
  static void dot_rows(const LinearArgs& a, int64_t m0, int64_t n) {
    const void* wn = static_cast<const char*>(a.w) + n * a.w_stride * dtype_size(WT);
    const void* xr[R];
    for (int r = 0; r < R; ++r) xr[r] = static_cast<const char*>(a.x) + (m0 + r) * a.x_stride * dtype_size(XT);
    F acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < 4; ++j) acc[r][j] = V::zero();
    const int64_t kv = a.K / W * W;
    int64_t k = 0;
    for (; k + 4 * W <= kv; k += 4 * W)
      for (int j = 0; j < 4; ++j) {
        const F w = V::template load<WT>(wn, k + W * j);
        for (int r = 0; r < R; ++r) acc[r][j] = V::fmadd(V::template load<XT>(xr[r], k + W * j), w, acc[r][j]);
      }
    for (int j = 0; k < kv; k += W, ++j) {
      const F w = V::template load<WT>(wn, k);
      for (int r = 0; r < R; ++r) acc[r][j] = V::fmadd(V::template load<XT>(xr[r], k), w, acc[r][j]);
    }
    for (int r = 0; r < R; ++r) {
      const F s = V::add(V::add(acc[r][0], acc[r][1]), V::add(acc[r][2], acc[r][3]));
      a.y[(m0 + r) * a.y_stride + n] = finish_dot<XT, WT>(V::hsum(s), xr[r], wn, kv, a.K, a.bias, n);
    }
  }

  // Rows in groups of 4 (then 2, then 1) for every output column of [n0, n1).
  static void run(const LinearArgs& a, int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      int64_t m = 0;
      for (; m + 4 <= a.M; m += 4) dot_rows<4>(a, m, n);
      for (; m + 2 <= a.M; m += 2) dot_rows<2>(a, m, n);
      for (; m < a.M; ++m) dot_rows<1>(a, m, n);
    }
  }
};

}  // namespace mtp::simd

// Defines NAME(args, n0, n1): activations and weights fp32, bf16 or fp16 each, every
// combination one flatten function of the target (TARGET may be empty: the baseline set).
#define MTP_LINEAR_ENTRY_POINT(TARGET, V, NAME)                                                           \
  template <DType XT, DType WT>                                                                           \
  TARGET __attribute__((flatten)) inline void NAME##_typed(const LinearArgs& a, int64_t n0, int64_t n1) { \
    simd::VecLinear<V, XT, WT>::run(a, n0, n1);                                                           \
  }                                                                                                       \
  inline void NAME(const LinearArgs& a, int64_t n0, int64_t n1) {                                         \
    with_dtype(a.x_dtype, [&](auto xt) {                                                                  \
      with_dtype(a.w_dtype, [&](auto wt) { NAME##_typed<decltype(xt)::value, decltype(wt)::value>(a, n0, n1); }); \
    });                                                                                                   \
  }
